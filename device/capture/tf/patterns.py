"""Patterns: several TF ops -> one IR op (Keras layers and tf.nn functions, written out in ops).

    Keras Dropout / tf.nn.dropout       SelectV2(uniform >= rate, x * 1/(1-rate), 0) -> dropout(rate)
                                        (a noise_shape: x * dropout(ones of that shape))
    Keras Embedding                     GatherV2(table, SelectV2(ids < 0, ids + n, ids), 0) -> embedding
    Keras LayerNormalization            moments(keepdims) + rsqrt/mul/add -> layer_norm
    Keras BatchNormalization (training) moments + tf.nn.batch_normalization, with the moving-average
                                        assignments of its running stats in the graph -> batch_norm
    gelu (exact: erfc or erf form)      0.5 * x * erfc(-x / sqrt 2), 0.5 * x * (1 + erf(x / sqrt 2)) -> gelu("none")
    gelu (tanh form)                    0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> gelu("tanh")
    tf.nn.sigmoid_cross_entropy_with_logits (Keras BinaryCrossentropy(from_logits=True))
                                        select(x >= 0, x, 0) - x * z + log1p(exp(select(x >= 0, -x, x)))
                                        -> sigmoid_cross_entropy

A pattern is tried at the TF op that ends it (``PATTERNS``, by op type) before that op's
own mapping (device/capture/tf/table.py); it answers a Plan, or None when the tensor
is not an instance of the pattern.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from device.capture.tf.lowering import Lowering, Pattern
from device.capture.tf.plan import Plan
from device.capture.tf.tensors import (f32, is_type, operand_pairs, read_handle, same, same_op, static_shape,
                                       unwrap_reshape)


def _match_dropout(low: Lowering, tensor) -> Plan | None:
    """select(uniform >= rate, x * 1/(1 - rate), 0): Keras 3 Dropout and tf.nn.dropout."""
    op = tensor.op
    cond, kept, zero = op.inputs
    if not (is_type(cond, "GreaterEqual") and is_type(kept, "Mul") and low.is_const(zero, 0.0)):
        return None
    uniform, rate_t = cond.op.inputs
    rate = low.scalar(rate_t)
    noise, shape = static_shape(uniform), static_shape(tensor)
    if (rate is None or not 0.0 < rate < 1.0 or not _from_random(uniform) or None in noise or None in shape
            or not _broadcasts(noise, shape)):
        return None
    for x, scale in operand_pairs(kept.op):
        if low.is_const(scale, 1.0 / (1.0 - rate)):
            if noise == shape:
                return Plan([x], lambda x=x: low.emit("dropout", [low.value(x)], op, [tensor], {"rate": rate},
                                                         label="Dropout"))
            return Plan([x], lambda x=x: _broadcast_dropout(low, op, tensor, x, noise, rate))
    return None


def _broadcasts(noise: tuple, shape: tuple) -> bool:
    return len(noise) == len(shape) and all(n in (1, d) for n, d in zip(noise, shape))


def _broadcast_dropout(low: Lowering, op, tensor, x, noise: tuple, rate: float) -> None:
    """Dropout(noise_shape=...) (Keras 3's stochastic depth in EfficientNet: one draw per example): the
    device draws a mask of the noise shape, dropout of ones (0 or 1/(1 - rate)), that multiplies x."""
    ones = low.aux("broadcast_to", [low.constant(op, "ones", np.ones((), np.float32))], op, noise, "float32",
                   {"shape": list(noise)})
    mask = low.aux("dropout", [ones], op, noise, "float32", {"rate": rate})
    low.emit("mul", [low.value(x), mask], op, [tensor], label="Dropout")


def _match_gather(low: Lowering, tensor) -> Plan | None:
    """table[ids]: GatherV2 on axis 0 (Keras Embedding wraps negative ids first) or ResourceGather."""
    op = tensor.op
    if op.get_attr("batch_dims") != 0:
        return None
    table, ids = op.inputs[0], op.inputs[1]
    if op.type == "GatherV2" and low.scalar(op.inputs[2]) != 0:
        return None
    ids = _unwrap_negative_ids(ids)
    label = "Embedding" if op.type == "GatherV2" else None
    if op.type == "ResourceGather":
        handle = table.op

        def build():
            low.emit("embedding", [low.variable(handle), low.value(ids)], op, [tensor], label=label)
        return Plan([ids], build)
    return Plan([table, ids], lambda: low.emit("embedding", [low.value(table), low.value(ids)], op, [tensor],
                                                  label=label))


def _match_gelu(low: Lowering, tensor) -> Plan | None:
    """0.5 * x * erfc(-x / sqrt 2), 0.5 * x * (1 + erf(x / sqrt 2)), or the tanh form."""
    factors = _mul_factors(tensor)
    halves = [f for f in factors if low.is_const(f, 0.5)]
    if len(factors) != 3 or len(halves) != 1:
        return None
    rest = list(factors)
    rest.remove(halves[0])
    for x, g in (rest, rest[::-1]):
        approximate = _gelu_form(low, x, g)
        if approximate is not None:
            op = tensor.op
            return Plan([x], lambda x=x: low.emit("gelu", [low.value(x)], op, [tensor],
                                                     {"approximate": approximate}, label="Gelu"))
    return None


def _gelu_form(low: Lowering, x: tf.Tensor, g: tf.Tensor) -> str | None:
    """"none" or "tanh" if ``g`` is the gate of gelu(x), else None."""
    if is_type(g, "Erfc"):  # erfc(-x / sqrt 2)
        inner = _mul_factors(g.op.inputs[0])
        if len(inner) == 2:
            for neg, c in (inner, inner[::-1]):
                if is_type(neg, "Neg") and same(neg.op.inputs[0], x) and low.is_const(c, 2.0**-0.5):
                    return "none"
        return None
    if not is_type(g, "AddV2", "Add"):
        return None
    for one, h in operand_pairs(g.op):
        if not low.is_const(one, 1.0):
            continue
        if is_type(h, "Erf") and _is_scaled(low, h.op.inputs[0], x, 2.0**-0.5):
            return "none"
        if is_type(h, "Tanh") and _is_tanh_gelu_arg(low, h.op.inputs[0], x):
            return "tanh"
    return None


def _is_scaled(low: Lowering, t: tf.Tensor, x: tf.Tensor, factor: float) -> bool:
    """t == x * factor, written as a product or a division."""
    if is_type(t, "Mul"):
        return any(same(a, x) and low.is_const(c, factor) for a, c in operand_pairs(t.op))
    if is_type(t, "RealDiv"):
        return same(t.op.inputs[0], x) and low.is_const(t.op.inputs[1], 1.0 / factor)
    return False


def _is_tanh_gelu_arg(low: Lowering, t: tf.Tensor, x: tf.Tensor) -> bool:
    """t == sqrt(2/pi) * (x + 0.044715 * x**3)."""
    if not is_type(t, "Mul"):
        return False
    for c, inner in operand_pairs(t.op):
        if not (low.is_const(c, np.sqrt(2.0 / np.pi)) and is_type(inner, "AddV2", "Add")):
            continue
        for x0, cubic in operand_pairs(inner.op):
            if not same(x0, x) or not is_type(cubic, "Mul"):
                continue
            for k, power in operand_pairs(cubic.op):
                if (low.is_const(k, 0.044715) and is_type(power, "Pow") and same(power.op.inputs[0], x)
                        and low.is_const(power.op.inputs[1], 3.0)):
                    return True
    return False


def _match_norm(low: Lowering, tensor) -> Plan | None:
    """x * inv + shift with inv = rsqrt(var + eps) [* gamma] over moments of x.

    Moments with kept dims: Keras 3 LayerNormalization -> layer_norm.
    Squeezed moments over every axis but one, whose running averages the graph
    assigns: BatchNormalization in training -> batch_norm. Anything else (e.g.
    BatchNormalization at inference, whose stats are variables) stays elementwise.
    """
    op = tensor.op
    for scaled, shift in operand_pairs(op):
        if not is_type(scaled, "Mul"):
            continue
        for x, inv in operand_pairs(scaled.op):
            parsed = _parse_inv(low, inv)
            if parsed is None:
                continue
            var, eps, gamma = parsed
            shifted = _parse_shift(shift, inv)
            if shifted is None:
                continue
            mean, beta = shifted
            plan = _layer_norm(low, tensor, x, mean, var, eps, gamma, beta)
            if plan is None:
                plan = _batch_norm(low, tensor, x, mean, var, eps, gamma, beta)
            if plan is not None:
                return plan
    return None


def _parse_inv(low: Lowering, inv: tf.Tensor):
    """rsqrt(var + eps) [* gamma] -> (var, eps, gamma or None)."""
    gamma = None
    if is_type(inv, "Mul"):
        for r, g in operand_pairs(inv.op):
            if is_type(r, "Rsqrt"):
                inv, gamma = r, g
                break
        else:
            return None
    if not is_type(inv, "Rsqrt") or not is_type(inv.op.inputs[0], "AddV2", "Add"):
        return None
    for var, eps_t in operand_pairs(inv.op.inputs[0].op):
        eps = low.scalar(eps_t)
        if eps is not None and not is_type(var, "Const"):
            return var, f32(eps), gamma
    return None


def _layer_norm(low: Lowering, tensor, x, mean, var, eps, gamma, beta) -> Plan | None:
    axes = _moments_axes(x, mean, var, keepdims=True)
    if axes is None:
        return None
    norm_shape = [x.shape[a] for a in axes]  # gamma and beta: x's dims at the normalised axes
    gamma, beta = (None if t is None else unwrap_reshape(t) for t in (gamma, beta))
    if any(t is not None and t.shape.as_list() != norm_shape for t in (gamma, beta)):
        return None
    op = tensor.op
    dtype = x.dtype.as_numpy_dtype

    def build():
        g = low.value(gamma) if gamma is not None else low.constant(op, "gamma", np.ones(norm_shape, dtype))
        b = low.value(beta) if beta is not None else low.constant(op, "beta", np.zeros(norm_shape, dtype))
        low.emit("layer_norm", [low.value(x), g, b], op, [tensor], {"axes": axes, "eps": eps},
                   label="LayerNormalization")
    return Plan([t for t in (x, gamma, beta) if t is not None], build)


def _batch_norm(low: Lowering, tensor, x, mean, var, eps, gamma, beta) -> Plan | None:
    mean, var = unwrap_reshape(mean), unwrap_reshape(var)
    if not (is_type(mean, "Squeeze") and is_type(var, "Squeeze")):
        return None
    axes = _moments_axes(x, mean.op.inputs[0], var.op.inputs[0], keepdims=True)
    rank = x.shape.rank
    if axes is None or len(axes) != rank - 1:
        return None
    axis = next(a for a in range(rank) if a not in axes)
    channels = [x.shape[axis]]
    gamma, beta = (None if t is None else unwrap_reshape(t) for t in (gamma, beta))
    if gamma is None or beta is None or any(t.shape.as_list() != channels for t in (gamma, beta)):
        return None
    moving = _moving_averages(low)
    if mean.name not in moving or var.name not in moving:
        return None
    (mean_var, share), (var_var, share_v) = moving[mean.name], moving[var.name]
    if not np.isclose(share, share_v):
        return None
    op = tensor.op
    # the IR's momentum is torch's: the batch statistic's share of the new running value
    # Keras averages the biased batch variance into moving_variance (torch and fused BN: unbiased)
    attrs = {"axis": axis, "eps": eps, "momentum": f32(share), "unbiased_var": False}

    def build():
        low.emit("batch_norm", [low.value(x), low.value(gamma), low.value(beta), low.variable(mean_var),
                                  low.variable(var_var)], op, [tensor], attrs, label="BatchNormalization")
    return Plan([x, gamma, beta], build)


def _moving_averages(low: Lowering) -> dict[str, tuple[tf.Operation, float]]:
    """batch statistic tensor name -> (variable handle, the statistic's share s) of each
    moving average new = (1 - s) * old + s * stat.

    Keras 3: assign(v, v * m + stat * (1 - m)); tf.compat.v1's
    assign_moving_average: assign_sub(v, (v - stat) * (1 - m)). s = 1 - m.
    """
    if low.moving_averages is not None:
        return low.moving_averages
    low.moving_averages = {}
    for op in low.tf_graph.get_operations():
        if op.type not in ("AssignVariableOp", "AssignSubVariableOp") or op.inputs[0].op.type != "VarHandleOp":
            continue
        handle, value = op.inputs[0].op, op.inputs[1]
        found = (_keras_average(low, handle, value) if op.type == "AssignVariableOp"
                 else _v1_average(low, handle, value))
        if found is not None:
            low.moving_averages[found[0].name] = (handle, found[1])
    return low.moving_averages


def _keras_average(low: Lowering, handle, value):
    if not is_type(value, "AddV2", "Add"):
        return None
    for old, new in operand_pairs(value.op):
        if not (is_type(old, "Mul") and is_type(new, "Mul")):
            continue
        for read, m_t in operand_pairs(old.op):
            m = low.scalar(m_t)
            if m is None or not same_op(read_handle(read), handle):
                continue
            for stat, c in operand_pairs(new.op):
                if low.is_const(c, 1.0 - m, rtol=1e-3):
                    return stat, low.scalar(c)
    return None


def _v1_average(low: Lowering, handle, value):
    if not is_type(value, "Mul"):
        return None
    for diff, c_t in operand_pairs(value.op):
        c = low.scalar(c_t)
        if c is not None and is_type(diff, "Sub") and same_op(read_handle(diff.op.inputs[0]), handle):
            return diff.op.inputs[1], c
    return None


# -- small graph helpers for the patterns


def _from_random(tensor: tf.Tensor, depth: int = 4) -> bool:
    """Whether ``tensor`` is a random draw, up to a few affine steps away (uniform * (max - min) + min)."""
    stack = [(tensor, 0)]
    while stack:
        t, d = stack.pop()
        if "Random" in t.op.type:
            return True
        if d < depth and t.op.type in ("AddV2", "Add", "Mul", "Sub"):
            stack.extend((i, d + 1) for i in t.op.inputs)
    return False


def _mul_factors(tensor: tf.Tensor, depth: int = 3) -> list[tf.Tensor]:
    """The operands of a product, nested Muls flattened (a * b * c -> [a, b, c])."""
    if depth == 0 or not is_type(tensor, "Mul"):
        return [tensor]
    a, b = tensor.op.inputs
    return _mul_factors(a, depth - 1) + _mul_factors(b, depth - 1)


def _unwrap_negative_ids(ids: tf.Tensor) -> tf.Tensor:
    """ids behind Keras Embedding's select(ids < 0, ids + n, ids) (negative ids wrap)."""
    if is_type(ids, "SelectV2", "Select"):
        cond, _, plain = ids.op.inputs
        if is_type(cond, "Less") and same(cond.op.inputs[0], plain):
            return plain
    return ids


def _parse_shift(shift: tf.Tensor, inv: tf.Tensor):
    """(mean, beta or None) from the additive part of a normalisation.

    tf.nn.batch_normalization: beta - mean * inv, or -(mean * inv).
    Keras 3 layer_normalization: -mean * inv + beta, or -mean * inv.
    """
    def mean_times_inv(t):  # mean * inv
        if is_type(t, "Mul"):
            for m, i in operand_pairs(t.op):
                if same(i, inv):
                    return m
        return None

    def neg_mean_times_inv(t):  # (-mean) * inv
        m = mean_times_inv(t)
        return m.op.inputs[0] if m is not None and is_type(m, "Neg") else None

    if is_type(shift, "Sub"):
        mean = mean_times_inv(shift.op.inputs[1])
        return None if mean is None else (mean, shift.op.inputs[0])
    if is_type(shift, "Neg"):
        mean = mean_times_inv(shift.op.inputs[0])
        return None if mean is None else (mean, None)
    if is_type(shift, "AddV2", "Add"):
        for part, beta in operand_pairs(shift.op):
            mean = neg_mean_times_inv(part)
            if mean is not None:
                return mean, beta
        return None
    mean = neg_mean_times_inv(shift)
    return None if mean is None else (mean, None)


def _moments_axes(x: tf.Tensor, mean: tf.Tensor, var: tf.Tensor, keepdims: bool) -> list[int] | None:
    """The axes of tf.nn.moments(x): mean = Mean(x), var = Mean((x - stop_gradient(mean))**2)."""
    if not (is_type(mean, "Mean") and is_type(var, "Mean")) or not same(mean.op.inputs[0], x):
        return None
    if bool(mean.op.get_attr("keep_dims")) != keepdims or bool(var.op.get_attr("keep_dims")) != keepdims:
        return None
    sq = var.op.inputs[0]
    if not is_type(sq, "SquaredDifference") or not same(sq.op.inputs[0], x):
        return None
    centre = sq.op.inputs[1]
    if is_type(centre, "StopGradient"):
        centre = centre.op.inputs[0]
    if not same(centre, mean):
        return None
    axes = []
    for t in (mean.op.inputs[1], var.op.inputs[1]):
        value = tf.get_static_value(t)
        if value is None:
            return None
        axes.append(sorted({int(a) % x.shape.rank for a in np.atleast_1d(value)}))
    return axes[0] if axes[0] == axes[1] else None


# TF op type -> the patterns that may end at an op of that type, tried in order
PATTERNS: dict[str, list[Pattern]] = {
    "SelectV2": [_match_dropout], "Select": [_match_dropout],
    "GatherV2": [_match_gather], "ResourceGather": [_match_gather],
    "AddV2": [_match_norm], "Add": [_match_norm],
    "Mul": [_match_gelu],
}


# ---- vision and losses ----


def _match_sigmoid_cross_entropy(low: Lowering, tensor) -> Plan | None:
    """tf.nn.sigmoid_cross_entropy_with_logits(labels=z, logits=x), the stable form TF writes out:
    select(x >= 0, x, 0) - x * z + log1p(exp(select(x >= 0, -x, x)))."""
    op = tensor.op
    for difference, softplus in (op.inputs, op.inputs[::-1]):
        if not (is_type(difference, "Sub") and is_type(softplus, "Log1p")):
            continue
        relu, product = difference.op.inputs
        if not (is_type(relu, "Select", "SelectV2") and is_type(product, "Mul")):
            continue
        cond, x, zero = relu.op.inputs
        if not (is_type(cond, "GreaterEqual") and same(cond.op.inputs[0], x) and _is_zeros(low, zero)):
            continue
        exp = softplus.op.inputs[0]
        if not is_type(exp, "Exp") or not is_type(exp.op.inputs[0], "Select", "SelectV2"):
            continue
        cond2, negated, kept = exp.op.inputs[0].op.inputs
        if not (same(cond2, cond) and is_type(negated, "Neg") and same(negated.op.inputs[0], x) and same(kept, x)):
            continue
        for a, z in operand_pairs(product.op):
            if same(a, x):
                return Plan([x, z], lambda z=z: low.emit("sigmoid_cross_entropy", [low.value(x), low.value(z)], op,
                                                          [tensor], label="sigmoid_cross_entropy_with_logits"))
    return None


def _is_zeros(low: Lowering, tensor) -> bool:
    """zeros_like(x), or a constant of zeros."""
    if is_type(tensor, "ZerosLike"):
        return True
    value = low.const(tensor)
    return value is not None and value.size > 0 and not np.any(value)


for _op_type in ("AddV2", "Add"):
    PATTERNS[_op_type].append(_match_sigmoid_cross_entropy)
