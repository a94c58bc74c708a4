"""What a mapping or a pattern answers for one TF tensor: a Plan, or CannotMap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


class CannotMap(Exception):
    """An op that is normally lowered cannot be here (a non-constant attribute input)."""


@dataclass
class Plan:
    deps: list  # tf.Tensors that must have IR values first
    build: Callable[[], None]  # emits the IR nodes, once every dep has a value
