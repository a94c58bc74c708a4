"""run() without a defaults function, as the vendor's runner allowed (its gpt2 passes none).

Each test writes a tiny model folder whose run.py calls run() with the vendor's argument order
(``model_fn, train_data_fn, eval_data_fn, default_params_fn=None, extra_args_parser_fn=None``),
positionally or by keyword, and trains it a few steps on the CPU: the params file is taken as
it is, and the runner's own keys it leaves out get their defaults.
"""

import argparse  # noqa: F401  (the fixture's run.py builds a parser)
import importlib
import importlib.util
import os

import pytest
import yaml

from common.folder import folder_package

# each framework's tests need that framework only (tox runs them where the other is absent);
# torch, where present, is imported first (tests/conftest.py)
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")

PT_MODEL = '''
import torch

from common.pytorch.base_model import PyTorchBaseModel


class TinyModel(PyTorchBaseModel):
    def __init__(self, params, device=None):
        self.model = torch.nn.Linear(params["model"]["features"], 1)
        super().__init__(params=params, model=self.model, device=device)

    def __call__(self, data):
        x, y = data  # (B, F), (B, 1)
        return torch.nn.functional.mse_loss(self.model(x), y)
'''

PT_DATA = '''
import torch


def _loader(params, section):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, params["model"]["features"], generator=g)
    y = x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=params[section]["batch_size"],
                                       drop_last=True)


def train_data_fn(params):
    return _loader(params, "train_input")


def eval_data_fn(params):
    return _loader(params, "eval_input")
'''

PT_RUNS = {
    # the vendor's gpt2: three positional arguments, no defaults function
    "run_positional": '''
from common.folder import import_beside
from common.pytorch.run import run

model, data = import_beside(__file__, "model", "data")


def main(argv=None):
    return run(model.TinyModel, data.train_data_fn, data.eval_data_fn, argv=argv)
''',
    # all five by keyword, the defaults function an explicit None
    "run_keywords": '''
from common.folder import import_beside
from common.pytorch.run import run

model, data = import_beside(__file__, "model", "data")


def main(argv=None):
    return run(model_fn=model.TinyModel, train_data_fn=data.train_data_fn, eval_data_fn=data.eval_data_fn,
               default_params_fn=None, extra_args_parser_fn=None, argv=argv)
''',
    # five positional: None in the defaults' place, then the folder's own flags
    "run_five": '''
import argparse

from common.folder import import_beside
from common.pytorch.run import run

model, data = import_beside(__file__, "model", "data")


def extra_args():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tag")
    return [parser]


def main(argv=None):
    return run(model.TinyModel, data.train_data_fn, data.eval_data_fn, None, extra_args, argv=argv)
''',
    # only the model: a train run has no data to read
    "run_model_only": '''
from common.folder import import_beside
from common.pytorch.run import run

model = import_beside(__file__, "model")


def main(argv=None):
    return run(model.TinyModel, argv=argv)
''',
}

PARAMS = """\
train_input:
  batch_size: 8
eval_input:
  batch_size: 8
model:
  features: 3
optimizer:
  optimizer_type: sgd
  learning_rate: 0.05
runconfig:
  max_steps: 3
  log_steps: 1
"""


def write_folder(root, files: dict) -> str:
    os.makedirs(root / "configs")
    (root / "configs" / "params.yaml").write_text(PARAMS)
    for name, text in files.items():
        (root / f"{name}.py").write_text(text)
    return str(root)


@pytest.fixture(scope="module")
def pt_folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("no_defaults_pt"), {"model": PT_MODEL, "data": PT_DATA, **PT_RUNS})


def run_module(folder: str, name: str):
    return importlib.import_module(f"{folder_package(folder)}.{name}")


@needs_torch
@pytest.mark.parametrize("entry", ["run_positional", "run_keywords", "run_five"])
def test_pytorch_run_without_defaults_trains_on_the_file_as_it_is(pt_folder, entry, tmp_path):
    model_dir = tmp_path / "model"
    argv = ["--mode", "train", "--model_dir", str(model_dir)] + (["--tag", "t1"] if entry == "run_five" else [])
    run_module(pt_folder, entry).main(argv)
    assert os.path.isfile(model_dir / "checkpoint_3.mdl")
    saved = yaml.safe_load(open(model_dir / "params_train.yaml"))
    file = yaml.safe_load(PARAMS)
    for section in ("model", "train_input", "eval_input"):
        assert saved[section] == file[section]  # nothing filled into the model's sections
    assert saved["runconfig"]["max_steps"] == 3 and saved["optimizer"]["learning_rate"] == 0.05
    assert saved["runconfig"]["checkpoint_steps"] == 1000  # the runner's own default, filled as it needs
    assert saved["mixed_precision"]["enabled"] is False
    if entry == "run_five":
        assert saved["runconfig"]["tag"] == "t1"  # the folder's own flag, in runconfig as the vendor's runner put it


@needs_torch
def test_pytorch_run_without_a_data_function_the_mode_reads_is_one_line(pt_folder, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_module(pt_folder, "run_model_only").main(["--mode", "train", "--model_dir", str(tmp_path / "m")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --mode train reads the train input, and run() was given no train_data_fn"]
    assert not os.path.exists(tmp_path / "m")


TF_MODEL = '''
import tensorflow as tf

from common.tf.estimator import ModeKeys
from common.tf.estimator.cs_estimator_spec import CSEstimatorSpec


def model_fn(features, labels, mode, params):
    predictions = tf.keras.layers.Dense(1, name="dense")(features)  # (B, 1)
    loss = tf.reduce_mean(tf.square(predictions - labels))
    if mode == ModeKeys.TRAIN:
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(params["optimizer"]["learning_rate"])
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        return CSEstimatorSpec(mode=mode, loss=loss, train_op=train_op)
    return CSEstimatorSpec(mode=mode, loss=loss)


def _input(params, section, training):
    features = params["model"]["features"]
    x = tf.random.stateless_normal([32, features], seed=[1, 2])
    ds = tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1, keepdims=True)))
    if training:
        ds = ds.repeat()
    return ds.batch(params[section]["batch_size"], drop_remainder=True)


def train_input_fn(params):
    return _input(params, "train_input", True)


def eval_input_fn(params):
    return _input(params, "eval_input", False)
'''

TF_RUNS = {
    "run_positional": '''
from common.folder import import_beside
from common.tf.run import run

model = import_beside(__file__, "model")


def main(argv=None):
    return run(model.model_fn, model.train_input_fn, model.eval_input_fn, argv=argv)
''',
    "run_keywords": '''
from common.folder import import_beside
from common.tf.run import run

model = import_beside(__file__, "model")


def main(argv=None):
    return run(model_fn=model.model_fn, train_input_fn=model.train_input_fn, eval_input_fn=model.eval_input_fn,
               default_params_fn=None, argv=argv)
''',
}


@pytest.fixture(scope="module")
def tf_folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("no_defaults_tf"), {"model": TF_MODEL, **TF_RUNS})


@needs_tf
@pytest.mark.parametrize("entry", ["run_positional", "run_keywords"])
def test_tf_run_without_defaults_trains_on_the_file_as_it_is(tf_folder, entry, tmp_path):
    model_dir = tmp_path / "model"
    run_module(tf_folder, entry).main(["--mode", "train", "--model_dir", str(model_dir)])
    assert os.path.isfile(model_dir / "model.ckpt-3.index")
    saved = yaml.safe_load(open(model_dir / "params_train.yaml"))
    file = yaml.safe_load(PARAMS)
    for section in ("model", "train_input", "eval_input"):
        assert saved[section] == file[section]
    assert saved["runconfig"]["keep_checkpoint_max"] == 5  # the runner's own default


@needs_tf
def test_tf_refuses_disable_dropout_in_one_line_and_writes_nothing(tf_folder, tmp_path, capsys):
    model_dir = tmp_path / "model"
    with pytest.raises(SystemExit) as exit_:
        run_module(tf_folder, "run_positional").main(["--mode", "train", "--model_dir", str(model_dir),
                                                      "runconfig.disable_dropout=true"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: runconfig.disable_dropout: true is PyTorch's only: a TF graph's dropout rates")
    assert not model_dir.exists()
