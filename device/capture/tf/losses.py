"""Mappings of losses: SparseSoftmaxCrossEntropyWithLogits, SoftmaxCrossEntropyWithLogits.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import ir_dtype, static_shape


def map_sparse_xent(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("the backprop output is not part of a forward pass")
    logits, labels = op.inputs
    return Plan([logits, labels], lambda: low.emit("sparse_softmax_cross_entropy",
                                                      [low.value(logits), low.value(labels)], op, [tensor]))


def map_xent(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("the backprop output is not part of a forward pass")
    logits, labels = op.inputs

    def build():
        # loss = -sum(labels * log_softmax(logits), -1): (N, C) -> (N,)
        dtype = ir_dtype(logits.dtype)
        log_p = low.aux("log_softmax", [low.value(logits)], op, static_shape(logits), dtype, {"axis": 1})
        weighted = low.aux("mul", [low.value(labels), log_p], op, static_shape(logits), dtype)
        total = low.aux("reduce_sum", [weighted], op, static_shape(tensor), dtype, {"axes": [1], "keepdims": False})
        low.emit("neg", [total], op, [tensor])
    return Plan([logits, labels], build)
