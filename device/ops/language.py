"""Language: embedding lookup."""

from __future__ import annotations

import numpy as np

from device.ops.arrays import check_ids
from device.ops.record import ACCUMULATOR_BYTES, FLOAT, INTEGER, OpRecord, Shape, Work


def _embedding_forward(inputs, attrs, ctx):
    table, ids = inputs  # (V, D), (...) ints -> (..., D)
    check_ids(ids, table.shape[0], "embedding ids")
    return [np.take(table, ids, axis=0)], (table.shape, ids)


def _embedding_backward(saved, grads, attrs, needs):
    table_shape, ids = saved
    g = grads[0]
    dtable = np.zeros(table_shape, dtype=g.dtype)
    np.add.at(dtable, ids.reshape(-1), g.reshape(-1, table_shape[1]))  # repeated ids add up
    return [dtable, None]


def _embedding_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[1]) + (shapes[0][1],)]  # ids (...) -> (..., D)


def _lookup_cost(work: Work) -> tuple[float, float]:
    return 0.0, 2.0 * work.out * work.elem  # read the selected rows, write them


def _scatter_add_cost(work: Work) -> tuple[float, float]:
    # backward: scatter-add each output row into the table's fp32 gradient
    return float(work.out), work.out * (work.elem + 2 * ACCUMULATOR_BYTES)


RECORDS = (
    OpRecord("embedding", "table[ids]: rows of a (V, D) table; repeated ids add up their gradients",
             ("table", "ids"), (), "embedding", (FLOAT, INTEGER), _embedding_shape, _embedding_forward,
             _embedding_backward, cost=_lookup_cost, backward_cost=_scatter_add_cost),
)
