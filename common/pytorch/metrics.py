"""Eval metrics over the whole eval set, fed numpy arrays.

A model declares its metrics after building itself::

    self.metrics = {"accuracy": Accuracy(output="logits")}

and the runner, for every eval batch, calls ``metric.update(outputs, batch)`` with the
model's outputs and the batch as numpy arrays (the emulator hands the same numpy
outputs), then ``metric.result()`` once at the end. Numpy keeps the metrics identical on
CPU, GPU and the emulator.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from common.errors import UserError


def _pick(batch: Any, key: int | str) -> np.ndarray:
    """``batch[key]`` of a tuple/list (by index) or a mapping (by name) batch."""
    try:
        return np.asarray(batch[key])
    except (KeyError, IndexError, TypeError):
        raise UserError(f"metrics: the batch has no element {key!r} (labels=...)") from None


class Metric:
    """Accumulates over eval batches; ``result()`` is the value over everything seen."""

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, outputs: Mapping[str, np.ndarray], batch: Any) -> None:
        raise NotImplementedError

    def result(self) -> float:
        raise NotImplementedError


class Accuracy(Metric):
    """Fraction of examples whose argmax over the last axis of ``outputs[output]`` is the label.

    ``labels`` says where the labels are in the batch: an index into a tuple batch
    (default: the last element) or a key of a dict batch. Labels equal to ``ignore_index``
    do not count.
    """

    def __init__(self, output: str = "logits", labels: int | str = -1, ignore_index: int | None = None):
        self.output, self.labels, self.ignore_index = output, labels, ignore_index
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, outputs: Mapping[str, np.ndarray], batch: Any) -> None:
        if self.output not in outputs:
            raise UserError(f"metrics: Accuracy reads output '{self.output}' but the model returned "
                            f"{sorted(outputs) or 'no outputs'}")
        predictions = np.argmax(outputs[self.output], axis=-1)  # (B, ...)
        labels = _pick(batch, self.labels).reshape(predictions.shape)  # (B, ...)
        counted = np.ones(labels.shape, bool) if self.ignore_index is None else labels != self.ignore_index
        self.correct += int(np.sum((predictions == labels) & counted))
        self.total += int(np.sum(counted))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")
