"""Activations (fused as the activation step of dense, conv and batch-norm kernels) and dropout."""

from __future__ import annotations

import math

import numpy as np

from device.ops.arrays import erfc, select_or_zero, unary
from device.ops.record import FLOAT, NUMBERS, OpRecord, per_element, reads_nothing, same_shape
from zoo_base.errors import UserError

_SELU_ALPHA = 1.6732632423543772848170429916717  # torch.nn.SELU's constants
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_K = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def _sigmoid(x, attrs):
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0 gives exactly 0
        return 1 / (1 + np.exp(-x))


def _relu_forward(inputs, attrs, ctx):
    y = np.maximum(inputs[0], 0)
    return [y], y


def _relu_backward(saved, grads, attrs, needs):
    # where, not a multiply by 0/1, as torch's threshold_backward: a NaN arriving from a
    # branch that where() masked out (log(0) * 0) stops here, as in the framework
    g = grads[0]
    return [select_or_zero(saved > 0, g)]


def _clamp_bound(x, bound):
    """A bound in x's dtype. An integer x (a span's start and end positions, clamped before a loss with
    ignore_index) takes integer bounds and stays in its integer dtype: exact beyond 2 ** 24 (float32's
    mantissa) and 2 ** 53 (float64's), never a round trip through a float. A bound beyond the integer
    dtype's range clamps nothing on its side."""
    if not np.issubdtype(x.dtype, np.integer):
        return x.dtype.type(bound)
    if not float(bound).is_integer():
        raise UserError(f"clamp of {x.dtype} values takes integer bounds, got {bound!r}")
    info = np.iinfo(x.dtype)
    return x.dtype.type(max(int(info.min), min(int(info.max), int(bound))))


def _clamp_forward(inputs, attrs, ctx):
    x = inputs[0]
    low, high = attrs.get("min"), attrs.get("max")
    y = x
    if low is not None:
        y = np.maximum(y, _clamp_bound(x, low))
    if high is not None:
        y = np.minimum(y, _clamp_bound(x, high))
    return [y], x


def _clamp_backward(saved, grads, attrs, needs):
    # the gradient passes strictly inside the bounds, as torch's clamp, hardtanh (ReLU6) and TF's Relu6Grad:
    # a batch norm's shift starts at 0, so a channel the batch leaves constant sits exactly on ReLU6's
    # lower bound, and a maximum (whose ties share the gradient) would pass half of it
    x, low, high = saved, attrs.get("min"), attrs.get("max")
    inside = np.ones(x.shape, dtype=bool)
    if low is not None:
        inside &= x > low
    if high is not None:
        inside &= x < high
    return [select_or_zero(inside, grads[0])]


def _gelu_forward(inputs, attrs, ctx):
    x = inputs[0]
    if attrs.get("approximate", "none") == "tanh":
        t = np.tanh(_GELU_TANH_K * (x + _GELU_TANH_C * x * x * x))
        return [0.5 * x * (1 + t)], (x, t)
    cdf = 0.5 * erfc(-x / _SQRT_2)  # Phi(x)
    return [x * cdf], (x, cdf)


def _gelu_backward(saved, grads, attrs, needs):
    x, aux = saved
    if attrs.get("approximate", "none") == "tanh":
        t = aux
        du = _GELU_TANH_K * (1 + 3 * _GELU_TANH_C * x * x)
        return [grads[0] * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * du)]
    cdf = aux
    return [grads[0] * (cdf + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x))]


def _dropout_forward(inputs, attrs, ctx):
    x = inputs[0]
    rate = float(attrs["rate"])
    if not ctx.training or rate == 0.0:
        return [x], None
    if rate >= 1.0:
        scale = np.zeros_like(x)
    else:
        # inverted dropout: kept values are scaled by 1/(1-rate) so eval needs nothing
        keep = ctx.rng.random(x.shape, dtype=np.float32) >= rate
        scale = keep.astype(x.dtype) * (1.0 / (1.0 - rate))
    return [x * scale], scale


def _dropout_backward(saved, grads, attrs, needs):
    return [grads[0] if saved is None else grads[0] * saved]


def _softplus_forward(inputs, attrs, ctx):
    x = inputs[0]
    beta = float(attrs.get("beta", 1.0))
    bx = beta * x
    y = np.logaddexp(0, bx) / beta  # log(1 + e ** bx) / beta, without overflow for large bx
    threshold = attrs.get("threshold")
    if threshold is not None:  # torch returns x itself above the threshold
        y = np.where(bx > threshold, x, y)
    return [y], (bx, threshold)


def _softplus_backward(saved, grads, attrs, needs):
    bx, threshold = saved
    slope = _sigmoid(bx, attrs)
    if threshold is not None:
        slope = np.where(bx > threshold, 1, slope)
    return [grads[0] * slope]


def _activation(name: str, summary: str, kernel: dict, flops: int, attrs=(), dtypes=FLOAT) -> OpRecord:
    # flops per element: a short polynomial or exp evaluation
    return OpRecord(name, summary, ("x",), attrs, "activation", (dtypes,), same_shape, cost=per_element(flops),
                    **kernel)


RECORDS = (
    _activation("relu", "max(x, 0); the gradient is selected, not multiplied (an inf or NaN stays out)",
                {"forward": _relu_forward, "backward": _relu_backward}, 1),
    # integers too: Hugging Face's question-answering heads clamp the start and end positions
    _activation("clamp", "x limited to [min, max] (either optional); the gradient passes strictly inside (torch's "
                "clamp, hardtanh and ReLU6, TF's Relu6); ints: integer bounds, exact in the int dtype, no gradient",
                {"forward": _clamp_forward, "backward": _clamp_backward}, 2, attrs=("min?", "max?"), dtypes=NUMBERS),
    _activation("tanh", "hyperbolic tangent", unary(lambda x, at: np.tanh(x), lambda x, y, at: 1 - y * y), 4),
    _activation("sigmoid", "1 / (1 + e ** -x)", unary(_sigmoid, lambda x, y, at: y * (1 - y)), 4),
    # elu/selu as torch: alpha * expm1(x) below zero, derivative alpha * exp(x) for x <= 0
    _activation("elu", "x above 0, alpha * (e ** x - 1) below (alpha default 1)", unary(
        lambda x, at: np.where(x > 0, x, float(at.get("alpha", 1.0)) * np.expm1(np.minimum(x, 0))),
        lambda x, y, at: np.where(x > 0, 1, float(at.get("alpha", 1.0)) * np.exp(np.minimum(x, 0)))), 3,
        attrs=("alpha?",)),
    _activation("selu", "scale * elu(x, alpha) with torch.nn.SELU's constants", unary(
        lambda x, at: _SELU_SCALE * np.where(x > 0, x, _SELU_ALPHA * np.expm1(np.minimum(x, 0))),
        lambda x, y, at: _SELU_SCALE * np.where(x > 0, 1, _SELU_ALPHA * np.exp(np.minimum(x, 0)))), 4),
    _activation("gelu", "x * Phi(x); approximate: \"none\" (erf) or \"tanh\"",
                {"forward": _gelu_forward, "backward": _gelu_backward}, 8, attrs=("approximate?",)),
    _activation("softplus", "log(1 + e ** (beta * x)) / beta (beta default 1); x where beta * x > threshold",
                {"forward": _softplus_forward, "backward": _softplus_backward}, 4, attrs=("beta?", "threshold?")),
    # inverted dropout, identity at eval: an elementwise op, not an activation step
    OpRecord("dropout", "x * mask / (1 - rate) in training, x at eval", ("x",), ("rate",), "elementwise", (FLOAT,),
             same_shape, _dropout_forward, _dropout_backward, cost=per_element(2),  # compare a random number, scale
             backward_reads=reads_nothing),
)
