"""common/port/script.py: the fake batch read from a plain script's data code, each name
followed to its assignment."""

import ast
import importlib.util
import os

import pytest

from common.port.check import check, render
from common.port.script import _torch_dataset_shape
from common.port.source import Source

GALLERY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "port_gallery")


class Literals:
    """A slice that evaluates literals only: enough for shapes written as numbers."""

    def value(self, node, line):
        return ast.literal_eval(node)


def dataset_shape(tmp_path, code: str):
    """(shape, dtype, where) of one example of the data set the script's DataLoader takes."""
    path = tmp_path / "train.py"
    path.write_text("import numpy as np\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
                    + code + "loader = DataLoader(dataset, batch_size=8)\n")
    src = Source.read(str(path), "train.py")
    loader = next(c for c in src.calls() if src.call_name(c) == "torch.utils.data.DataLoader")
    return _torch_dataset_shape(src, loader.args[0], loader.lineno, lambda s: Literals())


def test_a_tensordataset_of_variables_is_read_through_their_assignments(tmp_path):
    shape, dtype, where = dataset_shape(tmp_path, "x = torch.randn(1000, 1, 28, 28)\n"
                                                  "y = torch.randint(0, 10, (1000,))\n"
                                                  "dataset = TensorDataset(x, y)\n")
    assert (shape, dtype) == ((1, 28, 28), "float32")
    assert where == "features (1, 28, 28) from torch.randn(1000, 1, 28, 28) (train.py:6)"


@pytest.mark.parametrize("code, dtype", [
    ("X = np.random.rand(500, 13)\ndataset = TensorDataset(torch.from_numpy(X), torch.zeros(500))\n", "float64"),
    ("X = torch.from_numpy(np.random.rand(500, 13))\ndataset = TensorDataset(X, torch.zeros(500))\n", "float64"),
    ("X = np.random.rand(500, 13)\ndataset = TensorDataset(torch.from_numpy(X).float(), torch.zeros(500))\n",
     "float32"),
    ("X = np.random.rand(500, 13).astype(np.float32)\ndataset = TensorDataset(torch.from_numpy(X), torch.zeros(500))\n",
     "float32"),
    ("X = torch.tensor(np.random.rand(500, 13), dtype=torch.float32)\ndataset = TensorDataset(X, torch.zeros(500))\n",
     "float32"),
    ("X = torch.randn(500, 13).double()\ndataset = TensorDataset(X, torch.zeros(500))\n", "float64"),
])
def test_the_features_dtype_is_the_last_conversion_else_numpys_or_torchs(tmp_path, code, dtype):
    assert dataset_shape(tmp_path, code)[:2] == ((13,), dtype)


def test_a_tensor_from_a_name_without_an_assignment_gives_no_shape(tmp_path):
    assert dataset_shape(tmp_path, "dataset = TensorDataset(features, labels)\n") == (None, "float32", "")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_the_script_of_variables_is_built_on_a_batch_of_64_images():
    report = check(os.path.join(GALLERY, "torch_tensordataset_cnn", "train.py"), capture=True)
    assert "batch 64 from train.py:21" in report.built, render(report)
    assert "features (1, 28, 28) from torch.randn(1000, 1, 28, 28) (train.py:21)" in report.built
    assert any("batch 64" in n.message for n in report.notes if n.message.startswith("compile estimate:"))


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow not installed")
def test_a_keras_optimizer_handed_to_compile_by_a_name_is_read_at_its_assignment(tmp_path):
    import tensorflow as tf

    from common.port.script import _keras_optimizer

    path = tmp_path / "train.py"
    path.write_text("import keras\nopt = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)\n"
                    "model = keras.Sequential([keras.layers.Dense(1)])\nmodel.compile(optimizer=opt, loss='mse')\n")
    src = Source.read(str(path), "train.py")
    call = next(c for c in src.calls() if src.call_name(c) == ".compile")
    optimizer, said = _keras_optimizer((src, call), lambda s: Literals())
    assert said == "optimizer SGD(0.05)"
    assert isinstance(optimizer, tf.compat.v1.train.MomentumOptimizer)
