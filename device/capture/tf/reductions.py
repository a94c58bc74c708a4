"""Mappings of reductions: Mean Sum Max over constant axes, ArgMax, Cumsum.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import Plan


def map_reduce(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    rank = x.shape.rank
    axes = sorted({int(a) % rank for a in np.atleast_1d(low.attr(op.inputs[1], "the reduction axis"))})
    keepdims = bool(op.get_attr("keep_dims"))
    ir_op = {"Mean": "reduce_mean", "Sum": "reduce_sum", "Max": "reduce_max"}[op.type]
    if not axes:  # TF reduces over nothing: the value itself
        return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor]))
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor], {"axes": axes, "keepdims": keepdims}))


def map_argmax(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    axis = int(low.attr(op.inputs[1], "the argmax axis")) % x.shape.rank
    return Plan([x], lambda: low.emit("argmax", [low.value(x)], op, [tensor], {"axis": axis}))


def map_cumsum(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    attrs = {"axis": int(low.attr(op.inputs[1], "the cumsum axis")) % x.shape.rank,
             "exclusive": bool(op.get_attr("exclusive")), "reverse": bool(op.get_attr("reverse"))}
    return Plan([x], lambda: low.emit("cumsum", [low.value(x)], op, [tensor], attrs))
