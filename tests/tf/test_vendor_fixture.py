"""A folder written to the vendor zoo's TF contract (tests/fixtures/vendor_tf) runs unchanged.

Its model_fn builds a Keras CNN in the TF1 graph and trains with a TF1 optimizer's
``minimize(loss, global_step)``, reports accuracy through ``host_call``, its input_fn reads
the embedded digits, and its defaults come from ``set_defaults(params, mode=None)``. Each
test runs the folder's own run.py with flags only: train and evaluate on the CPU, validate,
compile, train on the emulator; a key of its YAML that no code reads is warned about.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from common.folder import load_run_module
from common.summaries import read_scalars
from common.tf.run import is_startup_noise

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR_TF = os.path.join(ROOT, "tests", "fixtures", "vendor_tf")
PARAMS = os.path.join(VENDOR_TF, "configs", "params.yaml")


@pytest.fixture(scope="module")
def vendor_tf():
    return load_run_module(VENDOR_TF)


@pytest.fixture(scope="module")
def trained(vendor_tf, tmp_path_factory):
    """The folder's config as it is: 100 steps, evaluated at the checkpoints of steps 50 and 100."""
    model_dir = tmp_path_factory.mktemp("vendor_tf") / "model"
    metrics = vendor_tf.main(["--mode", "train_and_eval", "--model_dir", str(model_dir)])
    return model_dir, metrics


def train_losses(model_dir):
    return [value for _, value in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def test_trains_on_the_cpu_and_evaluates_above_80_percent(trained):
    model_dir, metrics = trained
    # measured: accuracy 0.947 on the 360 test digits (loss 0.165) after 100 steps of batch 32
    assert metrics["global_step"] == 100
    assert metrics["accuracy"] >= 0.8
    losses = train_losses(model_dir)
    assert len(losses) == 10 and losses[-1] < 0.5 * losses[0]
    eval_scalars = read_scalars(os.path.join(model_dir, "eval"))
    assert [step for step, _ in eval_scalars["accuracy"]] == [50, 100]
    assert sorted(n for n in os.listdir(model_dir) if n.endswith(".index")) == ["model.ckpt-100.index",
                                                                              "model.ckpt-50.index"]


def test_set_defaults_filled_the_saved_params(trained):
    model_dir, _ = trained
    saved = yaml.safe_load(open(os.path.join(model_dir, "params_train_and_eval.yaml")))
    assert saved["model"] == {"filters": 8, "kernel_size": 3, "activation_fn": "relu", "image_size": 28,
                              "num_classes": 10, "pool_size": 2}
    assert saved["eval_input"]["shuffle"] is False
    # the TF spellings of the file, read as the zoo's keys
    assert (saved["runconfig"]["log_steps"], saved["runconfig"]["checkpoint_steps"], saved["runconfig"]["seed"]) \
        == (10, 50, 1)


def test_eval_mode_reads_the_latest_checkpoint(vendor_tf, trained):
    model_dir, metrics = trained
    again = vendor_tf.main(["--mode", "eval", "--model_dir", str(model_dir)])
    assert again["global_step"] == 100
    assert again["accuracy"] == pytest.approx(metrics["accuracy"])


def test_validates_and_compiles_for_the_device(vendor_tf, tmp_path):
    report = vendor_tf.main(["--validate_only", "--model_dir", str(tmp_path)])
    assert report.ok
    vendor_tf.main(["--compile_only", "--model_dir", str(tmp_path)])
    text = (tmp_path / "compile" / "report.txt").read_text()
    for kernel in ("conv", "pool", "dense", "softmax_loss"):
        assert f"{kernel}_0" in text


def test_trains_on_the_emulator_as_on_the_cpu(vendor_tf, trained, tmp_path):
    vendor_tf.main(["--mode", "train", "--device", "emulator", "--max_steps", "30", "--model_dir", str(tmp_path)])
    losses = train_losses(tmp_path)
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]
    # fp32 compute on both: the emulator's losses are the CPU run's first three
    np.testing.assert_allclose(losses, train_losses(trained[0])[:3], rtol=1e-4)


def test_a_key_no_code_reads_is_warned_with_its_line(vendor_tf, tmp_path, capsys):
    text = open(PARAMS).read().replace("  kernel_size: 3\n", "  kernel_size: 3\n  num_filter: 16\n")
    params = tmp_path / "params.yaml"
    params.write_text(text)
    lineno = text.splitlines().index("  num_filter: 16") + 1
    vendor_tf.main(["--mode", "train_and_eval", "--params", str(params), "--max_steps", "2",
                    "--model_dir", str(tmp_path / "model")])
    err = capsys.readouterr().err
    warnings = [logged.split(" WARNING ", 1)[1] for logged in err.splitlines() if "never read" in logged]
    # train_and_eval: the eval input's keys count as read before its first checkpoint is evaluated
    assert warnings == [f"{params}:{lineno}: 'model.num_filter' is never read by the model or data code "
                        f"(did you mean 'model.filters'?)"]


def test_run_from_a_shell_elsewhere_prints_no_cuda_lines(tmp_path):
    """As a user runs it, from another directory, with TF_CPP_MIN_LOG_LEVEL unset: TensorFlow's
    start-up lines about the CUDA it did not find stay out of stderr (--verbose keeps them)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = ROOT
    done = subprocess.run([sys.executable, os.path.join(VENDOR_TF, "run.py"), "--validate_only",
                           "--model_dir", str(tmp_path / "model")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "validation passed" in done.stderr
    assert [line for line in done.stderr.splitlines() if "cuda" in line.lower()] == []


def test_startup_noise_is_told_from_other_lines():
    # as TensorFlow 2.21 prints them on a machine without CUDA
    noise = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1796281616.812947   10829 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
        "GPU will not be used.",
        "E0000 00:00:1796281622.696706   10829 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
        "Failed call to cuInit: UNKNOWN ERROR (303)",
        "I0000 00:00:1796281616.886009   10829 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
        "available CPU instructions in performance-critical operations.",
        "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow with the "
        "appropriate compiler flags.",
    ]
    kept = [
        "E0000 00:00:1796281622.696706   10829 op_kernel.cc:1857] OP_REQUIRES failed at conv_ops.cc:41",
        "07:07:02 WARNING data: ./data/mnist holds no MNIST",
        "Traceback (most recent call last):",
    ]
    assert [is_startup_noise(line) for line in noise] == [True] * len(noise)
    assert [is_startup_noise(line) for line in kept] == [False] * len(kept)
