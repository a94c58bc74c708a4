"""The vendor's R1.6 config keys (common/vendor_keys.py): the ones that mean nothing here are
accepted and named once with their file:line, the ones that mean something are honoured, a
wrong type is one error line, and an unknown key that is not the vendor's is refused as before."""

import argparse
import importlib.util
import logging

import numpy as np
import pytest

from common.cli import check_device_optimizer, guarded
from common.errors import UserError
from common.params import ALIASES, COMMON_DEFAULTS, load_params, load_vendor_params
from common.schedules import build_schedule
from common.vendor_keys import VENDOR_KEYS

# each framework's tests need that framework only (tox runs them where the other is absent)
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow not installed")

# Every runconfig and optimizer key of the vendor's R1.6 configs (transformers/pytorch/**/configs,
# fc_mnist/pytorch/configs and **/tf/**/configs), collected from its git tag by script:
# git ls-tree -r --name-only R_1.6.0, each configs/*.yaml loaded, the keys of each section.
R16_KEYS = {
    "runconfig": """checkpoint_steps cs_ip enable_distributed enable_gpu_optimizations eval_steps keep_checkpoint_max
        log_step_count_steps log_steps max_steps mode model_dir multireplica num_wgt_servers save_checkpoints_steps
        save_initial_checkpoint save_losses save_summary_steps seed show_debug_metrics tf_random_seed
        throttle_secs""",
    "optimizer": """beta1 beta2 beta_1 beta_2 correct_bias disable_lr_steps_reset epsilon initial_loss_scale
        learning_rate log_grads log_hists log_summaries loss_scaling_factor max_gradient_norm max_loss_scale momentum
        optimizer_type use_bias_correction weight_decay_rate ws_summary""",
}


def write(tmp_path, text, name="params.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("section", sorted(R16_KEYS))
def test_every_r16_key_is_the_zoos_or_in_the_table(section):
    for key in R16_KEYS[section].split():
        known = key in COMMON_DEFAULTS[section] or (section, key) in ALIASES or (section, key) in VENDOR_KEYS
        assert known, f"{section}.{key}"


def test_the_table_is_consistent_with_the_schema():
    for (section, key), entry in VENDOR_KEYS.items():
        assert entry.kind in ("ignored", "spelling", "honoured") and entry.reason
        schema = COMMON_DEFAULTS.get(section, {})
        if entry.kind == "honoured":
            assert key in schema, key
        elif entry.kind == "spelling":
            assert key not in schema and entry.zoo_key in schema, key
        else:
            assert key not in schema and entry.types, key


VENDOR_YAML = """\
model:
  units: 3
optimizer:
  optimizer_type: adamw
  log_summaries: true
  beta_1: 0.8
  use_bias_correction: false
runconfig:
  max_steps: 3
  enable_distributed: false
  show_debug_metrics: true
  save_initial_checkpoint: true
"""


def _ignored_lines(path):
    return [f"{path}:5: optimizer.log_summaries is ignored: {VENDOR_KEYS['optimizer', 'log_summaries'].reason}",
            f"{path}:10: runconfig.enable_distributed is ignored: "
            f"{VENDOR_KEYS['runconfig', 'enable_distributed'].reason}",
            f"{path}:11: runconfig.show_debug_metrics is ignored: "
            f"{VENDOR_KEYS['runconfig', 'show_debug_metrics'].reason}",
            f"{path}:12: runconfig.save_initial_checkpoint is ignored: "
            f"{VENDOR_KEYS['runconfig', 'save_initial_checkpoint'].reason}"]


def test_zoo_form_accepts_the_vendor_keys_and_names_each_ignored_one_once(tmp_path, caplog):
    path = write(tmp_path, VENDOR_YAML)
    with caplog.at_level(logging.INFO, logger="zoo"):
        # the override gives one of them again: still named once
        params = load_params(path, {"model": {"units": 1}}, ["runconfig.show_debug_metrics=false"])
    assert [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()] == _ignored_lines(path)
    levels = {r.getMessage().split(": ")[1]: r.levelno for r in caplog.records if "is ignored" in r.getMessage()}
    assert levels["runconfig.enable_distributed is ignored"] == logging.INFO  # false asks for nothing
    assert levels["runconfig.show_debug_metrics is ignored"] == logging.WARNING
    optimizer = params["optimizer"]
    assert (optimizer["beta1"], optimizer["correct_bias"]) == (0.8, False)  # the vendor's spellings, honoured
    assert "log_summaries" not in optimizer and "enable_distributed" not in params["runconfig"]


def test_vendor_form_accepts_them_too_and_keeps_them_for_the_code_that_reads_them(tmp_path, caplog):
    path = write(tmp_path, VENDOR_YAML)
    with caplog.at_level(logging.INFO, logger="zoo"):
        params = load_vendor_params(path, None)
    named = [r.getMessage() for r in caplog.records if "is ignored" in r.getMessage()]
    assert sorted(named) == sorted(_ignored_lines(path))  # runconfig first here
    assert params["runconfig"]["show_debug_metrics"] is True and params["optimizer"]["log_summaries"] is True
    assert (params["optimizer"]["beta1"], params["optimizer"]["correct_bias"]) == (0.8, False)


def test_vendor_form_takes_the_vendors_runconfig_values_as_it_meant_them(tmp_path, caplog):
    # the vendor's PyTorch BERT classifier configs give both; its TF ones eval_steps: 0 for all
    path = write(tmp_path, "runconfig:\n  log_steps: 1000\n  save_summary_steps: 100\n  eval_steps: 0\n")
    with caplog.at_level(logging.INFO, logger="zoo"):
        runconfig = load_vendor_params(path, None)["runconfig"]
    assert (runconfig["log_steps"], runconfig["eval_steps"]) == (100, None)
    assert f"{path}:4: runconfig.eval_steps: 0 is the whole eval set (the vendor's meaning of 0 or less)" in caplog.messages
    assert any(m.startswith(f"{path}:3, {path}:2: runconfig.save_summary_steps: 100 and log_steps: 1000 are one")
               for m in caplog.messages)
    with pytest.raises(UserError, match="are the same setting"):  # the zoo's form stays strict
        load_params(path, {})


@pytest.mark.parametrize("line, message", [
    ("optimizer:\n  correct_bias: maybe\n", "'optimizer.correct_bias' must be a boolean, got 'maybe'"),
    ("optimizer:\n  use_bias_correction: maybe\n", "'optimizer.correct_bias' must be a boolean, got 'maybe'"),
    ("optimizer:\n  max_loss_scale: big\n", "'optimizer.max_loss_scale' must be a number, got 'big'"),
    ("runconfig:\n  enable_distributed: maybe\n", "'runconfig.enable_distributed' must be a boolean, got 'maybe'"),
    ("optimizer:\n  log_summaries: 3\n", "'optimizer.log_summaries' must be a boolean, got 3"),
])
@pytest.mark.parametrize("form", ["zoo", "vendor"])
def test_a_vendor_key_of_the_wrong_type_is_one_line_naming_file_and_line_exit_2(tmp_path, capsys, line, message,
                                                                               form):
    path = write(tmp_path, "model: {}\n" + line)
    args = argparse.Namespace(verbose=False, mode="train")
    load = (lambda a: load_params(path, {"model": {}})) if form == "zoo" else (lambda a: load_vendor_params(path, None))
    with pytest.raises(SystemExit) as e:
        guarded(load, args)
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: {path}:3: {message}"]


def test_an_unknown_key_that_is_not_the_vendors_is_refused_as_before(tmp_path):
    path = write(tmp_path, "runconfig:\n  enable_distributd: false\n  max_step: 3\n")
    with pytest.raises(UserError) as e:
        load_params(path, {})
    assert str(e.value).startswith(f"{path}:2: unknown key 'runconfig.enable_distributd'")
    path = write(tmp_path, "runconfig:\n  max_step: 3\n")
    with pytest.raises(UserError, match=r":2: unknown key 'runconfig.max_step' \(did you mean 'runconfig.max_steps'\?\)"):
        load_params(path, {})
    # an input key of the table is taken only where the model's defaults do not declare it; a model key never
    path = write(tmp_path, "train_input:\n  use_multiple_workers: true\nmodel:\n  use_vsl: true\n")
    with pytest.raises(UserError, match=r":4: unknown key 'model.use_vsl'"):
        load_params(path, {"train_input": {}, "model": {}})


# --- honoured: the effect of each ----------------------------------------------------------

LR, BETAS, EPS, DECAY = 0.1, (0.8, 0.9), 1e-8, 0.01
GRADS = [np.array([0.5, -1.0], np.float64), np.array([0.25, 2.0]), np.array([-0.75, 0.5])]


def adamw_without_bias_correction(p):
    """AdamW as torch's, with the bias correction left out, by hand (float64)."""
    m, v = np.zeros_like(p), np.zeros_like(p)
    for g in GRADS:
        p = p * (1 - LR * DECAY)
        m = BETAS[0] * m + (1 - BETAS[0]) * g
        v = BETAS[1] * v + (1 - BETAS[1]) * g * g
        p = p - LR * m / (np.sqrt(v) + EPS)
    return p


def _adamw_params(tmp_path, spelling):
    path = write(tmp_path, f"optimizer:\n  optimizer_type: AdamW\n  learning_rate: {LR}\n  beta1: {BETAS[0]}\n"
                           f"  beta2: {BETAS[1]}\n  weight_decay_rate: {DECAY}\n  weight_decay_exclude: []\n"
                           f"  {spelling}: false\n")
    return load_vendor_params(path, None)


@needs_torch
@pytest.mark.parametrize("spelling", ["correct_bias", "use_bias_correction"])
def test_pytorch_adamw_with_correct_bias_false_is_adamw_without_bias_correction(tmp_path, spelling):
    import torch

    from common.pytorch.optim import build_optimizer

    params = _adamw_params(tmp_path, spelling)
    start = np.array([1.0, -2.0])
    weight = torch.nn.Parameter(torch.tensor(start))
    optimizer = build_optimizer(torch.nn.ParameterDict({"w": weight}), params["optimizer"])
    for group in optimizer.param_groups:
        group["lr"] = LR  # the ScheduledLR sets it in a run
    for g in GRADS:
        weight.grad = torch.tensor(g)
        optimizer.step()
    np.testing.assert_allclose(weight.detach().numpy(), adamw_without_bias_correction(start), rtol=1e-12)
    corrected = torch.nn.Parameter(torch.tensor(start))  # torch's AdamW corrects: a different result
    reference = torch.optim.AdamW([corrected], lr=LR, betas=BETAS, eps=EPS, weight_decay=DECAY)
    for g in GRADS:
        corrected.grad = torch.tensor(g)
        reference.step()
    assert not np.allclose(corrected.detach().numpy(), weight.detach().numpy(), rtol=1e-3)


@needs_tf
def test_tf_adamw_with_use_bias_correction_false_is_adamw_without_bias_correction(tmp_path):
    import tensorflow as tf

    from common.tf.optim import build_optimizer as build_tf_optimizer

    params = _adamw_params(tmp_path, "use_bias_correction")
    start = np.array([1.0, -2.0])
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(start), use_resource=True)
        grad = tf.compat.v1.placeholder(tf.float64, [2])
        optimizer = build_tf_optimizer(params["optimizer"], tf.constant(LR, tf.float64), [w])
        train = optimizer.apply_gradients([(grad, w)])
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for g in GRADS:
                session.run(train, {grad: g})
            result = session.run(w)
    # TF holds beta1, beta2 and epsilon in float32 (0.8 is 0.800000012): float32 agreement
    np.testing.assert_allclose(result, adamw_without_bias_correction(start), rtol=1e-6)


def _scaled(params):
    """A PyTorchBaseModel of one linear layer, built from ``params``."""
    import torch

    from common.pytorch.base_model import PyTorchBaseModel

    class Scaled(PyTorchBaseModel):
        def __init__(self, params):
            self.model = torch.nn.Linear(2, 1)
            super().__init__(params, self.model)

        def __call__(self, batch):
            return self.model(batch).square().mean()

    return Scaled(params)


@needs_torch
def test_pytorch_dynamic_loss_scale_grows_no_further_than_max_loss_scale():
    import torch

    overrides = ["mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                 "optimizer.initial_loss_scale=8.0", "optimizer.steps_per_increase=1", "optimizer.max_loss_scale=32"]
    model = _scaled(load_params(None, {}, overrides))
    for _ in range(5):  # 8 -> 16 -> 32, then held at 32
        model.train_step(torch.ones(4, 2))
    assert model.scaler.get_scale() == 32.0


@needs_tf
def test_tf_dynamic_loss_scale_grows_no_further_than_max_loss_scale():
    import tensorflow as tf

    from common.tf.optim import build_train_op

    params = load_params(None, {}, ["mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                                    "optimizer.initial_loss_scale=8.0", "optimizer.steps_per_increase=1",
                                    "optimizer.max_loss_scale=32", "optimizer.optimizer_type=sgd"])
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0, 2.0]), use_resource=True)
        train = build_train_op(tf.reduce_sum(tf.square(w)), params)
        scale = [v for v in tf.compat.v1.global_variables() if v.op.name == "loss_scale"][0]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(5):
                session.run(train)
            assert session.run(scale) == 32.0


SCHEDULE = [{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0, "steps": 10},
            {"scheduler": "Linear", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 10}]


@needs_torch
def test_disable_lr_steps_reset_makes_each_schedule_read_the_global_step():
    reset = build_schedule(SCHEDULE)
    assert reset(15) == pytest.approx(0.5)  # the second schedule's step 5
    for value, expected in ((False, 0.5), (True, 0.0)):  # true: the second schedule at step 15 of its 10: its end
        params = load_params(None, {}, [f"optimizer.learning_rate={SCHEDULE}".replace("'", ""),
                                        f"optimizer.disable_lr_steps_reset={str(value).lower()}"])
        assert _scaled(params).schedule(15) == pytest.approx(expected)
        assert _scaled(params).schedule(5) == pytest.approx(0.5)  # the first schedule: the same either way


CONSTANT = {"scheduler": "Constant", "learning_rate": 0.5}


def test_the_vendors_tf_cosine_decay_steps_is_its_steps():
    vendor = {"scheduler": "Cosine", "initial_learning_rate": 1.0, "alpha": 0.1, "decay_steps": 10}
    ours = build_schedule({"scheduler": "Cosine", "initial_learning_rate": 1.0, "alpha": 0.1, "steps": 10})
    for schedule in (build_schedule(vendor), build_schedule([{**vendor, "steps": 10}, CONSTANT])):
        assert [schedule(s) for s in (0, 3, 5, 9)] == [ours(s) for s in (0, 3, 5, 9)]
    assert [ours(s) for s in (0, 5, 10)] == pytest.approx([1.0, 0.55, 0.1])  # alpha 0.1: from 1 to 0.1 over 10 steps
    assert build_schedule(vendor)(10) == pytest.approx(0.1)
    assert build_schedule([{**vendor, "steps": 10}, CONSTANT])(10) == 0.5  # the next schedule after its 10 steps
    with pytest.raises(UserError, match=r"\[0\]: a Cosine's 'decay_steps' \(10\) and 'steps' \(20\) differ"):
        build_schedule([{**vendor, "steps": 20}, CONSTANT])


@needs_tf
def test_tf_disable_lr_steps_reset_makes_each_schedule_read_the_global_step():
    import tensorflow as tf

    from common.tf.optim import build_train_op

    for value, expected in ((False, 0.5), (True, 0.0)):
        params = load_params(None, {}, [f"optimizer.learning_rate={SCHEDULE}".replace("'", ""),
                                        f"optimizer.disable_lr_steps_reset={str(value).lower()}",
                                        "optimizer.optimizer_type=sgd"])
        with tf.Graph().as_default():
            w = tf.compat.v1.get_variable("w", initializer=tf.constant([1.0]), use_resource=True)
            build_train_op(tf.reduce_sum(w), params)
            lr = tf.compat.v1.get_collection("zoo_learning_rate")[0]
            step = tf.compat.v1.train.get_global_step()
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(step.assign(15))
                assert session.run(lr) == pytest.approx(expected)


def test_correct_bias_false_is_refused_on_the_device(tmp_path):
    params = _adamw_params(tmp_path, "correct_bias")
    for flags in ({"device": "emulator"}, {"device": "cpu", "compile_only": True}):
        args = argparse.Namespace(**{"validate_only": False, "compile_only": False, **flags})
        with pytest.raises(UserError, match="the device's Adam always corrects the bias"):
            check_device_optimizer(params, args, "pytorch")
    check_device_optimizer(params, argparse.Namespace(device="cpu", validate_only=False, compile_only=False), "tf")
    big = load_params(None, {}, ["optimizer.max_loss_scale=64"])
    with pytest.raises(UserError, match="max_loss_scale: 64: a PyTorch run on the device"):
        check_device_optimizer(big, argparse.Namespace(device="emulator", validate_only=False, compile_only=False),
                               "pytorch")
    check_device_optimizer(big, argparse.Namespace(device="emulator", validate_only=False, compile_only=False), "tf")
