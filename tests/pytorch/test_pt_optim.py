"""Learning-rate schedules against hand-computed values, optimizers and weight-decay exclusions."""

import math

import pytest
import torch
from torch import nn

from common.errors import UserError
from common.params import COMMON_DEFAULTS, load_params
from common.pytorch.optim import ScheduledLR, build_optimizer, build_schedule


def optimizer_params(**overrides):
    params = load_params(None, {}, [f"optimizer.{k}={v}" for k, v in overrides.items()])
    return params["optimizer"]


def test_constant_number():
    schedule = build_schedule(0.01)
    assert [schedule(s) for s in (0, 1, 10_000)] == [0.01, 0.01, 0.01]


def test_exponential():
    smooth = build_schedule({"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 10,
                             "decay_rate": 0.5})
    assert smooth(0) == pytest.approx(0.1)
    assert smooth(5) == pytest.approx(0.1 * 0.5**0.5)
    assert smooth(20) == pytest.approx(0.025)
    stairs = build_schedule({"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 10,
                             "decay_rate": 0.5, "staircase": True})
    assert [stairs(s) for s in (9, 10, 19, 20)] == pytest.approx([0.1, 0.05, 0.05, 0.025])


def test_piecewise_constant():
    schedule = build_schedule({"scheduler": "PiecewiseConstant", "values": [1.0, 0.5, 0.1], "boundaries": [10, 20]})
    assert [schedule(s) for s in (0, 9, 10, 19, 20, 1000)] == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]


def test_polynomial_and_linear():
    poly = build_schedule({"scheduler": "Polynomial", "initial_learning_rate": 1.0, "end_learning_rate": 0.0,
                           "steps": 10, "power": 2.0})
    assert [poly(s) for s in (0, 5, 10, 15)] == pytest.approx([1.0, 0.25, 0.0, 0.0])
    linear = build_schedule({"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0,
                             "steps": 4})
    assert [linear(s) for s in range(6)] == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.0])


def test_cosine_with_end_or_alpha():
    end = build_schedule({"scheduler": "Cosine", "initial_learning_rate": 1.0, "end_learning_rate": 0.2,
                          "steps": 10})
    assert [end(s) for s in (0, 5, 10, 11)] == pytest.approx([1.0, 0.6, 0.2, 0.2])
    alpha = build_schedule({"scheduler": "Cosine", "initial_learning_rate": 2.0, "alpha": 0.1, "steps": 8})
    assert alpha(2) == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi / 4)))


def test_sequence_runs_each_schedule_for_its_steps():
    schedule = build_schedule([
        {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0, "steps": 10},
        {"scheduler": "Constant", "learning_rate": 0.5, "steps": 5},
        {"scheduler": "Cosine", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 10},
    ])
    assert [schedule(s) for s in (0, 5, 9, 10, 14, 15, 20, 25, 100)] == pytest.approx(
        [0.0, 0.5, 0.9, 0.5, 0.5, 1.0, 0.5, 0.0, 0.0])


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
    assert "schedule" not in state and state["last_epoch"] == 4
    fresh = ScheduledLR(torch.optim.SGD(model.parameters(), lr=0.0), schedule)
    fresh.load_state_dict(state)
    assert fresh.last_epoch == 4


@pytest.mark.parametrize("spec, where", [
    ({"scheduler": "Bogus"}, "optimizer.learning_rate.scheduler"),
    ({"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_rate": 0.5}, "needs 'decay_steps'"),
    ({"scheduler": "Constant", "learning_rate": 0.1, "warmup": 3}, "unknown key 'warmup'"),
    ({"scheduler": "PiecewiseConstant", "values": [1.0, 0.1], "boundaries": [5, 10]}, "one more value"),
    ({"scheduler": "Linear", "initial_learning_rate": 1, "end_learning_rate": 0, "steps": 0},
     "optimizer.learning_rate.steps must be a positive integer"),
    ({"scheduler": "Cosine", "initial_learning_rate": 1, "steps": 5}, "exactly one of"),
    ([{"scheduler": "Constant", "learning_rate": 0.1}, {"scheduler": "Constant", "learning_rate": 0.01}],
     "optimizer.learning_rate[0]: every schedule but the last"),
    ([{"scheduler": "Constant", "learning_rate": 0.1, "steps": 3}, {"scheduler": "Linear"}],
     "optimizer.learning_rate[1]: scheduler Linear needs"),
    ("fast", "optimizer.learning_rate must be"),
])
def test_bad_schedule_names_the_key(spec, where):
    with pytest.raises(UserError) as e:
        build_schedule(spec)
    assert where in str(e.value)


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


def test_common_defaults_are_a_valid_schedule():
    assert build_schedule(COMMON_DEFAULTS["optimizer"]["learning_rate"].default)(0) == 0.001
