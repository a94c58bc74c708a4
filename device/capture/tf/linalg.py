"""Mappings of linear algebra: MatMul and BatchMatMul (their transposes written out), Einsum.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import tensorflow as tf

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import Plan
from device.capture.tf.tensors import ir_dtype, static_shape


def _transposed(low: Lowering, value: str, tensor: tf.Tensor, op: tf.Operation) -> str:
    """``value`` with its last two axes swapped."""
    shape = list(static_shape(tensor))
    perm = list(range(len(shape)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return low.aux("transpose", [value], op, [shape[p] for p in perm], ir_dtype(tensor.dtype), {"perm": perm})


def map_matmul(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs
    keys = ("transpose_a", "transpose_b") if op.type == "MatMul" else ("adj_x", "adj_y")
    swap_a, swap_b = (bool(op.get_attr(k)) for k in keys)

    def build():
        va, vb = low.value(a), low.value(b)
        if swap_a:
            va = _transposed(low, va, a, op)
        if swap_b:
            vb = _transposed(low, vb, b, op)
        low.emit("matmul", [va, vb], op, [tensor])
    return Plan([a, b], build)


def map_einsum(low: Lowering, tensor):
    op = tensor.op
    equation = op.get_attr("equation").decode()
    operands = list(op.inputs)
    return Plan(operands, lambda: low.emit("einsum", [low.value(t) for t in operands], op, [tensor],
                                              {"equation": equation}))
