"""The torch LR scheduler, optimizers and weight-decay exclusions."""

import numpy as np
import pytest
import torch
from torch import nn

from common.errors import UserError
from common.params import COMMON_DEFAULTS, load_params
from common.pytorch.optim import ScheduledLR, build_optimizer
from common.schedules import build_schedule


def optimizer_params(**overrides):
    params = load_params(None, {}, [f"optimizer.{k}={v}" for k, v in overrides.items()])
    return params["optimizer"]


def test_scheduled_lr_sets_the_optimizer_lr_and_keeps_only_the_step_as_state():
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    schedule = build_schedule({"scheduler": "PiecewiseConstant", "values": [1.0, 0.1], "boundaries": [2]})
    scheduler = ScheduledLR(optimizer, schedule)
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == [1.0, 1.0, 0.1, 0.1]
    state = scheduler.state_dict()
    assert "schedule" not in state and "optimizer" not in state and state["last_epoch"] == 4
    fresh = ScheduledLR(torch.optim.SGD(model.parameters(), lr=0.0), schedule)
    fresh.load_state_dict(state)
    assert fresh.last_epoch == 4


def test_set_step_continues_the_schedule_from_a_step_taken_elsewhere():
    """After steps on the emulator, the torch side's lr is the schedule's at that step."""
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.0)
    optimizer.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})
    scheduler = ScheduledLR(optimizer, build_schedule({"scheduler": "PiecewiseConstant", "values": [1.0, 0.1, 0.01],
                                                       "boundaries": [2, 5]}))
    scheduler.set_step(5)
    assert scheduler.last_epoch == 5 and scheduler.get_last_lr() == [0.01, 0.01]
    assert [group["lr"] for group in optimizer.param_groups] == [0.01, 0.01]
    optimizer.step()  # no gradients: nothing moves
    scheduler.step()
    assert scheduler.last_epoch == 6 and optimizer.param_groups[1]["lr"] == 0.01


def test_schedule_from_the_params_path():
    params = load_params(None, {}, ["optimizer.learning_rate={scheduler: Linear, initial_learning_rate: 1.0, "
                                    "end_learning_rate: 0.0, steps: 2}"])
    schedule = build_schedule(params["optimizer"]["learning_rate"])  # frozen mapping
    assert [schedule(s) for s in range(3)] == [1.0, 0.5, 0.0]


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 3)
        self.norm = nn.LayerNorm(3)


def test_adamw_excludes_biases_and_norms_from_weight_decay():
    torch.manual_seed(0)
    model = Block()
    optimizer = build_optimizer(model, optimizer_params(optimizer_type="adamw", weight_decay=0.5))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.5 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(model.linear.weight)]
    assert {id(p) for p in no_decay["params"]} == {id(model.linear.bias), id(model.norm.weight),
                                                   id(model.norm.bias)}
    # a step with zero gradients: AdamW decays the weight only (decoupled), the rest stay
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for group in optimizer.param_groups:
        group["lr"] = 0.1
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert torch.allclose(model.linear.weight, before["linear.weight"] * (1 - 0.1 * 0.5))
    for name in ("linear.bias", "norm.weight", "norm.bias"):
        assert torch.equal(dict(model.named_parameters())[name], before[name])


@pytest.mark.parametrize("kind, cls", [("sgd", torch.optim.SGD), ("momentum", torch.optim.SGD),
                                       ("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_optimizer_types(kind, cls):
    optimizer = build_optimizer(nn.Linear(2, 2), optimizer_params(optimizer_type=kind, momentum=0.8))
    assert type(optimizer) is cls
    if kind == "momentum":
        assert optimizer.param_groups[0]["momentum"] == 0.8
    if kind == "sgd":
        assert optimizer.param_groups[0]["momentum"] == 0


def test_without_weight_decay_one_group_and_frozen_parameters_are_left_out():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    model[0].weight.requires_grad_(False)  # frozen, and the first parameter
    (group,) = build_optimizer(model, optimizer_params(optimizer_type="sgd", weight_decay=0.0)).param_groups
    assert group["weight_decay"] == 0.0
    assert [id(p) for p in group["params"]] == [id(model[0].bias), id(model[1].weight), id(model[1].bias)]
    decay, no_decay = build_optimizer(model, optimizer_params(optimizer_type="sgd", weight_decay=1.0)).param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (1.0, 0.0)
    assert [id(p) for p in decay["params"]] == [id(model[1].weight)]
    assert [id(p) for p in no_decay["params"]] == [id(model[0].bias), id(model[1].bias)]


def test_no_trainable_parameters_and_an_unknown_type_are_user_errors():
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(UserError) as error:
        build_optimizer(frozen, optimizer_params())
    assert str(error.value) == "optimizer: the model has no trainable parameters"
    with pytest.raises(UserError) as error:  # params refuse it first; a mapping built by hand gets this
        build_optimizer(nn.Linear(2, 2), {**optimizer_params(), "optimizer_type": "lamb"})
    assert str(error.value) == "optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got 'lamb'"


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_follows_its_momentum_and_nesterov(nesterov):
    """Two steps against SGD with momentum written out in numpy (torch's form)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, optimizer_params(optimizer_type="momentum", momentum=0.5, nesterov=nesterov))
    optimizer.param_groups[0]["lr"] = 0.1
    weight = model.weight.detach().numpy().astype(np.float64)
    buf = np.zeros_like(weight)
    rng = np.random.default_rng(1)
    for _ in range(2):
        g = rng.standard_normal(weight.shape)
        model.weight.grad, model.bias.grad = torch.tensor(g, dtype=torch.float32), torch.zeros(2)
        optimizer.step()
        buf = 0.5 * buf + g
        weight = weight - 0.1 * (g + 0.5 * buf if nesterov else buf)
    np.testing.assert_allclose(model.weight.detach().numpy(), weight, rtol=1e-5)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_follows_its_betas_and_epsilon(kind):
    """Three steps of changing gradients against Adam written out in numpy (torch's form: eps
    added to the bias-corrected sqrt(v)). Betas and an epsilon far from the defaults: with the
    defaults, or with a constant gradient, every step would be about lr x sign(g) whatever they are."""
    b1, b2, eps, lr, wd = 0.5, 0.7, 0.05, 0.1, 0.2
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, optimizer_params(optimizer_type=kind, beta1=b1, beta2=b2, epsilon=eps,
                                                        weight_decay=wd, weight_decay_exclude=[]))
    for group in optimizer.param_groups:
        group["lr"] = lr
    weight = model.weight.detach().numpy().astype(np.float64)
    m, v = np.zeros_like(weight), np.zeros_like(weight)
    rng = np.random.default_rng(0)
    for t in range(1, 4):
        g = rng.standard_normal(weight.shape)
        model.weight.grad = torch.tensor(g, dtype=torch.float32)
        model.bias.grad = torch.zeros_like(model.bias)
        optimizer.step()
        if kind == "adamw":
            weight = weight * (1 - lr * wd)  # decoupled
        else:
            g = g + wd * weight  # coupled L2
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        weight = weight - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        np.testing.assert_allclose(model.weight.detach().numpy(), weight, rtol=1e-5, err_msg=f"step {t}")


def test_common_defaults_are_a_valid_schedule():
    assert build_schedule(COMMON_DEFAULTS["optimizer"]["learning_rate"].default)(0) == 0.001


@pytest.mark.parametrize("kind", ["sgd", "momentum", "adam", "adamw"])
def test_the_learning_rate_is_zero_until_the_schedule_sets_it(kind):
    """A step before ScheduledLR sets the rate moves nothing (not torch's default lr, 1e-3)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, optimizer_params(optimizer_type=kind, weight_decay=0.0))
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def test_adamw_without_weight_decay_does_not_decay():
    """One group without weight decay: its 0 is explicit (torch's AdamW would decay by 0.01)."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = build_optimizer(model, optimizer_params(optimizer_type="adamw", weight_decay=0.0))
    optimizer.param_groups[0]["lr"] = 0.1
    before = [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
