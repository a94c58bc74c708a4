"""A folder written to the vendor zoo's PyTorch contract (tests/fixtures/vendor_pytorch) runs unchanged.

Its model is a PyTorchBaseModel subclass built by ``MNISTModel(params, device)`` whose
``__call__`` returns the loss alone and reports accuracy through the vendor's
``AccuracyMetric`` when not training; its DataLoaders read torchvision's MNIST with per-image
transforms; its defaults come from ``set_defaults(params)``, which fills keys in place. Each
test runs the folder's own run.py with flags only: train and evaluate on the CPU, validate,
compile, train on the emulator; a key of its YAML that no code reads is warned about.
"""

import os
import shutil

import pytest
import yaml

from common.data import resolve_mnist
from common.folder import load_run_module
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENDOR_PT = os.path.join(ROOT, "tests", "fixtures", "vendor_pytorch")


@pytest.fixture(scope="module")
def vendor_pt():
    return load_run_module(VENDOR_PT)


@pytest.fixture(scope="module")
def digits():
    """The embedded digits' MNIST root (MNIST/raw), where the vendor's config names a data_dir."""
    root = resolve_mnist(os.path.join(ROOT, "no_mnist_here"), "auto").root
    return [f"train_input.data_dir={root}", f"eval_input.data_dir={root}"]


@pytest.fixture(scope="module")
def trained(vendor_pt, digits, tmp_path_factory):
    """The folder's config as it is: 60 steps of batch 32, then an eval of the 360 test digits."""
    model_dir = tmp_path_factory.mktemp("vendor_pt") / "model"
    vendor_pt.main(["--mode", "train", "--model_dir", str(model_dir), *digits])
    metrics = vendor_pt.main(["--mode", "eval", "--model_dir", str(model_dir), *digits])
    return model_dir, metrics


def test_trains_on_the_cpu_and_evaluates_above_80_percent(trained):
    model_dir, metrics = trained
    # measured: accuracy 0.839 on the 360 test digits (loss 0.669) after 60 steps of batch 32
    assert metrics["accuracy"] >= 0.8
    losses = [value for _, value in read_scalars(os.path.join(model_dir, "train"))["loss"]]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0]
    eval_scalars = read_scalars(os.path.join(model_dir, "eval"))
    assert eval_scalars["accuracy"] == [(60, pytest.approx(metrics["accuracy"]))]
    assert os.path.isfile(model_dir / "checkpoint_60.mdl")


def test_set_defaults_filled_the_saved_params(trained):
    model_dir, _ = trained
    saved = yaml.safe_load(open(model_dir / "params_train.yaml"))
    assert saved["model"] == {"conv_channels": 8, "dropout": 0.0, "num_classes": 10, "compute_eval_metrics": True}
    assert saved["train_input"]["drop_last_batch"] is True and saved["eval_input"]["num_workers"] == 0


def test_validates_compiles_and_trains_on_the_emulator(vendor_pt, digits, tmp_path):
    report = vendor_pt.main(["--validate_only", "--model_dir", str(tmp_path / "v"), *digits])
    assert report.ok
    vendor_pt.main(["--compile_only", "--model_dir", str(tmp_path / "c"), *digits])
    text = (tmp_path / "c" / "compile" / "report.txt").read_text()
    assert "conv" in text and "samples/s" in text
    same = ["runconfig.max_steps=20", "runconfig.log_steps=1", *digits]
    vendor_pt.main(["--mode", "train", "--device", "emulator", "--model_dir", str(tmp_path / "e"), *same])
    vendor_pt.main(["--mode", "train", "--model_dir", str(tmp_path / "cpu"), *same])
    emulator = [value for _, value in read_scalars(str(tmp_path / "e" / "train"))["loss"]]
    cpu = [value for _, value in read_scalars(str(tmp_path / "cpu" / "train"))["loss"]]
    assert len(emulator) == 20 and emulator[-1] < 0.9 * emulator[0]
    # the emulator computes the framework's numbers: fp32, same weights, same batches
    assert emulator[:5] == pytest.approx(cpu[:5], rel=1e-4)
    metrics = vendor_pt.main(["--mode", "eval", "--device", "emulator", "--model_dir", str(tmp_path / "e"),
                              "runconfig.eval_steps=2", *digits])
    assert 0.0 <= metrics["accuracy"] <= 1.0 and "accuracy" in read_scalars(str(tmp_path / "e" / "eval"))


def test_a_key_no_code_reads_is_warned_with_its_line(vendor_pt, digits, tmp_path, capsys):
    text = open(os.path.join(VENDOR_PT, "configs", "params.yaml")).read()
    text = text.replace("  conv_channels: 8\n", "  conv_channels: 8\n  conv_chanels: 16\n")
    params = tmp_path / "params.yaml"
    params.write_text(text)
    line = text.splitlines().index("  conv_chanels: 16") + 1
    vendor_pt.main(["--mode", "train", "--params", str(params), "--model_dir", str(tmp_path / "md"),
                    "runconfig.max_steps=1", *digits])
    warnings = [logged.split(" WARNING ", 1)[1] for logged in capsys.readouterr().err.splitlines()
                if "never read" in logged]
    # the model reads its keys through params["model"].copy(), as the vendor's models do
    assert warnings == [f"{params}:{line}: 'model.conv_chanels' is never read by the model or data code "
                        f"(did you mean 'model.conv_channels'?)"]


def test_an_eval_warns_of_a_key_no_code_reads_as_well(vendor_pt, digits, trained, tmp_path, capsys):
    """run.py reports the unread keys once the mode is done: an eval, which has no first training step."""
    model_dir = tmp_path / "model"
    shutil.copytree(trained[0], model_dir)
    text = open(os.path.join(VENDOR_PT, "configs", "params.yaml")).read()
    params = tmp_path / "params.yaml"
    params.write_text(text.replace("  conv_channels: 8\n", "  conv_channels: 8\n  conv_chanels: 16\n"))
    line = params.read_text().splitlines().index("  conv_chanels: 16") + 1
    capsys.readouterr()
    vendor_pt.main(["--mode", "eval", "--params", str(params), "--model_dir", str(model_dir),
                    "runconfig.eval_steps=1", *digits])
    warnings = [logged.split(" WARNING ", 1)[1] for logged in capsys.readouterr().err.splitlines()
                if "never read" in logged]
    assert warnings == [f"{params}:{line}: 'model.conv_chanels' is never read by the model or data code "
                        f"(did you mean 'model.conv_channels'?)"]
