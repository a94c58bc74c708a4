"""The same optimizer settings give the same updates on the emulator and in both runners.

device/optimizer.py states the semantics once: weight-decay exclusion by case-insensitive
substring, clipping by value then by global norm when both are given, static and dynamic
loss scaling that skips a non-finite step. Here one settings table (the keys of params'
``optimizer`` section) drives three optimizers on the same gradients, step by step:

    the PyTorch runner   PyTorchBaseModel.train_step (common/pytorch/): its optimizer,
                         clipping and loss scaling, on a module whose loss is sum(p * g)
    the TF runner        build_train_op (common/tf/optim.py), on variables with the same loss
    the emulator         device/runtime/optimizers.py's Optimizer on an OptimizerSpec of the
                         settings, fed the loss-scaled gradients as Program.train_step feeds them

The loss sum(p * g) makes each step's gradient exactly the g given (a power-of-two loss
scale is exact too), so any difference is the optimizers'. Parameter names mix case so
that an exclusion only a case-insensitive match finds is exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

from device.optimizer import OptimizerSpec, excluded_from_weight_decay
from device.runtime.optimizers import Optimizer

STEPS = 6
OVERFLOW_STEP = 2  # loss-scaling cases: this step's gradient has an inf, the step is skipped
LR = 0.05
# the same parameters as torch (module attributes) and TF (variable names) name them
SHAPES = {"dense": (4, 3), "bias": (3,), "LayerNorm": (3,)}
TORCH_NAMES = {"dense": "Dense.weight", "bias": "Dense.bias", "LayerNorm": "LayerNorm.weight"}
TF_NAMES = {"dense": "dense/kernel", "bias": "dense/BIAS", "LayerNorm": "LayerNorm/gamma"}
EXCLUDE = ["Bias", "norm"]  # matches Dense.bias, dense/BIAS, LayerNorm* only ignoring case

CASES = {
    "sgd-l2-exclusions": {"optimizer_type": "sgd", "weight_decay": 0.1},
    "nesterov-norm-clip": {"optimizer_type": "momentum", "momentum": 0.9, "nesterov": True, "max_gradient_norm": 0.5},
    "momentum-l2-norm-clip": {"optimizer_type": "momentum", "momentum": 0.9, "weight_decay": 0.05,
                              "max_gradient_norm": 0.5},
    "adam-value-clip": {"optimizer_type": "adam", "max_gradient_value": 0.3},
    "adamw-both-clips": {"optimizer_type": "adamw", "weight_decay": 0.2, "max_gradient_value": 0.4,
                         "max_gradient_norm": 0.6},
    "sgd-static-loss-scale": {"optimizer_type": "sgd", "loss_scaling_factor": 8.0},
    "adam-dynamic-loss-scale": {"optimizer_type": "adam", "loss_scaling_factor": "dynamic",
                                "initial_loss_scale": 16.0, "steps_per_increase": 2},
}

def settings(case: str) -> dict:
    return {"learning_rate": LR, "weight_decay_exclude": EXCLUDE, **CASES[case]}


def loss_scaled(case: str) -> bool:
    return "loss_scaling_factor" in CASES[case]


def params_of(case: str) -> dict:
    from common.params import load_params  # the runners' params: defaults filled in, validated

    mixed = {"mixed_precision": {"enabled": True, "dtype": "bfloat16"}} if loss_scaled(case) else {}
    return load_params(None, {"optimizer": settings(case), **mixed})


def spec_of(params: dict, semantics: str) -> OptimizerSpec:
    """The emulator's spec of the runners' optimizer settings."""
    p = params["optimizer"]
    factor = p["loss_scaling_factor"]
    return OptimizerSpec(
        p["optimizer_type"], semantics,
        {"lr": LR, "momentum": p["momentum"], "nesterov": p["nesterov"], "beta1": p["beta1"], "beta2": p["beta2"],
         "eps": p["epsilon"], "weight_decay": p["weight_decay"]},
        weight_decay_exclude=tuple(p["weight_decay_exclude"]), max_gradient_norm=p["max_gradient_norm"],
        max_gradient_value=p["max_gradient_value"], loss_scale=None if factor == 1.0 else factor,
        initial_loss_scale=p["initial_loss_scale"], steps_per_increase=p["steps_per_increase"])


def initial_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {key: rng.standard_normal(shape).astype(np.float32) for key, shape in SHAPES.items()}


def gradient_steps(case: str) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    steps = [{key: rng.standard_normal(shape).astype(np.float32) for key, shape in SHAPES.items()}
             for _ in range(STEPS)]
    if loss_scaled(case):
        steps[OVERFLOW_STEP]["dense"][0, 0] = np.inf
    return steps


def run_emulator(case: str, names: dict[str, str], semantics: str) -> list[tuple[dict, float]]:
    """(weights by key, loss scale) after each step."""
    weights = {names[key]: w.copy() for key, w in initial_weights().items()}
    optimizer = Optimizer(spec_of(params_of(case), semantics), weights)
    trace = []
    for grads in gradient_steps(case):
        scale = np.float32(optimizer.loss_scale)  # Program.train_step seeds the backward with it
        optimizer.apply_gradients(weights, {names[key]: g * scale for key, g in grads.items()}, LR)
        trace.append(({key: weights[names[key]].copy() for key in SHAPES}, optimizer.loss_scale))
    return trace


def assert_same_trace(got, expected):
    for step, ((got_weights, got_scale), (want_weights, want_scale)) in enumerate(zip(got, expected)):
        for key in SHAPES:
            np.testing.assert_allclose(got_weights[key], want_weights[key], rtol=2e-6, atol=1e-7,
                                       err_msg=f"{key} after step {step + 1}")
        assert got_scale == want_scale, f"loss scale after step {step + 1}"


def test_exclusion_ignores_case():
    assert excluded_from_weight_decay("encoder/LayerNorm/gamma", ["layernorm"])
    assert excluded_from_weight_decay("fc.BIAS", ["bias"]) and not excluded_from_weight_decay("fc.weight", ["bias"])
    spec = OptimizerSpec("adamw", "torch", {"weight_decay": 0.1}, weight_decay_exclude=("Norm",))
    assert not spec.decays("bn.NORM.weight") and spec.decays("fc.weight")
    assert not OptimizerSpec("adamw", "torch", {}).decays("fc.weight")  # no weight decay at all


@pytest.mark.parametrize("case", CASES)
def test_pytorch_runner_and_emulator_give_the_same_updates(case):
    torch = pytest.importorskip("torch")
    from common.pytorch.base_model import PyTorchBaseModel
    from zoo_base.errors import UserError

    class Parameters(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for key, value in initial_weights().items():
                module, name = TORCH_NAMES[key].split(".")
                if not hasattr(self, module):
                    self.add_module(module, torch.nn.Module())
                getattr(self, module).register_parameter(name, torch.nn.Parameter(torch.tensor(value)))

    class GradientFeed(PyTorchBaseModel):
        """loss = sum(p * g): the batch is each parameter's gradient."""

        def __call__(self, batch):
            with torch.autocast("cpu", enabled=False):  # the gradient is g exactly, in fp32
                named = dict(self.model.named_parameters())
                return sum((named[TORCH_NAMES[key]] * g).sum() for key, g in zip(SHAPES, batch))

    params = params_of(case)
    try:
        model = GradientFeed(params, Parameters(), "cpu")
    except UserError as error:  # the PyTorch runner may refuse a combination; then it says which
        assert "max_gradient_norm" in str(error) and "max_gradient_value" in str(error)
        pytest.skip(f"the PyTorch runner refuses {case}: {error}")
    trace = []
    for grads in gradient_steps(case):
        model.train_step([torch.tensor(grads[key]) for key in SHAPES])
        named = dict(model.model.named_parameters())
        scale = model.loss_scale()
        trace.append(({key: named[TORCH_NAMES[key]].detach().numpy().copy() for key in SHAPES},
                      1.0 if scale is None else scale))
    assert_same_trace(trace, run_emulator(case, TORCH_NAMES, "torch"))


@pytest.mark.parametrize("case", CASES)
def test_tf_runner_and_emulator_give_the_same_updates(case):
    tf = pytest.importorskip("tensorflow")
    from common.tf.optim import LOSS_SCALE_COLLECTION, build_train_op

    graph = tf.Graph()
    with graph.as_default():
        variables = {key: tf.compat.v1.Variable(value, name=TF_NAMES[key]) for key, value in initial_weights().items()}
        feeds = {key: tf.compat.v1.placeholder(tf.float32, shape, name=f"g_{key}") for key, shape in SHAPES.items()}
        loss = tf.add_n([tf.reduce_sum(variables[key] * feeds[key]) for key in SHAPES])
        train_op = build_train_op(loss, params_of(case))
        scale = graph.get_collection(LOSS_SCALE_COLLECTION)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            trace = []
            for grads in gradient_steps(case):
                session.run(train_op, {feeds[key]: g for key, g in grads.items()})
                weights = session.run(variables)
                trace.append((weights, float(session.run(scale[0])) if scale else 1.0))
    assert_same_trace(trace, run_emulator(case, TF_NAMES, "tf"))
