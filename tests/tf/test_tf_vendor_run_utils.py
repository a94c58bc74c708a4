"""The vendor's TF run_utils names a folder's own run.py calls, and warm starting as its fine-tuning
folders ask for it (``create_warm_start_settings(runconfig, exclude_string=...)`` handed to the
estimator): the selected trainable variables from the checkpoint, the rest afresh, from step 0; a
model_dir that holds a checkpoint resumes from it."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from common.errors import UserError
from common.params import load_params
from common.tf.estimator import CerebrasEstimator, EstimatorSpec, ModeKeys, RunConfig, WarmStartSettings
from common.tf.estimator import checkpoints
from common.tf.run_utils import (ExecutionMode, create_warm_start_settings, get_csconfig, get_execution_mode,
                                 get_input_checkpoint_steps, get_params, get_predict_directory, save_predictions,
                                 update_input_checkpoint_steps)


def model_fn(features, labels, mode, params):
    hidden = tf.keras.layers.Dense(4, activation="tanh", name="encoder")(features)
    predictions = tf.keras.layers.Dense(1, name="head")(hidden)
    loss = tf.reduce_mean(tf.square(predictions - labels))
    step = tf.compat.v1.train.get_or_create_global_step()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(params["model"]["lr"])
    return EstimatorSpec(mode=mode, loss=loss, train_op=optimizer.minimize(loss, global_step=step))


def input_fn(params):
    x = tf.random.stateless_normal([16, 3], seed=[1, 2])
    return tf.data.Dataset.from_tensor_slices((x, tf.reduce_sum(x, 1, keepdims=True))).repeat().batch(4)


def estimator(model_dir, lr, warm_start_from=None, seed=0):
    params = load_params(None, {"model": {"lr": lr}})
    config = RunConfig(model_dir=str(model_dir), save_checkpoints_steps=100, tf_random_seed=seed)
    return CerebrasEstimator(model_fn, config=config, params=params, warm_start_from=warm_start_from)


def variables(model_dir):
    path = checkpoints.latest_checkpoint(str(model_dir))
    reader = tf.train.load_checkpoint(path)
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
            if name.startswith(("encoder", "head")) or name == "global_step"}


def test_a_warm_start_takes_the_selected_weights_from_step_0_and_then_resumes(tmp_path):
    estimator(tmp_path / "pretrained", lr=0.1, seed=1).train(input_fn, max_steps=3)
    pretrained = variables(tmp_path / "pretrained")
    fresh_dir = tmp_path / "fresh"
    estimator(fresh_dir, lr=0.0, seed=2).train(input_fn, max_steps=1)
    fresh = variables(fresh_dir)

    settings = create_warm_start_settings({"checkpoint_path": str(tmp_path / "pretrained" / "model.ckpt-3")},
                                          exclude_string="head")
    assert isinstance(settings, WarmStartSettings)
    tuned_dir = tmp_path / "tuned"
    estimator(tuned_dir, lr=0.0, warm_start_from=settings, seed=2).train(input_fn, max_steps=1)
    tuned = variables(tuned_dir)
    assert int(tuned["global_step"]) == 1  # from step 0, not the checkpoint's 3
    for name in ("encoder/kernel", "encoder/bias"):
        assert np.array_equal(tuned[name], pretrained[name])
    for name in ("head/kernel", "head/bias"):  # excluded: as a fresh model of the same seed has them
        assert np.array_equal(tuned[name], fresh[name])
    assert not np.array_equal(fresh["encoder/kernel"], pretrained["encoder/kernel"])

    # model_dir now holds a checkpoint: the same settings resume from it
    estimator(tuned_dir, lr=0.1, warm_start_from=settings, seed=2).train(input_fn, max_steps=2)
    assert int(variables(tuned_dir)["global_step"]) == 2


def test_no_checkpoint_path_is_no_warm_start_and_a_checkpoint_without_the_selection_is_one_line(tmp_path):
    assert create_warm_start_settings({"checkpoint_path": None}) is None
    assert create_warm_start_settings({}, exclude_string="head") is None
    estimator(tmp_path / "pretrained", lr=0.1).train(input_fn, max_steps=1)
    nothing = WarmStartSettings(str(tmp_path / "pretrained" / "model.ckpt-1"), vars_to_warm_start="decoder")
    with pytest.raises(UserError, match=r"model\.ckpt-1: holds none of the variables the warm start selects"):
        estimator(tmp_path / "tuned", lr=0.1, warm_start_from=nothing).train(input_fn, max_steps=1)


def test_the_selection_is_a_regex_or_a_list_matched_from_the_start_of_the_name():
    settings = create_warm_start_settings({"checkpoint_path": "ckpt"}, exclude_string="cls/")
    assert settings.selects("bert/encoder/kernel") and not settings.selects("cls/predictions/bias")
    assert WarmStartSettings("c", ["enc.*", "emb"]).selects("embedding") and not \
        WarmStartSettings("c", ["enc.*"]).selects("head/enc")
    assert WarmStartSettings("c", None).selects("anything")


def test_the_vendor_system_names_answer_as_without_a_system():
    assert get_execution_mode() == ExecutionMode.OutsideCerebras
    assert get_csconfig({}) is None and get_csconfig({"use_cbfloat16": True}) is None
    params = {"runconfig": {"mode": "train", "model_dir": "m"}, "train_input": {"shuffle": False}}
    assert update_input_checkpoint_steps(params) is params and "skip_steps" not in params["train_input"]


def test_get_params_and_predictions(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("train_input:\n  batch_size: 4\n")
    assert get_params(str(path)) == {"train_input": {"batch_size": 4}}
    with pytest.raises(UserError, match=r"missing\.yaml: params file not found"):
        get_params(str(tmp_path / "missing.yaml"))
    path.write_text("train_input: [1, 2\n")
    with pytest.raises(UserError, match=r"params\.yaml:\d+: not valid YAML"):
        get_params(str(path))
    path.write_text("- 1\n")
    with pytest.raises(UserError, match=r"params\.yaml: a params file is a mapping of sections, this one holds list"):
        get_params(str(path))

    with pytest.raises(UserError, match=r"predict: no predictions yet; run with --mode predict first"):
        get_predict_directory(str(tmp_path / "m"))
    assert save_predictions(str(tmp_path / "m"), iter([])) is None
    written = save_predictions(str(tmp_path / "m"), ({"logits": np.full(2, i, np.float32)} for i in range(3)))
    assert written == str(tmp_path / "m" / "predict" / "outputs.npz")
    assert get_predict_directory(str(tmp_path / "m")) == str(tmp_path / "m" / "predict")
    saved = np.load(written, allow_pickle=True)["arr_0"]
    assert [float(d["logits"][0]) for d in saved] == [0.0, 1.0, 2.0]


def test_the_input_checkpoint_steps_are_the_newest_checkpoints_step(tmp_path):
    assert get_input_checkpoint_steps(str(tmp_path)) == 0
    estimator(tmp_path, lr=0.1).train(input_fn, max_steps=2)
    assert get_input_checkpoint_steps(str(tmp_path)) == 2


def test_bad_input_a_vendor_run_py_meets_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(
        "import argparse\n"
        "from common.tf.run_utils import get_csrunconfig_dict, update_params_from_args\n"
        "runconfig = {'model_dir': 'm', 'multiple_workers': False, 'disable_standard_logs': False}\n"
        "update_params_from_args(argparse.Namespace(mode='train'), runconfig)\n"
        "get_csrunconfig_dict(runconfig)  # the vendor's set_defaults keys: accepted\n"
        "runconfig['save_checkpoint_step'] = 10\n"
        "get_csrunconfig_dict(runconfig)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: runconfig.save_checkpoint_step: unknown key (this zoo reads checkpoint_path, compile_only, device, "
        "eval_steps, max_steps, mode, model_dir, params, predict_steps, steps, validate_only, and "
        "save_summary_steps, log_steps, save_checkpoints_steps, checkpoint_steps, keep_checkpoint_max, "
        "tf_random_seed, seed)"]
