"""Mappings of elementwise ops: arithmetic, casts, stop_gradient, select, integer division.

Integer remainders and truncating division (FloorMod, TruncateDiv, TruncateMod) are built from
floor_div and a select by signs, exact on int32 / int64; the float forms are refused.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from device.capture.tf.lowering import Lowering, OpMapping
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import ir_dtype, static_shape


# tf.stop_gradient: the IR has no stop-gradient op, so it is an identity marked with this
# attribute; the runtime must not pass a gradient through a node that has it.
STOP_GRADIENT_ATTR = "stop_gradient"


def simple(ir_op: str) -> OpMapping:
    """One TF op -> the IR op ``ir_op`` on the same inputs."""
    def plan(low: Lowering, tensor: tf.Tensor) -> Plan:
        op = tensor.op
        return Plan(list(op.inputs), lambda: low.emit(ir_op, [low.value(t) for t in op.inputs], op, [tensor]))
    return plan


def map_stop_gradient(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor], {STOP_GRADIENT_ATTR: True}))


def map_div(low: Lowering, tensor):
    if not tensor.dtype.is_floating:
        raise CannotMap("integer division")
    return simple("div")(low, tensor)


def map_div_no_nan(low: Lowering, tensor):
    denominator = low.const(tensor.op.inputs[1])
    if denominator is None or np.any(denominator == 0):
        raise CannotMap("the denominator is not a nonzero constant")
    return simple("div")(low, tensor)


def map_add_n(low: Lowering, tensor):
    op = tensor.op
    terms = list(op.inputs)

    def build():
        acc = low.value(terms[0])
        for t in terms[1:-1]:
            acc = low.aux("add", [acc, low.value(t)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        if len(terms) == 1:
            low.emit("identity", [acc], op, [tensor])
        else:
            low.emit("add", [acc, low.value(terms[-1])], op, [tensor])
    return Plan(terms, build)


def map_bias_add(low: Lowering, tensor):
    op = tensor.op
    x, bias = op.inputs

    def build():
        b = low.value(bias)
        if op.get_attr("data_format") == b"NCHW" and x.shape.rank > 2:
            # bias (C,) -> (C, 1, ..., 1) so that it broadcasts over N C H W
            shape = [bias.shape[0]] + [1] * (x.shape.rank - 2)
            b = low.aux("reshape", [b], op, shape, ir_dtype(bias.dtype), {"shape": shape})
        low.emit("add", [low.value(x), b], op, [tensor])
    return Plan([x, bias], build)


def map_identity_n(low: Lowering, tensor):
    """IdentityN (what tf.custom_gradient wraps a forward in, e.g. Keras' swish): each output is its input.
    The custom gradient is not taken: the IR differentiates the forward ops, the same function."""
    op = tensor.op
    x = op.inputs[tensor.value_index]
    return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor]))


def map_squared_difference(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs

    def build():
        diff = low.aux("sub", [low.value(a), low.value(b)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        low.emit("square", [diff], op, [tensor])
    return Plan([a, b], build)


def map_pow(low: Lowering, tensor):
    op = tensor.op
    exponent = low.scalar(op.inputs[1])
    ir_op = {1.0: "identity", 2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}.get(exponent)
    if ir_op is None:
        raise CannotMap("the exponent is not a constant 1, 2, 0.5 or -0.5")
    x = op.inputs[0]
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor]))


def map_cast(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("cast", [low.value(x)], op, [tensor], {"dtype": ir_dtype(tensor.dtype)}))


def map_select(low: Lowering, tensor):
    op = tensor.op
    condition, a, b = op.inputs

    def build():
        cond = low.value(condition)
        rank = len(static_shape(tensor))
        if op.type == "Select" and condition.shape.rank == 1 and rank > 1:  # v1 where: a vector picks rows
            shape = [condition.shape[0]] + [1] * (rank - 1)
            cond = low.aux("reshape", [cond], op, shape, "bool", {"shape": shape})
        low.emit("where", [cond, low.value(a), low.value(b)], op, [tensor])
    return Plan([condition, a, b], build)


def map_floor_div(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs
    if not tensor.dtype.is_floating:
        return simple("floor_div")(low, tensor)

    def build():  # floats: floor(a / b)
        q = low.aux("div", [low.value(a), low.value(b)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        low.emit("floor", [q], op, [tensor])
    return Plan([a, b], build)


def integer_division(result: str) -> OpMapping:
    """FloorMod, TruncateDiv, TruncateMod of integers, from floor_div (numpy's //), never a float:
    q = a // b and r = a - q * b (r has b's sign: FloorMod); where r != 0 and r's sign is not a's,
    the truncated quotient is q + 1 and the truncated remainder r - b. Floats are refused (a float
    remainder through floor(a / b) is not TF's exact fmod)."""
    def plan(low: Lowering, tensor):
        op = tensor.op
        a, b = op.inputs
        if not tensor.dtype.is_integer:
            raise CannotMap(f"{op.type} of {tensor.dtype.name} values (integers only: exact there)")
        shape, dtype = static_shape(tensor), ir_dtype(tensor.dtype)

        def build():
            x, y = low.value(a), low.value(b)
            q = low.aux("floor_div", [x, y], op, shape, dtype)
            qy = low.aux("mul", [q, y], op, shape, dtype)
            if result == "floor_mod":
                low.emit("sub", [x, qy], op, [tensor])
                return
            r = low.aux("sub", [x, qy], op, shape, dtype)
            zero = low.constant(op, "zero", np.zeros((), dtype=tensor.dtype.as_numpy_dtype))
            signs_differ = low.aux("not_equal", [low.aux("less", [r, zero], op, shape, "bool"),
                                                 low.aux("less", [x, zero], op, static_shape(a), "bool")],
                                   op, shape, "bool")
            off = low.aux("logical_and", [low.aux("not_equal", [r, zero], op, shape, "bool"), signs_differ], op,
                          shape, "bool")
            if result == "truncate_div":
                one = low.constant(op, "one", np.ones((), dtype=tensor.dtype.as_numpy_dtype))
                low.emit("add", [q, low.aux("where", [off, one, zero], op, shape, dtype)], op, [tensor])
            else:
                low.emit("sub", [r, low.aux("where", [off, y, zero], op, shape, dtype)], op, [tensor])
        return Plan([a, b], build)
    return plan
