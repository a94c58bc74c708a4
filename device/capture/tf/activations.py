"""Mappings of activations that are not one IR op on the same inputs: Elu, Relu6, LeakyRelu.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import f32, ir_dtype, static_shape


def map_elu(low: Lowering, tensor):
    op = tensor.op
    return Plan([op.inputs[0]], lambda: low.emit("elu", [low.value(op.inputs[0])], op, [tensor], {"alpha": 1.0}))


def map_relu6(low: Lowering, tensor):
    """Relu6 (Keras ReLU(6.0), MobileNet's activation): clamp to [0, 6], no gradient on the bounds (Relu6Grad)."""
    op = tensor.op
    x = op.inputs[0]
    attrs = {"min": 0.0, "max": 6.0}
    return Plan([x], lambda: low.emit("clamp", [low.value(x)], op, [tensor], attrs))


def map_leaky_relu(low: Lowering, tensor):
    op = tensor.op
    alpha = f32(op.get_attr("alpha"))
    if not 0.0 <= alpha <= 1.0:
        raise CannotMap("alpha outside [0, 1]")
    x = op.inputs[0]

    def build():
        # leaky_relu(x) = max(x, alpha * x) for 0 <= alpha <= 1
        a = low.constant(op, "alpha", np.asarray(alpha, dtype=x.dtype.as_numpy_dtype))
        scaled = low.aux("mul", [low.value(x), a], op, static_shape(x), ir_dtype(x.dtype))
        low.emit("maximum", [low.value(x), scaled], op, [tensor])
    return Plan([x], build)
