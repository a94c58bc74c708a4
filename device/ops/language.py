"""Language: embedding lookup, gathers of activations by index, one-hot.

``gather`` is TensorFlow's GatherV2 (``axis``, ``batch_dims``): BERT's masked-position
gather picks, per sequence, the positions to predict. ``take_along_axis`` is
``torch.gather``: an index array of the input's rank. Both scatter-add their gradient
back, so positions picked twice add up.
"""

from __future__ import annotations

import numpy as np

from device.dtypes import EMULATOR_STORAGE
from device.ops.arrays import check_ids
from device.ops.record import ACCUMULATOR_BYTES, ANY, FLOAT, INTEGER, OpRecord, Shape, Work


def _embedding_forward(inputs, attrs, ctx):
    table, ids = inputs  # (V, D), (...) ints -> (..., D)
    check_ids(ids, table.shape[0], "embedding ids")
    return [np.take(table, ids, axis=0)], (table.shape, ids)


def _embedding_backward(saved, grads, attrs, needs):
    table_shape, ids = saved
    g = grads[0]
    dtable = np.zeros(table_shape, dtype=g.dtype)
    np.add.at(dtable, ids.reshape(-1), g.reshape(-1, table_shape[1]))  # repeated ids add up
    padding = attrs.get("padding_idx")
    if padding is not None:  # torch's padding_idx: that row is read as it is, and never trained
        dtable[padding] = 0
    return [dtable, None]


def _embedding_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[1]) + (shapes[0][1],)]  # ids (...) -> (..., D)


def _lookup_cost(work: Work) -> tuple[float, float]:
    return 0.0, 2.0 * work.out * work.elem  # read the selected rows, write them


def _scatter_add_cost(work: Work) -> tuple[float, float]:
    # backward: scatter-add each output row into the table's fp32 gradient
    return float(work.out), work.out * (work.elem + 2 * ACCUMULATOR_BYTES)


def _gather_parts(x_shape, ids_shape, attrs):
    axis = int(attrs["axis"]) % len(x_shape)
    batch_dims = int(attrs.get("batch_dims", 0))
    if batch_dims < 0:  # TensorFlow's rule: counted back from the ids' rank
        batch_dims += len(ids_shape)
    return axis, batch_dims


def _gather_layout(x_shape, ids, axis, batch_dims):
    """Flat row indices into x moved to (batch..., N, rest...) and flattened to (B * N, rest...)."""
    batch = int(np.prod(x_shape[:batch_dims], dtype=np.int64))
    n = x_shape[axis]
    flat = ids.reshape(batch, -1) + (np.arange(batch) * n)[:, None]
    return flat.reshape(ids.shape)


def _gather_perm(x_rank, ids_rank, axis, batch_dims):
    """The transpose from (batch..., ids..., x's other dims in order) to TF's output order."""
    k = ids_rank - batch_dims  # index dims
    middle = axis - batch_dims  # x's dims between the batch dims and axis
    lead = list(range(batch_dims))
    ids_dims = list(range(batch_dims, batch_dims + k))
    rest = list(range(batch_dims + k, batch_dims + k + x_rank - batch_dims - 1))
    return lead + rest[:middle] + ids_dims + rest[middle:]


def _gather_forward(inputs, attrs, ctx):
    x, ids = inputs  # TF GatherV2: out = x.shape[:axis] + ids.shape[batch_dims:] + x.shape[axis + 1:]
    axis, batch_dims = _gather_parts(x.shape, ids.shape, attrs)
    check_ids(ids, x.shape[axis], "gather indices")
    moved = np.moveaxis(x, axis, batch_dims)  # (batch..., N, rest...)
    rows = moved.reshape(-1, *moved.shape[batch_dims + 1:])  # (B * N, rest...)
    flat = _gather_layout(x.shape, ids, axis, batch_dims)
    picked = rows[flat.reshape(-1)].reshape(*ids.shape, *moved.shape[batch_dims + 1:])
    perm = _gather_perm(x.ndim, ids.ndim, axis, batch_dims)
    return [np.transpose(picked, perm)], (x.shape, moved.shape, flat, perm, axis, batch_dims)


def _gather_backward(saved, grads, attrs, needs):
    x_shape, moved_shape, flat, perm, axis, batch_dims = saved
    g = np.transpose(grads[0], np.argsort(perm))  # back to (batch..., ids..., rest...)
    rows = np.zeros((int(np.prod(moved_shape[:batch_dims + 1], dtype=np.int64)), *moved_shape[batch_dims + 1:]),
                    dtype=g.dtype)
    np.add.at(rows, flat.reshape(-1), g.reshape(-1, *moved_shape[batch_dims + 1:]))  # repeated picks add up
    return [np.moveaxis(rows.reshape(moved_shape), batch_dims, axis), None]


def _gather_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    x, ids = shapes
    axis, batch_dims = _gather_parts(x, ids, attrs)
    return [tuple(x[:axis]) + tuple(ids[batch_dims:]) + tuple(x[axis + 1:])]


def _along_index(ids, axis):
    """The full index tuple of take_along_axis: ids at axis, the position itself elsewhere."""
    grid = list(np.indices(ids.shape, sparse=True))
    grid[axis] = ids
    return tuple(grid)


def _take_along_forward(inputs, attrs, ctx):
    x, ids = inputs  # torch.gather: ids of x's rank, no larger than x off the axis
    axis = int(attrs["axis"]) % x.ndim
    check_ids(ids, x.shape[axis], "gather indices")
    index = _along_index(ids, axis)
    return [x[index]], (x.shape, index)


def _take_along_backward(saved, grads, attrs, needs):
    x_shape, index = saved
    dx = np.zeros(x_shape, dtype=grads[0].dtype)
    np.add.at(dx, index, grads[0])
    return [dx, None]


def _take_along_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[1])]


def _one_hot_forward(inputs, attrs, ctx):
    ids = inputs[0]
    hot = ids[..., None] == np.arange(int(attrs["depth"]))  # an id outside [0, depth) gives a row of off
    on, off = attrs.get("on_value", 1), attrs.get("off_value", 0)
    return [np.where(hot, on, off).astype(EMULATOR_STORAGE[attrs["dtype"]])], None


def _one_hot_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[0]) + (int(attrs["depth"]),)]


def _move_cost(work: Work) -> tuple[float, float]:
    return 0.0, 2.0 * work.out * work.elem  # read the picked elements, write them


RECORDS = (
    OpRecord("embedding", "table[ids]: rows of a (V, D) table; repeated ids add up their gradients; the "
             "padding_idx row gets none", ("table", "ids"), ("padding_idx?",), "embedding", (FLOAT, INTEGER),
             _embedding_shape, _embedding_forward, _embedding_backward, cost=_lookup_cost,
             backward_cost=_scatter_add_cost),
    # language ops: gathers of activations (MLM masked positions), one-hot targets
    OpRecord("gather", "x[..., ids, ...] at axis, per batch_dims leading dims (TF GatherV2); picks add up in the "
             "gradient", ("x", "ids"), ("axis", "batch_dims?"), "embedding", (ANY, INTEGER), _gather_shape,
             _gather_forward, _gather_backward, dtype=lambda dtypes, attrs: [dtypes[0]], cost=_move_cost,
             backward_cost=_scatter_add_cost, backward_reads=lambda index, weights: index == 1),
    OpRecord("take_along_axis", "x at ids along axis, ids of x's rank (torch.gather); picks add up in the gradient",
             ("x", "ids"), ("axis",), "embedding", (ANY, INTEGER), _take_along_shape, _take_along_forward,
             _take_along_backward, dtype=lambda dtypes, attrs: [dtypes[0]], cost=_move_cost,
             backward_cost=_scatter_add_cost, backward_reads=lambda index, weights: index == 1),
    OpRecord("one_hot", "on_value where ids == position along a new last axis of size depth, off_value elsewhere",
             ("ids",), ("depth", "dtype", "on_value?", "off_value?"), "elementwise", (INTEGER,), _one_hot_shape,
             _one_hot_forward, None, dtype=lambda dtypes, attrs: [attrs["dtype"]], cost=_move_cost,
             backward_ratio=0.0, backward_reads=lambda index, weights: False),
)
