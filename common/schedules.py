"""Learning-rate schedules from ``params["optimizer"]["learning_rate"]``, for both frameworks.

    learning_rate: 0.001                         # a number
    learning_rate: {scheduler: Cosine, initial_learning_rate: 0.001, alpha: 0.0, steps: 1000}
    learning_rate:                               # a list, run in sequence
      - {scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.001, steps: 100}
      - {scheduler: Cosine, initial_learning_rate: 0.001, end_learning_rate: 0.0, steps: 900}

The fields mirror the reference zoo's (``step`` = optimizer steps already taken):

    Constant(learning_rate)
    Exponential(initial_learning_rate, decay_steps, decay_rate, staircase=False)
        lr = initial * decay_rate ** (step / decay_steps)   (the exponent floored if staircase)
    PiecewiseConstant(values, boundaries)
        lr = values[i] for boundaries[i-1] <= step < boundaries[i]   (len(values) = len(boundaries) + 1)
    Polynomial(initial_learning_rate, end_learning_rate, steps, power=1.0)   (Linear: power 1)
        lr = (initial - end) * (1 - min(step, steps) / steps) ** power + end
    Cosine(initial_learning_rate, end_learning_rate | alpha, steps)   (alpha: end = alpha * initial;
        the vendor's TF decay_steps is steps)
        lr = end + (initial - end) * (1 + cos(pi * min(step, steps) / steps)) / 2

Every schedule also takes ``steps``: in a list, each entry but the last must give it, and
the next entry starts (from its own step 0) when it ends; with the vendor's
``optimizer.disable_lr_steps_reset: true`` every entry reads the global step instead.

``parse_schedule`` validates a spec into ``Segment``s (bad specs raise UserError naming the
key); ``Schedule`` evaluates them in Python (the PyTorch runner and the emulator), and the
TF side builds the same formulas as graph ops from the same segments (common/tf/optim.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from common.errors import UserError

SCHEDULERS = ("Constant", "Exponential", "PiecewiseConstant", "Polynomial", "Linear", "Cosine")
# scheduler (lower case) -> (required fields, optional fields with their defaults)
_FIELDS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "constant": (("learning_rate",), {"steps": None}),
    "exponential": (("initial_learning_rate", "decay_steps", "decay_rate"), {"staircase": False, "steps": None}),
    "piecewiseconstant": (("values", "boundaries"), {"steps": None}),
    "polynomial": (("initial_learning_rate", "end_learning_rate", "steps"), {"power": 1.0}),
    "linear": (("initial_learning_rate", "end_learning_rate", "steps"), {}),
    "cosine": (("initial_learning_rate", "steps"), {"end_learning_rate": None, "alpha": None}),
}


@dataclass(frozen=True)
class Segment:
    """One validated schedule. ``kind``: constant, exponential, piecewise, polynomial or cosine.

    initial: the lr at the segment's step 0 (constant: the lr); end: the lr at ``steps``
    (polynomial, cosine); decay_steps, decay_rate, staircase (exponential); values,
    boundaries (piecewise); power (polynomial); steps: its length, None to the end.
    """

    kind: str
    steps: int | None
    initial: float = 0.0
    end: float = 0.0
    decay_steps: int = 1
    decay_rate: float = 1.0
    staircase: bool = False
    power: float = 1.0
    values: tuple[float, ...] = field(default_factory=tuple)
    boundaries: tuple[int, ...] = field(default_factory=tuple)

    def __call__(self, step: int) -> float:
        """The lr after ``step`` steps of this segment, in Python floats."""
        if self.kind == "constant":
            return self.initial
        if self.kind == "exponential":
            exponent = step // self.decay_steps if self.staircase else step / self.decay_steps
            return self.initial * self.decay_rate**exponent
        if self.kind == "piecewise":
            return self.values[bisect.bisect_right(self.boundaries, step)]
        progress = min(step, self.steps) / self.steps
        if self.kind == "cosine":
            return self.end + (self.initial - self.end) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return (self.initial - self.end) * (1.0 - progress) ** self.power + self.end


class Schedule:
    """A learning rate per step: segments run in sequence, each from its own step 0 (or, with
    ``reset_steps=False``, the vendor's disable_lr_steps_reset, reading the global step)."""

    def __init__(self, segments: Sequence[Segment], reset_steps: bool = True):
        self.segments = tuple(segments)
        self.reset_steps = reset_steps
        self.starts = [0]  # the global step at which each segment starts
        for segment in self.segments[:-1]:
            self.starts.append(self.starts[-1] + segment.steps)

    def __call__(self, step: int) -> float:
        """The learning rate of the optimizer step taken after ``step`` steps."""
        i = bisect.bisect_right(self.starts, step) - 1
        return float(self.segments[i](step - self.starts[i] if self.reset_steps else step))


def _number(spec: Mapping, key: str, where: str, integer: bool = False, positive: bool = False) -> float:
    value = spec[key]
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or (positive and value <= 0):
        kind = ("a positive " if positive else "an " if integer else "a ") + ("integer" if integer else "number")
        raise UserError(f"{where}.{key} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def _numbers(spec: Mapping, key: str, where: str, integer: bool = False) -> tuple:
    value = spec[key]
    if not isinstance(value, (list, tuple)) or not value:
        raise UserError(f"{where}.{key} must be a non-empty list, got {value!r}")
    return tuple(_number({key: v}, key, where, integer) for v in value)


def _segment(spec: Any, where: str) -> Segment:
    if not isinstance(spec, Mapping):
        raise UserError(f"{where} must be a number or a mapping with a 'scheduler' key, got {spec!r}")
    name = spec.get("scheduler")
    if not isinstance(name, str) or name.lower() not in _FIELDS:
        raise UserError(f"{where}.scheduler must be one of {', '.join(SCHEDULERS)}, got {name!r}")
    required, optional = _FIELDS[name.lower()]
    if name.lower() == "cosine" and "decay_steps" in spec:  # the vendor's TF spelling of a Cosine's steps
        if "steps" in spec and spec["steps"] != spec["decay_steps"]:
            raise UserError(f"{where}: a Cosine's 'decay_steps' ({spec['decay_steps']}) and 'steps' ({spec['steps']}) "
                            f"differ; here a cosine decays over its steps: give one")
        spec = {"steps": spec["decay_steps"], **{k: v for k, v in spec.items() if k != "decay_steps"}}
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
        return Segment("constant", steps, initial=_number(spec, "learning_rate", where))
    if kind == "exponential":
        if not isinstance(spec["staircase"], bool):
            raise UserError(f"{where}.staircase must be true or false, got {spec['staircase']!r}")
        return Segment("exponential", steps, initial=_number(spec, "initial_learning_rate", where),
                       decay_steps=_number(spec, "decay_steps", where, integer=True, positive=True),
                       decay_rate=_number(spec, "decay_rate", where), staircase=spec["staircase"])
    if kind == "piecewiseconstant":
        values = _numbers(spec, "values", where)
        boundaries = _numbers(spec, "boundaries", where, integer=True)
        if len(values) != len(boundaries) + 1:
            raise UserError(f"{where}: PiecewiseConstant needs one more value than boundaries, "
                            f"got {len(values)} values and {len(boundaries)} boundaries")
        if any(b <= a for a, b in zip(boundaries, boundaries[1:])):
            raise UserError(f"{where}.boundaries must increase, got {list(boundaries)}")
        return Segment("piecewise", steps, values=values, boundaries=boundaries)

    initial = _number(spec, "initial_learning_rate", where)
    if kind == "cosine":
        if (spec["end_learning_rate"] is None) == (spec["alpha"] is None):
            raise UserError(f"{where}: scheduler Cosine needs exactly one of 'end_learning_rate' and 'alpha'")
        end = (_number(spec, "end_learning_rate", where) if spec["end_learning_rate"] is not None
               else initial * _number(spec, "alpha", where))
        return Segment("cosine", steps, initial=initial, end=end)
    power = 1.0 if kind == "linear" else _number(spec, "power", where)
    return Segment("polynomial", steps, initial=initial, end=_number(spec, "end_learning_rate", where), power=power)


FLOAT32_MAX = 3.4028234663852886e38


def _in_range(segments: list[Segment], where: str) -> list[Segment]:
    """Learning rates the weights' float32 can hold: a NaN, an inf or 1e39 would make every
    updated weight non-finite (torch.optim refuses 1e39 with a traceback mid-step)."""
    for segment in segments:
        for rate in (segment.initial, segment.end, *segment.values):
            if not abs(rate) <= FLOAT32_MAX:
                raise UserError(f"{where}: a learning rate of {rate} is not a finite float32 (the weights' format; "
                                f"at most {FLOAT32_MAX:.4g})")
    return segments


def parse_schedule(learning_rate: Any, where: str = "optimizer.learning_rate") -> list[Segment]:
    """The validated segments of a learning-rate spec; bad specs raise UserError naming the key."""
    if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
        return _in_range([Segment("constant", None, initial=float(learning_rate))], where)
    if isinstance(learning_rate, Mapping):
        return _in_range([_segment(learning_rate, where)], where)
    if isinstance(learning_rate, (list, tuple)) and learning_rate:
        segments = [_segment(spec, f"{where}[{i}]") for i, spec in enumerate(learning_rate)]
        for i, segment in enumerate(segments[:-1]):
            if segment.steps is None:
                raise UserError(f"{where}[{i}]: every schedule but the last in a list needs 'steps'")
        return _in_range(segments, where)
    raise UserError(f"{where} must be a number, a schedule or a non-empty list of schedules, got {learning_rate!r}")


def build_schedule(learning_rate: Any, where: str = "optimizer.learning_rate", reset_steps: bool = True) -> Schedule:
    return Schedule(parse_schedule(learning_rate, where), reset_steps)
