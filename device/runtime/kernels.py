"""Numpy kernels for every op of the device IR: forward and gradient, in one table.

``KERNELS[op]`` is the living definition of what ``op`` means (device/ir.py lists the
ops, their inputs and attributes). Each entry holds:

    forward(inputs, attrs, ctx) -> (outputs, saved)
        inputs: the node's input arrays, in the order OPS names them; ctx: a
        KernelContext (training flag and the random generator dropout draws from).
        ``saved`` is whatever the gradient needs; the program keeps it until backward.
    backward(saved, grads, attrs, needs) -> one gradient per input
        grads: one array per output (None where no gradient flows); needs: one bool per
        input, False where nobody wants that gradient, so that an expensive kernel can
        skip it (the first layer's input gradient is a third of an MLP's backward).
        A gradient is None for inputs without one (integer ids and labels, skipped
        inputs). ``backward`` is None for ops no gradient flows through (argmax, equal).
    state_updates: (output index, input index) pairs: in training, that output is the
        new value of that (non-trainable state) input: batch_norm's running statistics.

Conventions: numpy broadcasting for elementwise ops (their gradients sum back over the
broadcast axes); a kernel keeps its inputs' float dtype (python scalars only, never a
numpy float64 scalar, which would promote float32 arrays); gradients never write into
their inputs, because one gradient array may be shared by several consumers.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from device.runtime.precision import FLOAT_DTYPES, FORMATS, round_to
from zoo_base.errors import UserError


@dataclass
class KernelContext:
    training: bool = False
    rng: np.random.Generator | None = None


Forward = Callable[[list[np.ndarray], dict, KernelContext], tuple[list[np.ndarray], Any]]
Backward = Callable[[Any, list, dict, tuple[bool, ...]], list]


@dataclass(frozen=True)
class Kernel:
    forward: Forward
    backward: Backward | None
    state_updates: tuple[tuple[int, int], ...] = ()


# ---------------------------------------------------------------------------- helpers


def _unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a gradient of a broadcast result back to the operand's ``shape``."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape)


def _axes(axes, ndim: int) -> tuple[int, ...]:
    """Reduction axes as non-negative ints; None means all."""
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = [axes]
    return tuple(sorted(int(a) % ndim for a in axes))


def _param_shape(ndim: int, axes: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Shape that broadcasts a per-``axes`` parameter (gamma, beta) against x."""
    return [shape[i] if i in axes else 1 for i in range(ndim)]


def _elementwise(fn: Callable, derivative: Callable) -> Kernel:
    """A unary kernel from y = fn(x, attrs) and dy/dx = derivative(x, y, attrs)."""

    def forward(inputs, attrs, ctx):
        x = inputs[0]
        y = fn(x, attrs)
        return [y], (x, y)

    def backward(saved, grads, attrs, needs):
        x, y = saved
        return [grads[0] * derivative(x, y, attrs)]

    return Kernel(forward, backward)


def _binary(fn: Callable, grad_a: Callable, grad_b: Callable) -> Kernel:
    """A broadcasting binary kernel; grad_a/grad_b(g, a, b, y) before un-broadcasting."""

    def forward(inputs, attrs, ctx):
        a, b = inputs
        y = fn(a, b)
        return [y], (a, b, y)

    def backward(saved, grads, attrs, needs):
        a, b, y = saved
        g = grads[0]
        return [_unbroadcast(grad_a(g, a, b, y), a.shape) if needs[0] else None,
                _unbroadcast(grad_b(g, a, b, y), b.shape) if needs[1] else None]

    return Kernel(forward, backward)


def _no_grad(fn: Callable) -> Kernel:
    def forward(inputs, attrs, ctx):
        return [fn(inputs, attrs)], None

    return Kernel(forward, None)


# ------------------------------------------------------------------ elementwise math


def _identity_backward(saved, grads, attrs, needs):
    # tf.stop_gradient is captured as an identity marked stop_gradient (device/capture/tf.py)
    return [None if attrs.get("stop_gradient") else grads[0]]


def _maximum_weight(a, b, dtype):
    # ties split the gradient in halves, as torch.maximum does (TF gives it all to a;
    # ties have measure zero for real data)
    return np.where(a == b, dtype.type(0.5), (a > b).astype(dtype))


def _sigmoid(x, attrs):
    with np.errstate(over="ignore"):  # exp(-x) -> inf for x << 0 gives exactly 0
        return 1 / (1 + np.exp(-x))


def _cast_forward(inputs, attrs, ctx):
    x = inputs[0]
    dtype = attrs["dtype"]
    # the 16-bit formats are stored as float32, rounded to the format
    y = round_to(x, dtype) if dtype in FLOAT_DTYPES else x.astype(dtype)
    return [y], (x.dtype, dtype)


def _cast_backward(saved, grads, attrs, needs):
    in_dtype, out_dtype = saved
    if not (np.issubdtype(in_dtype, np.floating) and (out_dtype in FLOAT_DTYPES or out_dtype == "float64")):
        return [None]
    g = grads[0]
    # the gradient of a 16-bit value is itself 16-bit (as torch's .to(bfloat16) backward)
    if out_dtype in FORMATS:
        g = round_to(g, out_dtype)
    return [g.astype(in_dtype, copy=False)]


# ---------------------------------------------------------------------- activations

_SELU_ALPHA = 1.6732632423543772848170429916717  # torch.nn.SELU's constants
_SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2 = math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_GELU_TANH_K = math.sqrt(2.0 / math.pi)
_GELU_TANH_C = 0.044715


def _erfc(x: np.ndarray) -> np.ndarray:
    """erfc to float32 accuracy (numpy has none): relative error below 1.2e-7 everywhere.

    The Chebyshev fit from Press et al., Numerical Recipes (2nd ed.), 6.2, "erfcc".
    gelu uses Phi(x) = erfc(-x / sqrt(2)) / 2, which stays relatively exact for x << 0
    where 1 + erf(x / sqrt(2)) would cancel to zero.
    """
    z = np.abs(x)
    t = 1 / (1 + 0.5 * z)
    poly = -1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))
    tail = t * np.exp(poly - z * z)  # erfc(|x|)
    return np.where(x >= 0, tail, 2 - tail)


def _gelu_forward(inputs, attrs, ctx):
    x = inputs[0]
    if attrs.get("approximate", "none") == "tanh":
        t = np.tanh(_GELU_TANH_K * (x + _GELU_TANH_C * x * x * x))
        return [0.5 * x * (1 + t)], (x, t)
    cdf = 0.5 * _erfc(-x / _SQRT_2)  # Phi(x)
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


# -------------------------------------------------------------------- linear algebra


def _matmul_forward(inputs, attrs, ctx):
    a, b = inputs  # (..., M, K) @ (..., K, N) -> (..., M, N), numpy's rules
    return [np.matmul(a, b)], (a, b)


def _matmul_backward(saved, grads, attrs, needs):
    a, b = saved
    g = grads[0]
    # numpy promotes a 1-D a (K,) to (1, K) and a 1-D b (K,) to (K, 1), then drops the dim
    if a.ndim == 1:
        g = np.expand_dims(g, -1 if b.ndim == 1 else -2)
    if b.ndim == 1:
        g = np.expand_dims(g, -1)
    a2 = a[None, :] if a.ndim == 1 else a  # (..., M, K)
    b2 = b[:, None] if b.ndim == 1 else b  # (..., K, N)
    ga = gb = None
    if needs[0]:
        if b2.ndim == 2 and a2.ndim > 2:  # one weight for every batch: a single GEMM
            ga = (g.reshape(-1, g.shape[-1]) @ b2.T).reshape(a2.shape)
        else:
            ga = _unbroadcast(np.matmul(g, np.swapaxes(b2, -1, -2)), a2.shape)
        ga = ga.reshape(a.shape)
    if needs[1]:
        if b2.ndim == 2:  # sum over the batch folded into the GEMM's inner dimension
            a_rows, g_rows = a2.reshape(-1, a2.shape[-1]), g.reshape(-1, g.shape[-1])  # (R, K), (R, N)
            if b2.flags.f_contiguous and not b2.flags.c_contiguous:
                # b is a transposed view of an (N, K) weight (torch's Linear): give the
                # gradient that weight's layout, so the optimizer reads it contiguously
                gb = (g_rows.T @ a_rows).T
            else:
                gb = a_rows.T @ g_rows
        else:
            gb = _unbroadcast(np.matmul(np.swapaxes(a2, -1, -2), g), b2.shape)
        gb = gb.reshape(b.shape)
    return [ga, gb]


def _einsum_specs(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Explicit subscripts, one letter per dimension: '...' and implicit outputs resolved."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    unused = [c for c in string.ascii_letters if c not in eq]
    counts = [len(shape) - (len(s) - 3) for s, shape in zip(specs, shapes) if "..." in s]
    ellipsis = "".join(unused[: max(counts, default=0)])
    # an operand with k ellipsis dims takes the last k letters (numpy aligns them right)
    specs = [s.replace("...", ellipsis[len(ellipsis) - (len(shape) - (len(s) - 3)):]) if "..." in s else s
             for s, shape in zip(specs, shapes)]
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:  # numpy's implicit mode: ellipsis dims, then letters seen once, sorted
        letters = "".join(specs)
        out = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return specs, out


def _einsum_forward(inputs, attrs, ctx):
    specs, out = _einsum_specs(attrs["equation"], [x.shape for x in inputs])
    y = np.einsum(",".join(specs) + "->" + out, *inputs, optimize=True)
    return [y], (inputs, specs, out)


def _einsum_backward(saved, grads, attrs, needs):
    inputs, specs, out = saved
    g = grads[0]
    result = []
    for i, (x, spec) in enumerate(zip(inputs, specs)):
        if not needs[i]:
            result.append(None)
            continue
        others = [s for j, s in enumerate(specs) if j != i]
        target = "".join(dict.fromkeys(spec))  # repeated letters (a diagonal) once
        size = {c: n for c, n in zip(spec, x.shape)}
        # letters summed away inside this operand alone get a constant gradient
        known = "".join(c for c in target if c in out or any(c in s for s in others))
        grad = np.einsum(",".join([out] + others) + "->" + known, g,
                         *[x_j for j, x_j in enumerate(inputs) if j != i], optimize=True)
        # size-1 dims numpy broadcast against other operands: sum back
        squeeze = tuple(k for k, c in enumerate(known) if size[c] == 1 and grad.shape[k] != 1)
        if squeeze:
            grad = grad.sum(axis=squeeze, keepdims=True)
        grad = np.broadcast_to(grad.reshape([size[c] if c in known else 1 for c in target]),
                               [size[c] for c in target])
        if len(target) < len(spec):  # scatter onto the diagonal of a zero operand
            full = np.zeros(x.shape, dtype=grad.dtype)
            np.einsum(spec + "->" + target, full)[...] = grad  # a writeable diagonal view
            grad = full
        result.append(grad)
    return result


# ------------------------------------------------------------------------------ shape


def _reshape_forward(inputs, attrs, ctx):
    x = inputs[0]
    return [x.reshape(attrs["shape"])], x.shape


def _transpose_forward(inputs, attrs, ctx):
    perm = attrs["perm"]
    return [np.transpose(inputs[0], perm)], np.argsort(perm)


def _concat_forward(inputs, attrs, ctx):
    axis = attrs["axis"]
    return [np.concatenate(inputs, axis=axis)], [x.shape[axis] for x in inputs]


def _concat_backward(saved, grads, attrs, needs):
    return np.split(grads[0], np.cumsum(saved)[:-1], axis=attrs["axis"])


def _slice_index(attrs, ndim: int) -> tuple[slice, ...]:
    begin, end = attrs["begin"], attrs["end"]
    step = attrs.get("step") or [1] * len(begin)
    return tuple(slice(b, e, s) for b, e, s in zip(begin, end, step)) + (slice(None),) * (ndim - len(begin))


def _slice_forward(inputs, attrs, ctx):
    x = inputs[0]
    index = _slice_index(attrs, x.ndim)
    return [x[index]], (x.shape, index)


def _slice_backward(saved, grads, attrs, needs):
    shape, index = saved
    g = np.zeros(shape, dtype=grads[0].dtype)
    g[index] = grads[0]
    return [g]


# ------------------------------------------------------------------------- reductions


def _reduce_forward(fn):
    def forward(inputs, attrs, ctx):
        x = inputs[0]
        axes = _axes(attrs.get("axes"), x.ndim)
        keepdims = bool(attrs.get("keepdims", False))
        y = fn(x, axis=axes, keepdims=keepdims)
        return [y], (x, axes, keepdims, y)

    return forward


def _expand_reduced(g, axes, keepdims):
    return g if keepdims else np.expand_dims(g, axes)


def _reduce_sum_backward(saved, grads, attrs, needs):
    x, axes, keepdims, _ = saved
    return [np.broadcast_to(_expand_reduced(grads[0], axes, keepdims), x.shape)]


def _reduce_mean_backward(saved, grads, attrs, needs):
    x, axes, keepdims, _ = saved
    count = math.prod(x.shape[a] for a in axes)
    return [np.broadcast_to(_expand_reduced(grads[0], axes, keepdims) / count, x.shape)]


def _reduce_max_backward(saved, grads, attrs, needs):
    x, axes, keepdims, y = saved
    # ties share the gradient equally (torch.amax and tf.reduce_max agree)
    winners = (x == _expand_reduced(y, axes, keepdims)).astype(x.dtype)
    share = winners / winners.sum(axis=axes, keepdims=True)
    return [_expand_reduced(grads[0], axes, keepdims) * share]


# ------------------------------------------------------------ normalisation, softmax


def _softmax_forward(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs["axis"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    return [y], y


def _softmax_backward(saved, grads, attrs, needs):
    y, g = saved, grads[0]
    return [y * (g - (g * y).sum(axis=attrs["axis"], keepdims=True))]


def _log_softmax_forward(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs["axis"]
    shifted = x - x.max(axis=axis, keepdims=True)
    y = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return [y], y


def _log_softmax_backward(saved, grads, attrs, needs):
    y, g = saved, grads[0]
    return [g - np.exp(y) * g.sum(axis=attrs["axis"], keepdims=True)]


def _normalize_backward(g, xhat, rstd, gamma_b, axes):
    """dL/dx of y = xhat * gamma + beta where xhat = (x - mean(x)) * rstd over ``axes``."""
    dxhat = g * gamma_b
    return rstd * (dxhat - dxhat.mean(axis=axes, keepdims=True)
                   - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True))


def _layer_norm_forward(inputs, attrs, ctx):
    x, gamma, beta = inputs  # gamma, beta: the shape of x's dims at ``axes``
    axes = _axes(attrs["axes"], x.ndim)
    pshape = _param_shape(x.ndim, axes, x.shape)
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + float(attrs["eps"]))  # biased variance
    xhat = xc * rstd
    return [xhat * gamma.reshape(pshape) + beta.reshape(pshape)], (xhat, rstd, gamma, pshape, axes)


def _layer_norm_backward(saved, grads, attrs, needs):
    xhat, rstd, gamma, pshape, axes = saved
    g = grads[0]
    others = tuple(i for i in range(g.ndim) if i not in axes)
    dgamma = (g * xhat).sum(axis=others).reshape(gamma.shape)
    dbeta = g.sum(axis=others).reshape(gamma.shape)
    return [_normalize_backward(g, xhat, rstd, gamma.reshape(pshape), axes), dgamma, dbeta]


def _batch_norm_forward(inputs, attrs, ctx):
    x, gamma, beta, running_mean, running_var = inputs  # x: channels at ``axis``; the rest (C,)
    axis = attrs["axis"] % x.ndim
    others = tuple(i for i in range(x.ndim) if i != axis)
    pshape = _param_shape(x.ndim, (axis,), x.shape)  # [1, C, 1, 1] for NCHW
    momentum = float(attrs["momentum"])
    if ctx.training:
        n = x.size // x.shape[axis]
        if n < 2:
            raise UserError(f"batch_norm in training needs more than one value per channel, got input {x.shape}")
        mean = x.mean(axis=others)
        xc = x - mean.reshape(pshape)
        var = (xc * xc).mean(axis=others)  # biased: normalises the batch
        # torch's convention: new = (1 - m) * old + m * batch
        new_mean = (1 - momentum) * running_mean + momentum * mean
        # torch averages the unbiased batch variance, Keras the biased one (attr unbiased_var=False)
        correction = n / (n - 1) if attrs.get("unbiased_var", True) else 1.0
        new_var = (1 - momentum) * running_var + momentum * correction * var
    else:
        var = running_var
        xc = x - running_mean.reshape(pshape)
        new_mean, new_var = running_mean, running_var
    rstd = (1 / np.sqrt(var + float(attrs["eps"]))).reshape(pshape)
    xhat = xc * rstd
    y = xhat * gamma.reshape(pshape) + beta.reshape(pshape)
    return [y, new_mean, new_var], (xhat, rstd, gamma, pshape, others, ctx.training)


def _batch_norm_backward(saved, grads, attrs, needs):
    xhat, rstd, gamma, pshape, others, training = saved
    g = grads[0]
    dgamma = (g * xhat).sum(axis=others)
    dbeta = g.sum(axis=others)
    if training:
        dx = _normalize_backward(g, xhat, rstd, gamma.reshape(pshape), others)
    else:  # fixed statistics: an affine map
        dx = g * (gamma.reshape(pshape) * rstd)
    return [dx, dgamma, dbeta, None, None]


# ----------------------------------------------------------------------------- vision


def _pair(v) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    if len(v) != 2:
        raise ValueError(f"expected an int or a pair (height, width), got {v!r}")
    return int(v[0]), int(v[1])


def _to_nhwc(x, layout):
    return x.transpose(0, 2, 3, 1) if layout == "NCHW" else x


def _from_nhwc(x, layout):
    return x.transpose(0, 3, 1, 2) if layout == "NCHW" else x


def _pads(padding, in_hw, kernel, strides, dilations) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per-side padding ((top, bottom), (left, right)) from explicit ints, "SAME" or "VALID"."""
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return (0, 0), (0, 0)
        if padding.upper() != "SAME":
            raise ValueError(f"padding must be SAME, VALID or [[top, bottom], [left, right]], got {padding!r}")
        pads = []
        for n, k, s, d in zip(in_hw, kernel, strides, dilations):
            # TensorFlow's rule: out = ceil(n / s); the odd pixel of padding goes at the end
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            pads.append((total // 2, total - total // 2))
        return pads[0], pads[1]
    (top, bottom), (left, right) = padding
    return (int(top), int(bottom)), (int(left), int(right))


def _windows(xp, kernel, strides, dilations):
    """Every kernel window of a padded NHWC input: a view (N, Ho, Wo, kh, kw, C)."""
    n, hp, wp, c = xp.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    ho = (hp - (kh - 1) * dh - 1) // sh + 1
    wo = (wp - (kw - 1) * dw - 1) // sw + 1
    s_n, s_h, s_w, s_c = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, ho, wo, kh, kw, c), (s_n, s_h * sh, s_w * sw, s_h * dh, s_w * dw, s_c), writeable=False)


def _col2im(dwin, padded_shape, strides, dilations, dtype):
    """Adjoint of _windows: sum each window's gradient (N, Ho, Wo, kh, kw, C) into place.

    One strided add per kernel tap (kh * kw of them), never a loop over pixels.
    """
    _, ho, wo, kh, kw, _ = dwin.shape
    (sh, sw), (dh, dw) = strides, dilations
    out = np.zeros(padded_shape, dtype=dtype)
    for i in range(kh):
        rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)  # the Ho input rows tap i reads
        for j in range(kw):
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            out[:, rows, cols, :] += dwin[:, :, :, i, j, :]
    return out


def _crop(xp, pads):
    (top, bottom), (left, right) = pads
    return xp[:, top: xp.shape[1] - bottom, left: xp.shape[2] - right, :]


def _conv2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = _to_nhwc(inputs[0], layout)  # (N, H, W, C)
    w = inputs[1] if attrs.get("weight_layout", "OIHW") == "HWIO" else inputs[1].transpose(2, 3, 1, 0)  # (kh, kw, C, O)
    kh, kw, c, o = w.shape
    strides, dilations = _pair(attrs.get("strides", 1)), _pair(attrs.get("dilations", 1))
    pads = _pads(attrs.get("padding", "VALID"), x.shape[1:3], (kh, kw), strides, dilations)
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    win = _windows(xp, (kh, kw), strides, dilations)  # (N, Ho, Wo, kh, kw, C)
    n, ho, wo = win.shape[:3]
    cols = win.reshape(n * ho * wo, kh * kw * c)  # im2col: one row per output pixel
    w2 = w.reshape(kh * kw * c, o)
    y = (cols @ w2).reshape(n, ho, wo, o)
    return [_from_nhwc(y, layout)], (cols, w2, w.shape, win.shape, xp.shape, pads, strides, dilations)


def _conv2d_backward(saved, grads, attrs, needs):
    cols, w2, w_shape, win_shape, padded_shape, pads, strides, dilations = saved
    layout = attrs.get("layout", "NCHW")
    g2 = _to_nhwc(grads[0], layout).reshape(cols.shape[0], -1)  # (N*Ho*Wo, O)
    dx = dw = None
    if needs[0]:
        dwin = (g2 @ w2.T).reshape(win_shape)  # (N, Ho, Wo, kh, kw, C)
        dx = _from_nhwc(_crop(_col2im(dwin, padded_shape, strides, dilations, g2.dtype), pads), layout)
    if needs[1]:
        dw = (cols.T @ g2).reshape(w_shape)  # (kh, kw, C, O)
        if attrs.get("weight_layout", "OIHW") != "HWIO":
            dw = dw.transpose(3, 2, 0, 1)  # (O, C, kh, kw)
    return [dx, dw]


def _pool_setup(x, attrs, fill):
    """Padded NHWC windows of a pooling op: (windows, padded shape, pads, strides)."""
    kernel = _pair(attrs["kernel"])
    strides = _pair(attrs.get("strides") or kernel)
    pads = _pads(attrs.get("padding", "VALID"), x.shape[1:3], kernel, strides, (1, 1))
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=fill)
    return _windows(xp, kernel, strides, (1, 1)), xp.shape, pads, strides


def _max_pool2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = _to_nhwc(inputs[0], layout)
    win, padded_shape, pads, strides = _pool_setup(x, attrs, -np.inf)  # padding never wins
    n, ho, wo, kh, kw, c = win.shape
    flat = win.reshape(n, ho, wo, kh * kw, c)
    idx = flat.argmax(axis=3)[:, :, :, None, :]  # the first maximum gets the gradient, as in torch
    y = np.take_along_axis(flat, idx, axis=3)[:, :, :, 0, :]
    return [_from_nhwc(y, layout)], (idx, win.shape, padded_shape, pads, strides)


def _max_pool2d_backward(saved, grads, attrs, needs):
    idx, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = _to_nhwc(grads[0], layout)  # (N, Ho, Wo, C)
    n, ho, wo, kh, kw, c = win_shape
    dwin = np.zeros((n, ho, wo, kh * kw, c), dtype=g.dtype)
    np.put_along_axis(dwin, idx, g[:, :, :, None, :], axis=3)
    dxp = _col2im(dwin.reshape(win_shape), padded_shape, strides, (1, 1), g.dtype)
    return [_from_nhwc(_crop(dxp, pads), layout)]


def _avg_pool_count(x_hw, attrs, pads, strides, dtype):
    """Divisor per output pixel: the window size, or its unpadded part.

    "SAME" averages over the input pixels only (TensorFlow); explicit padding counts the
    zeros (torch's default count_include_pad=True); an attr count_include_pad overrides.
    """
    kernel = _pair(attrs["kernel"])
    padding = attrs.get("padding", "VALID")
    if attrs.get("count_include_pad", not isinstance(padding, str)):
        return float(kernel[0] * kernel[1])
    ones = np.pad(np.ones((1, *x_hw, 1), dtype=dtype), ((0, 0), pads[0], pads[1], (0, 0)))
    return _windows(ones, kernel, strides, (1, 1)).sum(axis=(3, 4))  # (1, Ho, Wo, 1)


def _avg_pool2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = _to_nhwc(inputs[0], layout)
    win, padded_shape, pads, strides = _pool_setup(x, attrs, 0)
    count = _avg_pool_count(x.shape[1:3], attrs, pads, strides, x.dtype)
    y = win.sum(axis=(3, 4)) / count  # (N, Ho, Wo, C)
    return [_from_nhwc(y, layout)], (count, win.shape, padded_shape, pads, strides)


def _avg_pool2d_backward(saved, grads, attrs, needs):
    count, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = _to_nhwc(grads[0], layout) / count  # (N, Ho, Wo, C)
    dwin = np.broadcast_to(g[:, :, :, None, None, :], win_shape)
    dxp = _col2im(dwin, padded_shape, strides, (1, 1), g.dtype)
    return [_from_nhwc(_crop(dxp, pads), layout)]


# ------------------------------------------------------------------ language, losses


def _check_ids(ids, limit, what):
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        raise UserError(f"{what} out of range: values in [{ids.min()}, {ids.max()}], expected [0, {limit})")


def _embedding_forward(inputs, attrs, ctx):
    table, ids = inputs  # (V, D), (...) ints -> (..., D)
    _check_ids(ids, table.shape[0], "embedding ids")
    return [np.take(table, ids, axis=0)], (table.shape, ids)


def _embedding_backward(saved, grads, attrs, needs):
    table_shape, ids = saved
    g = grads[0]
    dtable = np.zeros(table_shape, dtype=g.dtype)
    np.add.at(dtable, ids.reshape(-1), g.reshape(-1, table_shape[1]))  # repeated ids add up
    return [dtable, None]


def _cross_entropy_forward(inputs, attrs, ctx):
    logits, labels = inputs  # (..., C), (...) ints -> per-example loss (...)
    _check_ids(labels, logits.shape[-1], "labels")
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    picked = np.take_along_axis(shifted, labels[..., None], axis=-1)
    loss = (np.log(total) - picked)[..., 0]
    return [loss], (e / total, labels)


def _cross_entropy_backward(saved, grads, attrs, needs):
    probs, labels = saved
    g = grads[0][..., None]  # (..., 1)
    dlogits = probs * g  # softmax - one_hot(label), times the upstream gradient
    index = labels[..., None]
    np.put_along_axis(dlogits, index, np.take_along_axis(dlogits, index, axis=-1) - g, axis=-1)
    return [dlogits, None]


# ----------------------------------------------------------------------------- table

KERNELS: dict[str, Kernel] = {
    # elementwise, numpy broadcasting
    "add": _binary(np.add, lambda g, a, b, y: g, lambda g, a, b, y: g),
    "sub": _binary(np.subtract, lambda g, a, b, y: g, lambda g, a, b, y: -g),
    "mul": _binary(np.multiply, lambda g, a, b, y: g * b, lambda g, a, b, y: g * a),
    "div": _binary(np.divide, lambda g, a, b, y: g / b, lambda g, a, b, y: -g * y / b),
    "maximum": _binary(np.maximum, lambda g, a, b, y: g * _maximum_weight(a, b, g.dtype),
                       lambda g, a, b, y: g * (1 - _maximum_weight(a, b, g.dtype))),
    "neg": _elementwise(lambda x, at: -x, lambda x, y, at: -1),
    "exp": _elementwise(lambda x, at: np.exp(x), lambda x, y, at: y),
    "erf": _elementwise(lambda x, at: 1 - _erfc(x), lambda x, y, at: (2 / math.sqrt(math.pi)) * np.exp(-x * x)),
    "log": _elementwise(lambda x, at: np.log(x), lambda x, y, at: 1 / x),
    "sqrt": _elementwise(lambda x, at: np.sqrt(x), lambda x, y, at: 0.5 / y),
    "rsqrt": _elementwise(lambda x, at: 1 / np.sqrt(x), lambda x, y, at: -0.5 * y * y * y),
    "square": _elementwise(lambda x, at: x * x, lambda x, y, at: 2 * x),
    "identity": Kernel(lambda inputs, attrs, ctx: ([inputs[0]], None), _identity_backward),
    "cast": Kernel(_cast_forward, _cast_backward),
    # activations
    "relu": _elementwise(lambda x, at: np.maximum(x, 0), lambda x, y, at: y > 0),
    "tanh": _elementwise(lambda x, at: np.tanh(x), lambda x, y, at: 1 - y * y),
    "sigmoid": _elementwise(_sigmoid, lambda x, y, at: y * (1 - y)),
    # elu/selu as torch: alpha * expm1(x) below zero, derivative alpha * exp(x) for x <= 0
    "elu": _elementwise(lambda x, at: np.where(x > 0, x, float(at.get("alpha", 1.0)) * np.expm1(np.minimum(x, 0))),
                        lambda x, y, at: np.where(x > 0, 1, float(at.get("alpha", 1.0)) * np.exp(np.minimum(x, 0)))),
    "selu": _elementwise(
        lambda x, at: _SELU_SCALE * np.where(x > 0, x, _SELU_ALPHA * np.expm1(np.minimum(x, 0))),
        lambda x, y, at: _SELU_SCALE * np.where(x > 0, 1, _SELU_ALPHA * np.exp(np.minimum(x, 0)))),
    "gelu": Kernel(_gelu_forward, _gelu_backward),
    "dropout": Kernel(_dropout_forward, _dropout_backward),
    # linear algebra
    "matmul": Kernel(_matmul_forward, _matmul_backward),
    "einsum": Kernel(_einsum_forward, _einsum_backward),
    # shape
    "reshape": Kernel(_reshape_forward, lambda shape, grads, attrs, needs: [grads[0].reshape(shape)]),
    "transpose": Kernel(_transpose_forward, lambda inverse, grads, attrs, needs: [np.transpose(grads[0], inverse)]),
    "concat": Kernel(_concat_forward, _concat_backward),
    "slice": Kernel(_slice_forward, _slice_backward),
    "broadcast_to": Kernel(lambda inputs, attrs, ctx: ([np.broadcast_to(inputs[0], attrs["shape"])], inputs[0].shape),
                           lambda shape, grads, attrs, needs: [_unbroadcast(grads[0], shape)]),
    # reductions
    "reduce_sum": Kernel(_reduce_forward(np.sum), _reduce_sum_backward),
    "reduce_mean": Kernel(_reduce_forward(np.mean), _reduce_mean_backward),
    "reduce_max": Kernel(_reduce_forward(np.max), _reduce_max_backward),
    # normalisation and softmax
    "softmax": Kernel(_softmax_forward, _softmax_backward),
    "log_softmax": Kernel(_log_softmax_forward, _log_softmax_backward),
    "layer_norm": Kernel(_layer_norm_forward, _layer_norm_backward),
    "batch_norm": Kernel(_batch_norm_forward, _batch_norm_backward, state_updates=((1, 3), (2, 4))),
    # vision
    "conv2d": Kernel(_conv2d_forward, _conv2d_backward),
    "max_pool2d": Kernel(_max_pool2d_forward, _max_pool2d_backward),
    "avg_pool2d": Kernel(_avg_pool2d_forward, _avg_pool2d_backward),
    # language
    "embedding": Kernel(_embedding_forward, _embedding_backward),
    # losses
    "sparse_softmax_cross_entropy": Kernel(_cross_entropy_forward, _cross_entropy_backward),
    # eval helpers: no gradient
    "argmax": _no_grad(lambda inputs, attrs: np.argmax(inputs[0], axis=attrs["axis"])),
    "equal": _no_grad(lambda inputs, attrs: np.equal(inputs[0], inputs[1])),
}
