"""pytorch/mnist: the model, its data, its configs, and a copy of the folder running elsewhere."""

import os
import shutil
from pathlib import Path

import pytest
import torch

from common.data import MNIST_MEAN, MNIST_STD, write_fake_mnist
from common.folder import import_beside, load_run_module
from common.params import load_params, thaw
from common.summaries import read_scalars

ROOT = Path(__file__).resolve().parents[2]
MNIST = str(ROOT / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(MNIST, "run.py"), "model", "data", "utils")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=320, n_test=64, seed=1)
    return str(folder)


def test_params_yaml_spells_out_the_defaults():
    assert thaw(load_params(os.path.join(MNIST, "configs", "params.yaml"), utils.default_params())) == \
        thaw(load_params(None, utils.default_params()))


def test_defaults_match_the_reference_mlp():
    params = load_params(None, utils.default_params())
    assert params["model"] == {"hidden_sizes": (500, 300), "dropout": 0.2, "activation_fn": "relu"}
    assert params["optimizer"]["optimizer_type"] == "adam" and params["optimizer"]["learning_rate"] == 0.001
    assert params["train_input"]["batch_size"] == 256
    # eval: a batch that divides both test sets (360 embedded digits, 10,000 MNIST), so none is dropped
    assert params["eval_input"]["batch_size"] == 40 and 360 % 40 == 0 and 10_000 % 40 == 0
    for section in ("train_input", "eval_input"):
        assert params[section]["drop_last"] is True
    assert params["train_input"]["shuffle"] and not params["eval_input"]["shuffle"]


@pytest.mark.parametrize("activation", ["relu", "tanh", "elu", "selu", "linear"])
def test_every_activation_builds_and_runs(activation):
    params = load_params(TINY, utils.default_params(), [f"model.activation_fn={activation}"])
    mnist = model.model_fn(params, torch.device("cpu"))
    loss, outputs = mnist.eval_step((torch.randn(4, 1, 28, 28), torch.tensor([0, 1, 2, 3])))
    assert outputs["logits"].shape == (4, 10) and torch.isfinite(loss)
    linears = [m for m in mnist.model.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(784, 32), (32, 16), (16, 10)]


def test_data_is_normalised_and_eval_reads_eval_input(data_dir):
    params = load_params(TINY, utils.default_params(), [
        "train_input.dataset=mnist", "train_input.data_dir=/no/such/dir",  # eval must not read these
        f"eval_input.data_dir={data_dir}", "eval_input.batch_size=16"])
    loader = data.get_eval_dataloader(params)
    images, labels = next(iter(loader))
    assert images.shape == (16, 1, 28, 28) and images.dtype == torch.float32 and labels.dtype == torch.int64
    raw = loader.dataset.images * MNIST_STD + MNIST_MEAN  # back to [0, 1]
    assert raw.min() >= -1e-6 and raw.max() <= 1 + 1e-6
    assert len(loader) == 4  # 64 test images, drop_last


def test_tiny_config_learns_the_fake_digits(tmp_path, data_dir):
    metrics = load_run_module(MNIST).main([
        "--mode", "train_and_eval", "--params", TINY, "--model_dir", str(tmp_path), "runconfig.max_steps=60",
        "runconfig.checkpoint_steps=60", "optimizer.learning_rate=0.01",
        f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}"])
    losses = [v for _, v in read_scalars(str(tmp_path / "train"))["loss"]]
    assert sum(losses[-10:]) / 10 < 0.5 * sum(losses[:10]) / 10
    assert metrics["accuracy"] > 0.8


def test_a_copied_folder_runs_beside_the_original(tmp_path, data_dir):
    copy = tmp_path / "elsewhere" / "my_mlp"
    shutil.copytree(MNIST, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # without --params, a run reads configs/params.yaml beside the folder's model.py: the copy's own
    params = (copy / "configs" / "params.yaml").read_text()
    (copy / "configs" / "params.yaml").write_text(params.replace("max_steps: 1000", "max_steps: 4")
                                                  .replace("hidden_sizes: [500, 300]", "hidden_sizes: [32, 16]"))
    argv = [f"train_input.data_dir={data_dir}"]
    load_run_module(str(copy)).main([*argv, "--model_dir", str(tmp_path / "copy_run")])
    load_run_module(MNIST).main([*argv, "--params", TINY, "--model_dir", str(tmp_path / "original_run")])
    copied_model = import_beside(str(copy / "run.py"), "model")
    assert copied_model is not model and copied_model.__file__ == str(copy / "model.py")
    assert (tmp_path / "copy_run" / "checkpoint_4.mdl").is_file()
    assert (tmp_path / "original_run" / "checkpoint_4.mdl").is_file()
