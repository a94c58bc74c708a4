"""Learning-rate schedules (common/schedules.py) against hand-computed values, and bad specs."""

import math

import pytest

from common.errors import UserError
from common.schedules import build_schedule


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
