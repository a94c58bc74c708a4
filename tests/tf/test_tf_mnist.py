"""tf/mnist end to end on generated data: every mode, resume, checkpoints, tfds, torch-free."""

import os
import subprocess
import sys

import numpy as np
import pytest
import yaml

from common.data.mnist import MNIST_FILES, read_idx
from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TF_MNIST = os.path.join(ROOT, "tf", "mnist")
TINY = os.path.join(TF_MNIST, "configs", "params_tiny.yaml")


def _losses(model_dir):
    return [value for _, value in read_scalars(os.path.join(model_dir, "train"))["loss"]]


def test_train_writes_checkpoints_params_and_summaries(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args("--mode", "train"))
    model_dir = tmp_path / "model"
    names = sorted(os.listdir(model_dir))
    assert "model.ckpt-4.index" in names and "model.ckpt-2.index" in names
    assert "params_train.yaml" in names
    params = yaml.safe_load((model_dir / "params_train.yaml").read_text())
    assert params["model"]["hidden_sizes"] == [32, 16] and params["runconfig"]["max_steps"] == 4
    scalars = read_scalars(str(model_dir / "train"))
    assert [step for step, _ in scalars["loss"]] == [1, 2, 3, 4]
    for tag in ("lr", "samples_per_sec", "global_step/sec"):
        assert len(scalars[tag]) == 4
    assert scalars["lr"][0][1] == pytest.approx(0.005)  # params_tiny.yaml


def test_loss_falls_and_eval_reports_accuracy(tf_mnist, tiny_args, tmp_path, capsys):
    tf_mnist.main(tiny_args("--mode", "train", "runconfig.max_steps=30", "runconfig.log_steps=10",
                            "runconfig.checkpoint_steps=30", "model.dropout=0.0", "optimizer.learning_rate=0.01"))
    losses = _losses(tmp_path / "model")
    assert losses[-1] < 0.5 * losses[0]
    metrics = tf_mnist.main(tiny_args("--mode", "eval"))
    assert metrics["global_step"] == 30
    assert metrics["accuracy"] > 0.8  # 10 well-separated blobs
    assert "| Eval Device=cpu Step=30 accuracy=" in capsys.readouterr().err
    scalars = read_scalars(str(tmp_path / "model" / "eval"))
    assert scalars["accuracy"][0] == (30, pytest.approx(metrics["accuracy"]))
    assert os.path.isfile(tmp_path / "model" / "params_eval.yaml")


def test_resume_equals_one_run(tf_mnist, tiny_args, tmp_path):
    """8 steps at once, and 4 + 4 with a restart between, give the same losses (data order,
    dropout masks and Adam state all resume)."""
    common = ("runconfig.log_steps=1", "runconfig.checkpoint_steps=4", "train_input.batch_size=64")
    tf_mnist.main(tiny_args("--mode", "train", "runconfig.max_steps=8", *common, model_dir=tmp_path / "once"))
    tf_mnist.main(tiny_args("--mode", "train", "runconfig.max_steps=4", *common, model_dir=tmp_path / "twice"))
    tf_mnist.main(tiny_args("--mode", "train", "runconfig.max_steps=8", *common, model_dir=tmp_path / "twice"))
    once, twice = _losses(tmp_path / "once"), _losses(tmp_path / "twice")
    assert len(once) == len(twice) == 8  # 320 images / 64: the 8 steps cross an epoch boundary
    np.testing.assert_allclose(twice, once, rtol=1e-6)


def test_keep_checkpoint_max_holds_across_runs(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args("runconfig.max_steps=6", "runconfig.checkpoint_steps=1", "runconfig.keep_checkpoint_max=2"))
    tf_mnist.main(tiny_args("runconfig.max_steps=9", "runconfig.checkpoint_steps=1", "runconfig.keep_checkpoint_max=2"))
    indexes = sorted(n for n in os.listdir(tmp_path / "model") if n.endswith(".index"))
    assert indexes == ["model.ckpt-8.index", "model.ckpt-9.index"]
    state = (tmp_path / "model" / "checkpoint").read_text()
    assert 'model_checkpoint_path: "model.ckpt-9"' in state and "model.ckpt-7" not in state


def test_eval_all_evaluates_every_checkpoint(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args("runconfig.keep_checkpoint_max=3"))  # checkpoints at 2 and 4
    results = tf_mnist.main(tiny_args("--mode", "eval_all"))
    assert [r["global_step"] for r in results] == [2, 4]
    scalars = read_scalars(str(tmp_path / "model" / "eval"))
    assert [step for step, _ in scalars["accuracy"]] == [2, 4]


def test_train_and_eval_evaluates_each_checkpoint(tf_mnist, tiny_args, tmp_path):
    last = tf_mnist.main(tiny_args("--mode", "train_and_eval"))
    assert last["global_step"] == 4
    scalars = read_scalars(str(tmp_path / "model" / "eval"))
    assert [step for step, _ in scalars["loss"]] == [2, 4]
    assert os.path.isfile(tmp_path / "model" / "params_train_and_eval.yaml")


def test_predict_writes_predictions(tf_mnist, tiny_args, tmp_path, mnist_dir):
    tf_mnist.main(tiny_args())
    path = tf_mnist.main(tiny_args("--mode", "predict"))
    assert path == str(tmp_path / "model" / "predictions.npz")
    with np.load(path) as predictions:
        classes, probabilities = predictions["classes"], predictions["probabilities"]
    assert classes.shape == (96,)  # 3 batches of 32
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(classes, probabilities.argmax(axis=1))
    # the predictions are the ones eval scores, in the eval set's order
    labels = read_idx(os.path.join(mnist_dir, "MNIST", "raw", MNIST_FILES["test"][1]))  # (96,)
    accuracy = tf_mnist.main(tiny_args("--mode", "eval"))["accuracy"]
    assert np.mean(classes == labels) == pytest.approx(accuracy)


def test_warm_start_from_checkpoint_path(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args(model_dir=tmp_path / "first"))
    tf_mnist.main(tiny_args("--checkpoint_path", str(tmp_path / "first" / "model.ckpt-2"), "runconfig.max_steps=5",
                            model_dir=tmp_path / "second"))
    assert sorted(n for n in os.listdir(tmp_path / "second") if n.endswith(".index")) == ["model.ckpt-4.index",
                                                                                          "model.ckpt-5.index"]
    assert [s for s, _ in read_scalars(str(tmp_path / "second" / "train"))["loss"]] == [3, 4, 5]


def test_tfds_mnist_branch(tf_mnist, tiny_args, tmp_path, capsys):
    """A data_dir that tfds prepared is read with tfds.load (here mocked: no files, no network)."""
    import tensorflow_datasets as tfds

    data_dir = tmp_path / "tfds"
    (data_dir / "mnist" / "3.0.1").mkdir(parents=True)
    (data_dir / "mnist" / "3.0.1" / "dataset_info.json").write_text("{}")
    with tfds.testing.mock_data(num_examples=64):
        tf_mnist.main(tiny_args(f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}"))
        metrics = tf_mnist.main(tiny_args("--mode", "eval", f"eval_input.data_dir={data_dir}"))
    assert f"data (train): tfds mnist from {data_dir} (64 train, 28x28)" in capsys.readouterr().err
    assert metrics["global_step"] == 4


def test_tiny_config_runs_without_torch(tmp_path, mnist_dir):
    """The TF side never imports torch (it must run where torch is not installed)."""
    code = (
        "import sys\n"
        "from common.folder import load_run_module\n"
        f"load_run_module({TF_MNIST!r}).main(['--params', {TINY!r}, '--model_dir', {str(tmp_path / 'm')!r}, "
        f"'train_input.data_dir={mnist_dir}', 'eval_input.data_dir={mnist_dir}'])\n"
        "assert 'torch' not in sys.modules, 'the TF side imported torch'\n"
        "print('no torch')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no torch" in result.stdout
