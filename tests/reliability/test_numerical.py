"""Numerical faults: a NaN or inf injected into the loss, a gradient or a weight at step 3 of
mnist's tiny config (4 steps, a checkpoint at every step), on the CPU and on the emulator,
in both frameworks.

Without loss scaling the run stops with one line naming the step and what went non-finite
(the loss, the gradient of a named parameter, or a named weight left inf by the step's
update, as a learning rate far too large would), exit status 3; the newest checkpoint is
step 2's, whole and equal to an uninterrupted run's, and no checkpoint of the poisoned
state is written. With dynamic loss scaling an inf gradient skips the step (the weights
and optimizer slots of step 3 are step 2's) and halves the scale, as GradScaler, TF's
LossScaleOptimizer and the emulator's scaler do, and training goes on to step 4.

The faults are injected where each backend computes: the batch, a weight or a gradient
hook in torch; the loss op, the optimizer's gradients or its update in the TF graph; the
input of the first kernel, the backward pass's gradients or the weights after an update
in the emulator. The quick run takes an inf gradient on the PyTorch and TF CPU and the
PyTorch emulator, and the skipped step on the PyTorch CPU; RELIABILITY_FULL=1 runs them all.
"""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from tests.reliability.conftest import FULL, mnist_argv, needs, one_error_line, run_main

FAULT_STEP = 3
STEPS = 4
INF = float("inf")


def argv(framework: str, model_dir, data_dir, device: str, *extra: str) -> list[str]:
    return mnist_argv(framework, model_dir, data_dir, f"runconfig.max_steps={STEPS}", "runconfig.checkpoint_steps=1",
                      "runconfig.keep_checkpoint_max=10", "--device", device, *extra)


# --- what a checkpoint holds, per framework -----------------------------------------------

def checkpoint_path(framework: str, model_dir, step: int) -> str:
    return str(model_dir / (f"checkpoint_{step}.mdl" if framework == "pytorch" else f"model.ckpt-{step}"))


def saved_steps(framework: str, model_dir) -> list[int]:
    if framework == "pytorch":
        from common.pytorch.checkpoint import list_checkpoints

        return [step for step, _ in list_checkpoints(str(model_dir))]
    return sorted(int(n[len("model.ckpt-"):-len(".index")]) for n in os.listdir(model_dir)
                  if n.startswith("model.ckpt-") and n.endswith(".index"))


def newest(framework: str, model_dir) -> str | None:
    if framework == "pytorch":
        from common.pytorch.checkpoint import latest_checkpoint

        return latest_checkpoint(str(model_dir))
    from common.tf.estimator import checkpoints

    return checkpoints.latest_checkpoint(str(model_dir))


def tensors(framework: str, path: str) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint (weights, optimizer slots, loss scale), as numpy; whole or it raises."""
    if framework == "pytorch":
        from common.pytorch.checkpoint import load_checkpoint

        state = load_checkpoint(path)
        flat = {f"model/{k}": v.float().numpy() for k, v in state["model"].items()}
        for i, slots in state["optimizer"]["state"].items():
            flat.update({f"optimizer/{i}/{k}": np.asarray(v) for k, v in slots.items()})
        if state.get("scaler"):
            flat["loss_scale"] = np.asarray(state["scaler"]["scale"])
        return flat
    from common.tf.estimator import checkpoints
    from common.weights_io import tf_variables

    assert checkpoints.checkpoint_problem(path) is None
    return tf_variables(path)


def loss_scale(framework: str, state: dict[str, np.ndarray]) -> float:
    return float(state["loss_scale"])


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], skip=("global_step", "loss_scale")) -> bool:
    keys = [k for k in a if not any(s in k for s in skip)]
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in keys)


# --- the faults ---------------------------------------------------------------------------

def on_step(at: int):
    """A counter of training steps: True on the ``at``-th call."""
    calls = [0]

    def now() -> bool:
        calls[0] += 1
        return calls[0] == at

    return now


def torch_fault(monkeypatch, kind: str):
    """Poison step 3 of the torch model's train_step; () -> what the error line names."""
    import torch

    from common.pytorch.base_model import PyTorchBaseModel

    real, now = PyTorchBaseModel.train_step, on_step(FAULT_STEP)
    name = "layers.1.weight"  # the first Linear of mnist's MLP

    def train_step(self, batch):
        if not now():
            return real(self, batch)
        if kind == "input":  # pixels of inf: the logits are inf - inf
            images, labels = batch
            return real(self, (images * INF, labels))
        weight = dict(self.model.named_parameters())[name]
        if kind.startswith("weight"):  # NaN reaches the loss; inf meets a constant pixel and a ReLU, and stays
            with torch.no_grad():
                weight[0, 0] = np.nan if kind == "weight-nan" else INF
            return real(self, batch)
        handle = weight.register_hook(lambda g: torch.full_like(g, INF))  # kind == "gradient"
        try:
            return real(self, batch)
        finally:
            handle.remove()

    monkeypatch.setattr(PyTorchBaseModel, "train_step", train_step)
    named = {"input": "the loss is nan", "weight-nan": "the loss is nan", "weight-inf": f"the weight {name} is inf",
             "gradient": f"the gradient of {name} is inf"}
    return lambda: named[kind]


def tf_fault(monkeypatch, kind: str):
    """Poison step 3 of the TF graph: the loss op, or the optimizer's first gradient."""
    import tensorflow as tf

    from common.tf import optim

    def at_fault(tensor, value):
        step = tf.compat.v1.train.get_or_create_global_step()
        return tf.where(tf.equal(step, FAULT_STEP - 1), tf.fill(tf.shape(tensor), tf.cast(value, tensor.dtype)), tensor)

    if kind == "loss":
        real_loss = tf.nn.sparse_softmax_cross_entropy_with_logits
        monkeypatch.setattr(tf.nn, "sparse_softmax_cross_entropy_with_logits",
                            lambda labels, logits: at_fault(real_loss(labels=labels, logits=logits), np.nan))
        return lambda: "the loss is nan"
    real_build, poisoned = optim.build_optimizer, []

    def build_optimizer(*args, **kwargs):
        optimizer = real_build(*args, **kwargs)
        compute, apply = optimizer.compute_gradients, optimizer.apply_gradients

        def compute_gradients(loss, var_list=None, **kw):
            (g, v), *rest = compute(loss, var_list, **kw)
            poisoned.append(v.op.name)
            return [(at_fault(g, INF), v), *rest]

        def apply_gradients(grads_and_vars, global_step=None, name=None):
            # the update of step 3 leaves a variable inf (as a learning rate far too large would)
            applied = apply(grads_and_vars, global_step=global_step, name=name)
            v = grads_and_vars[0][1]
            poisoned.append(v.op.name)
            with tf.control_dependencies([applied]):
                step = tf.compat.v1.train.get_or_create_global_step()
                hit = tf.equal(step, FAULT_STEP)
                overflow = v.assign(tf.where(hit, tf.fill(tf.shape(v), tf.constant(INF, v.dtype.base_dtype)),
                                             v.read_value()))
            return tf.group(applied, overflow)

        if kind == "gradient":
            optimizer.compute_gradients = compute_gradients
        else:
            optimizer.apply_gradients = apply_gradients
        return optimizer

    monkeypatch.setattr(optim, "build_optimizer", build_optimizer)
    if kind == "gradient":
        return lambda: f"the gradient of {poisoned[0]} is inf"
    return lambda: f"the variable {poisoned[0]} is inf (not saved)"


def emulator_fault(monkeypatch, kind: str):
    """Poison the emulator's step 3: its input kernel's batch (inf pixels), or its gradients."""
    from device.runtime.program import Program

    now = on_step(FAULT_STEP)
    if kind == "weight-inf":  # the update of step 3 leaves a weight inf (as a learning rate far too large would)
        real_step, names = Program.train_step, []

        def train_step(self, batch, lr):
            loss = real_step(self, batch, lr)
            if now():
                names.append(sorted(self._weights)[0])
                self._weights[names[0]][...] = INF
            return loss

        monkeypatch.setattr(Program, "train_step", train_step)
        return lambda: f"{names[0]} is inf"
    if kind == "input":
        real_run = Program._run_plan

        def run_plan(self, env, saved, updates, ctx):
            if ctx.training and now():
                for slot in self._input_slots:
                    if np.issubdtype(env[slot].dtype, np.floating):
                        env[slot] = env[slot] * np.float32(INF)
            return real_run(self, env, saved, updates, ctx)

        monkeypatch.setattr(Program, "_run_plan", run_plan)
        return lambda: "the loss is nan"
    real_backward, names = Program._backward, []

    def backward(self, env, saved, seed):
        grads = real_backward(self, env, saved, seed)
        if now():
            first = sorted(grads)[0]
            names.append(first)
            grads[first] = np.full_like(grads[first], INF)
        return grads

    monkeypatch.setattr(Program, "_backward", backward)
    return lambda: f"the gradient of {names[0]} is inf"


STOPS = [  # (framework, device, fault); the quick run takes the first of each framework and device
    ("pytorch", "cpu", "gradient"), ("tf", "cpu", "gradient"), ("pytorch", "emulator", "gradient"),
    ("tf", "emulator", "loss-input"),
    ("pytorch", "cpu", "input"), ("pytorch", "cpu", "weight-nan"), ("pytorch", "cpu", "weight-inf"),
    ("tf", "cpu", "loss"), ("tf", "cpu", "weight-inf"), ("pytorch", "emulator", "loss-input"),
    ("pytorch", "emulator", "weight-inf"), ("tf", "emulator", "gradient"), ("tf", "emulator", "weight-inf"),
]
QUICK = STOPS[:3]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, mnist_dir):
    """The checkpoints of the same 4 steps, never poisoned, per framework and device."""
    done = {}

    def get(framework: str, device: str):
        if (framework, device) not in done:
            model_dir = tmp_path_factory.mktemp(f"{framework}_{device}") / "model"
            assert run_main(framework, argv(framework, model_dir, mnist_dir, device)) == 0
            done[framework, device] = model_dir
        return done[framework, device]

    return get


def _stopped_line(status: int, err: str) -> str:
    """The one ``error:`` line of a run stopped on a non-finite value (exit 3, no traceback)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert status == 3 and len(errors) == 1, (status, err)
    return errors[0]


@pytest.mark.parametrize("framework,device,fault", STOPS, ids=["-".join(case) for case in STOPS])
def test_a_non_finite_value_stops_the_run_and_keeps_the_last_good_checkpoint(
        framework, device, fault, uninterrupted, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    if not FULL and (framework, device, fault) not in QUICK:
        pytest.skip("RELIABILITY_FULL=1 runs every fault")
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    reference = uninterrupted(framework, device)
    if device == "emulator":
        named = emulator_fault(monkeypatch, "input" if fault == "loss-input" else fault)
    elif framework == "pytorch":
        named = torch_fault(monkeypatch, fault)
    else:
        named = tf_fault(monkeypatch, fault)
    model_dir = tmp_path / "model"
    status = run_main(framework, argv(framework, model_dir, mnist_dir, device))
    err = capsys.readouterr().err
    kept = checkpoint_path(framework, model_dir, FAULT_STEP - 1)
    if framework == "tf":
        kept = os.path.abspath(kept)
    good = (newest(framework, model_dir) == kept and saved_steps(framework, model_dir) == [1, 2]
            and same(tensors(framework, kept), tensors(framework, checkpoint_path(framework, reference, 2)), skip=()))
    ledger.record(f"NaN/inf in the loss, a gradient or a weight, no loss scaling ({framework} mnist, {device})", 1,
                  not good)
    line = _stopped_line(status, err)
    assert f"step {FAULT_STEP}" in line and named() in line and kept in line, line
    assert good, (newest(framework, model_dir), saved_steps(framework, model_dir))


SKIPS = [("pytorch", "cpu"), ("tf", "cpu"), ("pytorch", "emulator"), ("tf", "emulator")]


@pytest.mark.parametrize("framework,device", SKIPS, ids=["-".join(case) for case in SKIPS])
def test_with_dynamic_loss_scaling_an_inf_gradient_skips_the_step_and_halves_the_scale(
        framework, device, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    if not FULL and (framework, device) != ("pytorch", "cpu"):
        pytest.skip("RELIABILITY_FULL=1 runs every backend")
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    # 16-bit compute as each backend has it: bfloat16 on the CPU (float16 needs a GPU there), float16 on the device
    dtype = "bfloat16" if device == "cpu" else "float16"
    extra = ["mixed_precision.enabled=true", f"mixed_precision.dtype={dtype}", "optimizer.loss_scaling_factor=dynamic",
             "optimizer.initial_loss_scale=1024", "optimizer.steps_per_increase=1000"]
    if device == "emulator":
        emulator_fault(monkeypatch, "gradient")
    elif framework == "pytorch":
        torch_fault(monkeypatch, "gradient")
    else:
        tf_fault(monkeypatch, "gradient")
    model_dir = tmp_path / "model"
    status = run_main(framework, argv(framework, model_dir, mnist_dir, device, *extra))
    err = capsys.readouterr().err
    states = {step: tensors(framework, checkpoint_path(framework, model_dir, step)) for step in (2, 3, 4)}
    skipped = same(states[2], states[3]) and not same(states[3], states[4])
    scales = [loss_scale(framework, states[step]) for step in (2, 3, 4)]
    finite = all(np.isfinite(v).all() for v in states[4].values())
    ok = status == 0 and skipped and scales == [1024.0, 512.0, 512.0] and finite
    ledger.record(f"inf gradient under dynamic loss scaling: step skipped, scale halved ({framework} mnist, {device})",
                  1, not ok)
    assert status == 0, err
    assert skipped and finite, "step 3 was applied" if not skipped else "non-finite weights"
    assert scales == [1024.0, 512.0, 512.0], scales
    assert math.isfinite(scales[-1])


@pytest.mark.parametrize("framework,rate", [
    ("pytorch", "1.0e+39"), ("pytorch", ".nan"),
    ("tf", "{scheduler: PiecewiseConstant, values: [0.001, -.inf], boundaries: [2]}")])
def test_a_learning_rate_beyond_float32_is_refused_before_training(framework, rate, mnist_dir, tmp_path, capsys):
    if not FULL and rate != "1.0e+39":
        pytest.skip("RELIABILITY_FULL=1 runs every learning rate")
    status = run_main(framework, argv(framework, tmp_path / "model", mnist_dir, "cpu", f"optimizer.learning_rate={rate}"))
    line = one_error_line(status, capsys.readouterr().err)
    assert line.startswith("error: optimizer.learning_rate: a learning rate of ") and "not a finite float32" in line, line
    assert not (tmp_path / "model").exists() or not saved_steps(framework, tmp_path / "model")
