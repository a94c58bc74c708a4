"""Mappings of language ops: GatherV2, OneHot, MatrixBandPart (masks, position buckets, gathers).

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import ir_dtype


def map_gather(low: Lowering, tensor):
    op = tensor.op
    params, indices = op.inputs[:2]
    rank = params.shape.rank
    axis = int(low.attr(op.inputs[2], "the gather axis"))
    batch_dims = int(op.get_attr("batch_dims"))
    if batch_dims < 0:
        batch_dims += indices.shape.rank
    attrs = {"axis": axis % rank, "batch_dims": batch_dims}
    return Plan([params, indices], lambda: low.emit("gather", [low.value(params), low.value(indices)], op, [tensor],
                                                    attrs))


def map_one_hot(low: Lowering, tensor):
    op = tensor.op
    indices = op.inputs[0]
    if op.get_attr("axis") not in (-1, indices.shape.rank):
        raise CannotMap(f"axis={op.get_attr('axis')} (only the last axis)")
    depth = int(low.attr(op.inputs[1], "the one-hot depth"))
    on, off = (low.scalar(t) for t in op.inputs[2:4])
    if on is None or off is None:
        raise CannotMap("on_value and off_value are not constants")
    attrs = {"depth": depth, "dtype": ir_dtype(tensor.dtype), "on_value": on, "off_value": off}
    return Plan([indices], lambda: low.emit("one_hot", [low.value(indices)], op, [tensor], attrs))


def map_band_part(low: Lowering, tensor):
    """tf.linalg.band_part(x, lower, upper) of a computed x: where(band, x, 0) with the band a constant."""
    op = tensor.op
    x = op.inputs[0]
    lower, upper = (int(low.attr(t, "the band's width")) for t in op.inputs[1:3])
    rows, cols = x.shape.as_list()[-2:]
    if rows is None or cols is None:
        raise CannotMap("the matrix size is not static")
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    band = ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))

    def build():
        zero = low.constant(op, "zero", np.zeros((), dtype=x.dtype.as_numpy_dtype))
        low.emit("where", [low.constant(op, "band", band), low.value(x), zero], op, [tensor])
    return Plan([x], build)
