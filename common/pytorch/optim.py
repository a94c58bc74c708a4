"""Optimizers and learning-rate schedules built from ``params["optimizer"]``.

    optimizer:
      optimizer_type: adamw          # sgd | momentum | adam | adamw
      learning_rate:                 # a number, one schedule, or a list run in sequence
        - {scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.001, steps: 100}
        - {scheduler: Cosine, initial_learning_rate: 0.001, end_learning_rate: 0.0, steps: 900}
      weight_decay: 0.01
      weight_decay_exclude: [bias, norm]

A schedule is a pure function of the step (the number of optimizer steps already taken),
so the CPU runner and the emulator read the same learning rate for the same step. The
fields mirror the reference zoo's:

    Constant(learning_rate)
    Exponential(initial_learning_rate, decay_steps, decay_rate, staircase=False)
        lr = initial * decay_rate ** (step / decay_steps)   (the exponent floored if staircase)
    PiecewiseConstant(values, boundaries)
        lr = values[i] for boundaries[i-1] <= step < boundaries[i]   (len(values) = len(boundaries) + 1)
    Polynomial(initial_learning_rate, end_learning_rate, steps, power=1.0)   (Linear: power 1)
        lr = (initial - end) * (1 - min(step, steps) / steps) ** power + end
    Cosine(initial_learning_rate, end_learning_rate | alpha, steps)   (alpha: end = alpha * initial)
        lr = end + (initial - end) * (1 + cos(pi * min(step, steps) / steps)) / 2

Every schedule also takes ``steps``: in a list, each entry but the last must give it, and
the next entry starts (from its own step 0) when it ends.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from common.errors import UserError

# scheduler name -> (required fields, optional fields with their defaults)
_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "constant": (("learning_rate",), {"steps": None}),
    "exponential": (("initial_learning_rate", "decay_steps", "decay_rate"), {"staircase": False, "steps": None}),
    "piecewiseconstant": (("values", "boundaries"), {"steps": None}),
    "polynomial": (("initial_learning_rate", "end_learning_rate", "steps"), {"power": 1.0}),
    "linear": (("initial_learning_rate", "end_learning_rate", "steps"), {}),
    "cosine": (("initial_learning_rate", "steps"), {"end_learning_rate": None, "alpha": None}),
}
SCHEDULERS = ("Constant", "Exponential", "PiecewiseConstant", "Polynomial", "Linear", "Cosine")


@dataclass(frozen=True)
class Segment:
    """One schedule: ``fn(local_step) -> lr``, lasting ``steps`` (None: to the end of training)."""

    fn: Callable[[int], float]
    steps: int | None


class Schedule:
    """A learning rate per step: one number, or segments run in sequence."""

    def __init__(self, segments: Sequence[Segment]):
        self.segments = tuple(segments)
        self._starts = []  # the global step at which each segment after the first starts
        start = 0
        for segment in self.segments[:-1]:
            start += segment.steps
            self._starts.append(start)

    def __call__(self, step: int) -> float:
        """The learning rate of the optimizer step taken after ``step`` steps."""
        i = bisect.bisect_right(self._starts, step)
        start = self._starts[i - 1] if i > 0 else 0
        return float(self.segments[i].fn(step - start))


def _number(spec: Mapping, key: str, where: str, integer: bool = False, positive: bool = False) -> float:
    value = spec[key]
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or (positive and value <= 0):
        kind = ("a positive " if positive else "an " if integer else "a ") + ("integer" if integer else "number")
        raise UserError(f"{where}.{key} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def _numbers(spec: Mapping, key: str, where: str, integer: bool = False) -> list:
    value = spec[key]
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"{where}.{key} must be a non-empty list, got {value!r}")
    return [_number({key: v}, key, where, integer) for v in value]


def _segment(spec: Any, where: str) -> Segment:
    if not isinstance(spec, Mapping):
        raise UserError(f"{where} must be a number or a mapping with a 'scheduler' key, got {spec!r}")
    name = spec.get("scheduler")
    if not isinstance(name, str) or name.lower() not in _FIELDS:
        raise UserError(f"{where}.scheduler must be one of {', '.join(SCHEDULERS)}, got {name!r}")
    required, optional = _FIELDS[name.lower()]
    for key in spec:
        if key != "scheduler" and key not in required and key not in optional:
            valid = ", ".join([*required, *optional])
            raise UserError(f"{where}: unknown key '{key}' for scheduler {name} (valid: {valid})")
    for key in required:
        if key not in spec:
            raise UserError(f"{where}: scheduler {name} needs '{key}'")
    spec = {**optional, **spec}
    steps = None if spec["steps"] is None else _number(spec, "steps", where, integer=True, positive=True)
    kind = name.lower()

    if kind == "constant":
        lr = _number(spec, "learning_rate", where)
        return Segment(lambda step: lr, steps)

    if kind == "exponential":
        initial = _number(spec, "initial_learning_rate", where)
        decay_steps = _number(spec, "decay_steps", where, integer=True, positive=True)
        rate = _number(spec, "decay_rate", where)
        if not isinstance(spec["staircase"], bool):
            raise UserError(f"{where}.staircase must be true or false, got {spec['staircase']!r}")
        staircase = spec["staircase"]

        def exponential(step: int) -> float:
            exponent = step // decay_steps if staircase else step / decay_steps
            return initial * rate**exponent

        return Segment(exponential, steps)

    if kind == "piecewiseconstant":
        values = _numbers(spec, "values", where)
        boundaries = _numbers(spec, "boundaries", where, integer=True)
        if len(values) != len(boundaries) + 1:
            raise UserError(f"{where}: PiecewiseConstant needs one more value than boundaries, "
                            f"got {len(values)} values and {len(boundaries)} boundaries")
        if any(b <= a for a, b in zip(boundaries, boundaries[1:])):
            raise UserError(f"{where}.boundaries must increase, got {boundaries}")
        return Segment(lambda step: values[bisect.bisect_right(boundaries, step)], steps)

    initial = _number(spec, "initial_learning_rate", where)
    if kind == "cosine":
        if (spec["end_learning_rate"] is None) == (spec["alpha"] is None):
            raise UserError(f"{where}: scheduler Cosine needs exactly one of 'end_learning_rate' and 'alpha'")
        end = (_number(spec, "end_learning_rate", where) if spec["end_learning_rate"] is not None
               else initial * _number(spec, "alpha", where))

        def cosine(step: int) -> float:
            return end + (initial - end) * 0.5 * (1.0 + math.cos(math.pi * min(step, steps) / steps))

        return Segment(cosine, steps)

    end = _number(spec, "end_learning_rate", where)
    power = 1.0 if kind == "linear" else _number(spec, "power", where)

    def polynomial(step: int) -> float:
        return (initial - end) * (1.0 - min(step, steps) / steps) ** power + end

    return Segment(polynomial, steps)


def build_schedule(learning_rate: Any, where: str = "optimizer.learning_rate") -> Schedule:
    """A Schedule from ``params["optimizer"]["learning_rate"]``; bad specs raise UserError naming the key."""
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        value = float(learning_rate)
        return Schedule([Segment(lambda step: value, None)])
    if isinstance(learning_rate, Mapping):
        return Schedule([_segment(learning_rate, where)])
    if isinstance(learning_rate, (list, tuple)) and learning_rate:
        segments = [_segment(spec, f"{where}[{i}]") for i, spec in enumerate(learning_rate)]
        for i, segment in enumerate(segments[:-1]):
            if segment.steps is None:
                raise UserError(f"{where}[{i}]: every schedule but the last in a list needs 'steps'")
        return Schedule(segments)
    raise UserError(f"{where} must be a number, a schedule or a non-empty list of schedules, got {learning_rate!r}")


class ScheduledLR(torch.optim.lr_scheduler.LRScheduler):
    """Sets every param group's lr to ``schedule(step)``; its state is the step alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule):
        self.schedule = schedule
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [self.schedule(self.last_epoch) for _ in self.optimizer.param_groups]

    def set_step(self, step: int) -> None:
        """Continue from ``step`` steps taken elsewhere (on the emulator): the groups' lr follows."""
        self.last_epoch = step
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def state_dict(self) -> dict:
        # the schedule comes from params, not from the checkpoint (and is not a tensor type
        # that torch.load(weights_only=True) accepts)
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "schedule")}


def _param_groups(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float,
                  exclude: Sequence[str]) -> list[dict]:
    """Two groups: with weight decay, and without it for names containing an excluded substring.

    Without weight decay, one group (each group costs an optimizer pass per step).
    """
    if weight_decay == 0.0:
        return [{"params": [p for _, p in named_parameters if p.requires_grad], "weight_decay": 0.0}]
    decay, no_decay = [], []
    for name, parameter in named_parameters:
        if not parameter.requires_grad:
            continue
        excluded = any(part.lower() in name.lower() for part in exclude)
        (no_decay if excluded else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: torch.nn.Module, optimizer_params: Mapping) -> torch.optim.Optimizer:
    """The optimizer of ``params["optimizer"]`` over the model's trainable parameters.

    Weight decay (coupled L2 for sgd/momentum/adam, decoupled for adamw) skips every
    parameter whose name contains one of ``weight_decay_exclude`` (case-insensitive).
    The learning rate starts at 0 here; the ScheduledLR sets it before the first step.
    """
    p = optimizer_params
    groups = _param_groups(model.named_parameters(), p["weight_decay"], p["weight_decay_exclude"])
    if not groups:
        raise UserError("optimizer: the model has no trainable parameters")
    kind = p["optimizer_type"]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.0)
    if kind == "momentum":
        return torch.optim.SGD(groups, lr=0.0, momentum=p["momentum"], nesterov=p["nesterov"])
    betas = (p["beta1"], p["beta2"])
    if kind == "adam":
        return torch.optim.Adam(groups, lr=0.0, betas=betas, eps=p["epsilon"])
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=p["epsilon"])
    raise UserError(f"optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got {kind!r}")
