"""Mappings of normalizations: Softmax and LogSoftmax, FusedBatchNorm.

Keras BatchNormalization at inference (fixed statistics) stays elementwise on purpose:
the IR's batch_norm takes its statistics from the runtime's training flag.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import f32, ir_dtype, read_handle, static_shape


def map_softmax(low: Lowering, tensor):
    op = tensor.op
    ir_op = "softmax" if op.type == "Softmax" else "log_softmax"
    axis = tensor.shape.rank - 1
    return Plan([op.inputs[0]], lambda: low.emit(ir_op, [low.value(op.inputs[0])], op, [tensor], {"axis": axis}))


def map_fused_batch_norm(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("only the normalised output of a fused batch norm is lowered")
    x, gamma, beta, mean, variance = op.inputs[:5]
    eps = f32(op.get_attr("epsilon"))
    axis = 3 if op.get_attr("data_format").decode() == "NHWC" else 1
    if op.get_attr("is_training"):
        # running stats: the variables read into mean/variance, updated by
        # exponential_avg_factor f: new = (1 - f) * old + f * batch
        stats = [read_handle(t) for t in (mean, variance)]
        if any(s is None for s in stats):
            raise CannotMap("the running mean and variance are not variables")
        factor = float(op.get_attr("exponential_avg_factor")) if "exponential_avg_factor" in op.node_def.attr \
            else 1.0
        # the IR's momentum is torch's: new = (1 - m) * old + m * batch, so m = f
        attrs = {"axis": axis, "eps": eps, "momentum": f32(factor)}

        def build():
            low.emit("batch_norm", [low.value(x), low.value(gamma), low.value(beta),
                                      low.variable(stats[0]), low.variable(stats[1])], op, [tensor], attrs)
        return Plan([x, gamma, beta], build)

    def build_inference():
        _normalize_inference(low, op, tensor, x, gamma, beta, mean, variance, eps, axis)
    return Plan([x, gamma, beta, mean, variance], build_inference)


def _normalize_inference(low: Lowering, op, tensor, x, gamma, beta, mean, variance, eps, axis):
    """y = x * inv + (beta - mean * inv), inv = gamma * rsqrt(var + eps), with fixed stats."""
    dtype = ir_dtype(x.dtype)
    rank = x.shape.rank
    channel_shape = [1] * rank
    channel_shape[axis] = x.shape[axis]

    def per_channel(value: str) -> str:  # (C,) -> broadcastable against x
        if axis == rank - 1:
            return value
        return low.aux("reshape", [value], op, channel_shape, dtype, {"shape": channel_shape})

    c = [x.shape[axis]]
    e = low.constant(op, "epsilon", np.asarray(eps, dtype=x.dtype.as_numpy_dtype))
    var_eps = low.aux("add", [low.value(variance), e], op, c, dtype)
    inv = low.aux("mul", [low.aux("rsqrt", [var_eps], op, c, dtype), low.value(gamma)], op, c, dtype)
    shift = low.aux("sub", [low.value(beta), low.aux("mul", [low.value(mean), inv], op, c, dtype)], op, c, dtype)
    scaled = low.aux("mul", [low.value(x), per_channel(inv)], op, static_shape(x), dtype)
    low.emit("add", [scaled, per_channel(shift)], op, [tensor])
