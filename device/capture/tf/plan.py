"""What the lowering and its rules share: the Plan a mapping, a pattern or a loop answers for one
TF tensor (or CannotMap), and the TensorList a TF list is followed as while a loop is unrolled."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


class CannotMap(Exception):
    """An op that is normally lowered cannot be here (a non-constant attribute input); ``form``
    names the refused form where refused_tf.FORMS keeps a suggestion for it."""

    def __init__(self, reason: str, form: str = ""):
        super().__init__(reason)
        self.form = form


@dataclass
class Plan:
    deps: list  # tf.Tensors that must have IR values first
    build: Callable[[], None]  # emits the IR nodes, once every dep has a value


@dataclass
class TensorList:
    """A TensorList at capture time: per element an IR value, a row of a tensor not yet sliced
    out (``TensorListFromTensor``), or None (reserved, not written yet)."""

    items: list  # str | tuple[str, int] (value, row) | None
    rows: dict = field(default_factory=dict)  # (value, row) -> its sliced IR value, shared by copies

    def copy(self) -> TensorList:
        return TensorList(list(self.items), self.rows)
