"""device/runtime/optimizers.py against torch.optim, torch's clipping and torch.amp.GradScaler.

The TensorFlow semantics are checked against tf.compat.v1.train in test_kernels_tf.py.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from common.errors import UserError  # noqa: E402
from device.optimizer import SEMANTICS, OptimizerSpec  # noqa: E402
from device.runtime.optimizers import LossScaler, Optimizer, clip_by_global_norm  # noqa: E402

SHAPES = {"layer.weight": (4, 3), "layer.bias": (4,), "norm.weight": (3,)}
STEPS = 20


def _random_params(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}


def _random_grads(rng, scale=1.0):
    return {name: (scale * rng.standard_normal(shape)).astype(np.float32) for name, shape in SHAPES.items()}


def _lr(step):  # a schedule: the runner passes the learning rate each step
    return 0.01 * (1.0 + 0.5 * (step % 3))


def _compare_with_torch(spec, make_torch, clip=None, excluded=()):
    """Run ``spec`` and a torch optimizer side by side for STEPS steps on the same gradients."""
    params = _random_params()
    tensors = {name: torch.tensor(p.copy(), requires_grad=True) for name, p in params.items()}
    decayed = [t for name, t in tensors.items() if not any(e in name for e in excluded)]
    kept = [t for name, t in tensors.items() if any(e in name for e in excluded)]
    groups = [{"params": decayed}] + ([{"params": kept, "weight_decay": 0.0}] if kept else [])
    torch_opt = make_torch(groups)
    ours = Optimizer(spec, params)
    rng = np.random.default_rng(1)
    for step in range(STEPS):
        grads = _random_grads(rng)
        assert ours.apply_gradients(params, grads, _lr(step))
        for name, t in tensors.items():
            t.grad = torch.tensor(grads[name])
        if clip:
            clip(list(tensors.values()))
        for group in torch_opt.param_groups:
            group["lr"] = _lr(step)
        torch_opt.step()
        for name, t in tensors.items():
            np.testing.assert_allclose(params[name], t.detach().numpy(), rtol=1e-6, atol=1e-7,
                                       err_msg=f"{name} after step {step + 1}")
    assert ours.step_count == STEPS


def spec(kind, clip_norm=None, clip_value=None, exclude=(), **hyper):
    return OptimizerSpec(kind, "torch", hyper, weight_decay_exclude=tuple(exclude),
                         max_gradient_norm=clip_norm, max_gradient_value=clip_value)


@pytest.mark.parametrize("name, ours, make_torch, clip, excluded", [
    ("sgd", spec("sgd"), lambda g: torch.optim.SGD(g, lr=0.1), None, ()),
    ("sgd-l2", spec("sgd", weight_decay=0.05), lambda g: torch.optim.SGD(g, lr=0.1, weight_decay=0.05), None, ()),
    ("sgd-l2-1", spec("sgd", weight_decay=1.0), lambda g: torch.optim.SGD(g, lr=0.1, weight_decay=1.0), None, ()),
    ("momentum", spec("momentum", momentum=0.9), lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9), None, ()),
    ("nesterov", spec("momentum", momentum=0.8, nesterov=True),
     lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.8, nesterov=True), None, ()),
    ("momentum-l2-excluded", spec("momentum", momentum=0.9, weight_decay=0.01, exclude=["bias"]),
     lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, weight_decay=0.01), None, ("bias",)),
    ("adam", spec("adam", beta1=0.9, beta2=0.999, eps=1e-8), lambda g: torch.optim.Adam(g, lr=0.1), None, ()),
    ("adam-l2", spec("adam", beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1),
     lambda g: torch.optim.Adam(g, lr=0.1, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1), None, ()),
    ("adamw-excluded", spec("adamw", weight_decay=0.1, exclude=["bias", "norm."]),
     lambda g: torch.optim.AdamW(g, lr=0.1, weight_decay=0.1), None, ("bias", "norm.")),
    ("adam-clip-norm", spec("adam", clip_norm=0.5), lambda g: torch.optim.Adam(g, lr=0.1),
     lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.5), ()),
    ("sgd-clip-value", spec("sgd", clip_value=0.3), lambda g: torch.optim.SGD(g, lr=0.1),
     lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.3), ()),
])
def test_matches_torch_over_20_steps(name, ours, make_torch, clip, excluded):
    _compare_with_torch(ours, make_torch, clip, excluded)


def test_dynamic_loss_scale_follows_torch_grad_scaler():
    finite_steps = [True, True, True, False, True, True, True, True, False, False, True]
    spec_ = OptimizerSpec("sgd", "torch", {}, loss_scale="dynamic", initial_loss_scale=16.0, steps_per_increase=3)
    params = _random_params()
    ours = Optimizer(spec_, params)
    tensor = {name: torch.tensor(p.copy(), requires_grad=True) for name, p in params.items()}
    torch_opt = torch.optim.SGD(list(tensor.values()), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0, growth_interval=3)
    rng = np.random.default_rng(2)
    for finite in finite_steps:
        grads = _random_grads(rng)
        scaled = {name: g * np.float32(ours.loss_scale) for name, g in grads.items()}
        if not finite:
            scaled["layer.bias"][1] = np.inf
        before = {name: p.copy() for name, p in params.items()}
        applied = ours.apply_gradients(params, scaled, 0.1)
        assert applied == finite
        if not finite:  # a skipped step leaves every weight alone
            for name in params:
                np.testing.assert_array_equal(params[name], before[name])
        scaler.scale(torch.ones(()))  # GradScaler creates its scale lazily
        for name, t in tensor.items():
            t.grad = torch.tensor(scaled[name])
        scaler.step(torch_opt)
        scaler.update()
        assert ours.loss_scale == scaler.get_scale()
        for name, t in tensor.items():
            np.testing.assert_allclose(params[name], t.detach().numpy(), rtol=1e-6, atol=1e-7)
    assert ours.step_count == sum(finite_steps)


def test_loss_scale_stays_within_bounds():
    scaler = LossScaler(OptimizerSpec("sgd", "torch", loss_scale="dynamic", initial_loss_scale=2.0,
                                      steps_per_increase=1, min_loss_scale=1.0, max_loss_scale=8.0))
    scales = []
    for finite in [False, False, False, True, True, True, True]:
        scaler.update(finite)
        scales.append(scaler.scale)
    assert scales == [1.0, 1.0, 1.0, 2.0, 4.0, 8.0, 8.0]


def test_static_loss_scale_unscales_and_keeps_its_value():
    params = _random_params()
    plain = {name: p.copy() for name, p in params.items()}
    ours = Optimizer(OptimizerSpec("sgd", "torch", loss_scale=128.0), params)
    reference = Optimizer(OptimizerSpec("sgd", "torch"), plain)
    grads = _random_grads(np.random.default_rng(3))
    ours.apply_gradients(params, {n: g * np.float32(128.0) for n, g in grads.items()}, 0.1)
    reference.apply_gradients(plain, grads, 0.1)
    for name in params:
        np.testing.assert_allclose(params[name], plain[name], rtol=1e-7)
    assert ours.loss_scale == 128.0


def test_gradients_are_not_modified_and_missing_ones_are_skipped():
    params = _random_params()
    frozen = params["norm.weight"].copy()
    ours = Optimizer(OptimizerSpec("adam", "torch", {}, max_gradient_norm=0.1, loss_scale=4.0), params)
    grads = _random_grads(np.random.default_rng(4))
    del grads["norm.weight"]
    copies = {name: g.copy() for name, g in grads.items()}
    ours.apply_gradients(params, grads, 0.1)
    for name in grads:
        np.testing.assert_array_equal(grads[name], copies[name])
    np.testing.assert_array_equal(params["norm.weight"], frozen)


@pytest.mark.parametrize("kind, semantics", [("adam", "tf"), ("adamw", "torch"), ("momentum", "tf")])
def test_state_dict_round_trip_continues_identically(kind, semantics):
    spec_ = OptimizerSpec(kind, semantics, {"momentum": 0.9, "weight_decay": 0.01}, loss_scale="dynamic")
    rng = np.random.default_rng(5)
    grads = [_random_grads(rng, 1000.0) for _ in range(10)]
    params = _random_params()
    first = Optimizer(spec_, params)
    for g in grads[:5]:
        first.apply_gradients(params, g, 0.01)
    state = first.state_dict()
    assert state["step"] == 5 and state["loss_scale"] == 2.0**15
    assert set(state["layer.weight"]) == ({"momentum"} if kind == "momentum" else {"m", "v"})
    resumed_params = {name: p.copy() for name, p in params.items()}
    resumed = Optimizer(spec_, resumed_params)
    resumed.load_state_dict(state)
    for g in grads[5:]:
        first.apply_gradients(params, g, 0.01)
        resumed.apply_gradients(resumed_params, g, 0.01)
    for name in params:
        np.testing.assert_array_equal(params[name], resumed_params[name])


def test_dynamic_loss_scale_resumes_mid_way_to_its_next_increase():
    """The finite steps counted towards the next doubling are state: a run resumed after 2 of
    3 doubles its scale on the next step, as the uninterrupted run does (GradScaler's growth tracker)."""
    spec_ = OptimizerSpec("sgd", "torch", {}, loss_scale="dynamic", initial_loss_scale=16.0, steps_per_increase=3)
    grads = [_random_grads(np.random.default_rng(6)) for _ in range(4)]
    params = _random_params()
    first = Optimizer(spec_, params)
    for g in grads[:2]:
        first.apply_gradients(params, g, 0.1)
    state = first.state_dict()
    assert state["loss_scale"] == 16.0 and state["loss_scale_good_steps"] == 2
    resumed_params = {name: p.copy() for name, p in params.items()}
    resumed = Optimizer(spec_, resumed_params)
    resumed.load_state_dict(state)
    scales = []
    for g in grads[2:]:
        first.apply_gradients(params, {n: a * np.float32(first.loss_scale) for n, a in g.items()}, 0.1)
        resumed.apply_gradients(resumed_params, {n: a * np.float32(resumed.loss_scale) for n, a in g.items()}, 0.1)
        scales.append((first.loss_scale, resumed.loss_scale))
    assert scales == [(32.0, 32.0), (32.0, 32.0)]
    for name in params:
        np.testing.assert_array_equal(params[name], resumed_params[name])


@pytest.mark.parametrize("spec_, message", [
    (OptimizerSpec("lamb", "torch"), "optimizer kind 'lamb' is not supported; expected one of "
                                     "('sgd', 'momentum', 'adam', 'adamw')"),
    (OptimizerSpec("adam", "jax"), "optimizer semantics 'jax' is unknown; expected one of ('torch', 'tf')"),
    (OptimizerSpec("momentum", "torch", {}), "optimizer 'momentum' needs the hyper-parameter 'momentum'"),
    (OptimizerSpec("sgd", "torch", loss_scale="auto"), "loss_scale must be a positive number or 'dynamic', got 'auto'"),
    (OptimizerSpec("sgd", "torch", loss_scale=-1.0), "loss_scale must be a positive number or 'dynamic', got -1.0"),
    (OptimizerSpec("sgd", "torch", loss_scale=0.0), "loss_scale must be a positive number or 'dynamic', got 0.0"),
])
def test_bad_specs_are_user_errors(spec_, message):
    with pytest.raises(UserError) as error:
        Optimizer(spec_, _random_params())
    assert str(error.value) == message


def test_a_static_loss_scale_below_one_is_a_scale():
    assert Optimizer(OptimizerSpec("sgd", "torch", loss_scale=0.5), _random_params()).loss_scale == 0.5


def test_adamw_decays_the_weight_as_torch_rounds_it():
    """With zero gradients AdamW only decays, p *= 1 - lr * wd: bit for bit torch's rounding
    (TF's p -= p * wd * lr rounds otherwise, test_kernels_tf.py)."""
    params = {"w": np.random.default_rng(8).standard_normal(1000).astype(np.float32)}
    tensor = torch.tensor(params["w"].copy(), requires_grad=True)
    torch_opt = torch.optim.AdamW([tensor], lr=0.1, weight_decay=0.3)
    ours = Optimizer(OptimizerSpec("adamw", "torch", {"weight_decay": 0.3}), params)
    for _ in range(3):
        ours.apply_gradients(params, {"w": np.zeros(1000, np.float32)}, 0.1)
        tensor.grad = torch.zeros(1000)
        torch_opt.step()
    np.testing.assert_array_equal(params["w"], tensor.detach().numpy())


def test_global_norm_clipping_of_small_gradients_follows_torch():
    """Gradients of norm 1e-3: torch's 1e-6 added to the norm shows at 1e-3 relative; below
    max_norm the gradients pass unchanged."""
    grads = _random_grads(np.random.default_rng(9), scale=3e-4)
    for max_norm in (1e-4, 1.0):
        tensors = [torch.tensor(g.copy(), requires_grad=True) for g in grads.values()]
        for t, g in zip(tensors, grads.values()):
            t.grad = torch.tensor(g)
        torch.nn.utils.clip_grad_norm_(tensors, max_norm)
        clipped = clip_by_global_norm(grads, max_norm, "torch")
        for got, t in zip(clipped.values(), tensors):
            np.testing.assert_allclose(got, t.grad.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(clipped["layer.weight"], grads["layer.weight"])


def test_clipping_zero_gradients_gives_zeros_without_warnings():
    zeros = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # TF's 1 / 0 = inf is part of its formula, not a problem
        for semantics in SEMANTICS:
            for name, g in clip_by_global_norm(zeros, 1.0, semantics).items():
                np.testing.assert_array_equal(g, zeros[name])


def test_load_state_dict_names_a_missing_parameter():
    ours = Optimizer(OptimizerSpec("adam", "torch"), _random_params())
    state = ours.state_dict()
    del state["layer.bias"]
    with pytest.raises(UserError, match="layer.bias"):
        ours.load_state_dict(state)


@pytest.mark.parametrize("change, message", [
    (lambda s: s["layer.bias"].pop("v"), "optimizer state 'layer.bias'['v']: expected shape (4,), got None"),
    (lambda s: s["layer.bias"].update(v=np.zeros(3)), "optimizer state 'layer.bias'['v']: expected shape (4,), got (3,)"),
])
def test_load_state_dict_names_a_missing_or_misshapen_slot(change, message):
    ours = Optimizer(OptimizerSpec("adam", "torch"), _random_params())
    state = ours.state_dict()
    change(state)
    with pytest.raises(UserError) as error:
        ours.load_state_dict(state)
    assert str(error.value) == message


def test_a_state_without_a_step_or_a_count_of_finite_steps_starts_them_at_zero():
    """What a checkpoint without them means (an SGD state from torch has no step): a fresh count."""
    spec_ = OptimizerSpec("adam", "torch", {}, loss_scale="dynamic", initial_loss_scale=8.0, steps_per_increase=1)
    params, fresh_params = _random_params(), _random_params()
    ours, fresh = Optimizer(spec_, params), Optimizer(spec_, fresh_params)
    state = ours.state_dict()
    del state["step"], state["loss_scale_good_steps"]
    state["loss_scale"] = 8.0
    ours.load_state_dict(state)
    assert ours.step_count == 0 and ours.scaler.good_steps == 0
    grads = _random_grads(np.random.default_rng(10))
    ours.apply_gradients(params, grads, 0.1)
    fresh.apply_gradients(fresh_params, grads, 0.1)
    for name in params:  # the same first Adam step (its bias correction counts from the step)
        np.testing.assert_array_equal(params[name], fresh_params[name])
    assert ours.loss_scale == fresh.loss_scale == 16.0


def test_without_a_weight_decay_setting_nothing_decays():
    assert not OptimizerSpec("adamw", "torch", {"lr": 0.1}).decays("layer.weight")
    assert OptimizerSpec("adamw", "torch", {"weight_decay": 0.1}).decays("layer.weight")


def test_nesterov_rounds_in_the_order_of_its_framework():
    """torch: p - lr * (g + m * buf); TF's ApplyMomentum: p - (g * lr + buf * m * lr), in float32.
    The two orders differ in the last bit for some elements: each semantics keeps its own."""
    rng = np.random.default_rng(0)
    p0, g = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal((64, 32)).astype(np.float32)
    lr, m = np.float32(0.1), np.float32(0.8)
    buf = g  # the first step: buf = m * 0 + g
    expected = {"torch": p0 - lr * (g + m * buf), "tf": p0 - (g * lr + buf * m * lr)}
    assert (expected["torch"] != expected["tf"]).any()
    for semantics, want in expected.items():
        params = {"w": p0.copy()}
        Optimizer(OptimizerSpec("momentum", semantics, {"momentum": 0.8, "nesterov": True}), params).step(
            params, {"w": g}, 0.1)
        np.testing.assert_array_equal(params["w"], want, err_msg=semantics)


def test_without_loss_scaling_a_non_finite_gradient_is_refused_by_name_and_value():
    from zoo_base.errors import NonFiniteGradient

    params = _random_params()
    before = {name: p.copy() for name, p in params.items()}
    ours = Optimizer(spec("sgd"), params)
    grads = _random_grads(np.random.default_rng(6))
    grads["layer.bias"] = np.array([1.0, np.inf, np.nan, -np.inf], np.float32)  # the first non-finite: inf
    with pytest.raises(NonFiniteGradient) as info:
        ours.apply_gradients(params, grads, 0.1)
    assert str(info.value) == "the gradient of layer.bias is inf"
    assert (info.value.name, info.value.value) == ("layer.bias", np.inf)
    for name in params:
        np.testing.assert_array_equal(params[name], before[name])
    assert ours.step_count == 0
