"""numpy helpers the op records' kernels share: broadcasting, windows of an image, erfc, kernel builders."""

from __future__ import annotations

from typing import Callable

import numpy as np

from zoo_base.errors import UserError

# ------------------------------------------------------------------- kernel builders


def unary(fn: Callable, derivative: Callable) -> dict:
    """forward and backward of y = fn(x, attrs) with dy/dx = derivative(x, y, attrs)."""

    def forward(inputs, attrs, ctx):
        x = inputs[0]
        y = fn(x, attrs)
        return [y], (x, y)

    def backward(saved, grads, attrs, needs):
        x, y = saved
        return [grads[0] * derivative(x, y, attrs)]

    return {"forward": forward, "backward": backward}


def binary(fn: Callable, grad_a: Callable, grad_b: Callable) -> dict:
    """forward and backward of a broadcasting y = fn(a, b); grad_a/grad_b(g, a, b, y) before un-broadcasting."""

    def forward(inputs, attrs, ctx):
        a, b = inputs
        y = fn(a, b)
        return [y], (a, b, y)

    def backward(saved, grads, attrs, needs):
        a, b, y = saved
        g = grads[0]
        return [unbroadcast(grad_a(g, a, b, y), a.shape) if needs[0] else None,
                unbroadcast(grad_b(g, a, b, y), b.shape) if needs[1] else None]

    return {"forward": forward, "backward": backward}


def no_gradient(fn: Callable) -> dict:
    """forward of y = fn(inputs, attrs); no gradient flows through."""

    def forward(inputs, attrs, ctx):
        return [fn(inputs, attrs)], None

    return {"forward": forward, "backward": None}


# ------------------------------------------------------------------------ broadcasting


def unbroadcast(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum a gradient of a broadcast result back to the operand's ``shape``."""
    if g.shape == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and g.shape[lead + i] != 1)
    return g.sum(axis=axes).reshape(shape)


def param_shape(ndim: int, axes: tuple[int, ...], shape: tuple[int, ...]) -> list[int]:
    """Shape that broadcasts a per-``axes`` parameter (gamma, beta) against x."""
    return [shape[i] if i in axes else 1 for i in range(ndim)]


# -------------------------------------------------------------------------- special


def erfc(x: np.ndarray) -> np.ndarray:
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


# ------------------------------------------------------------------ images and windows


def pair(v) -> tuple[int, int]:
    """(height, width) of an int or a pair."""
    if isinstance(v, int):
        return v, v
    if len(v) != 2:
        raise ValueError(f"expected an int or a pair (height, width), got {v!r}")
    return int(v[0]), int(v[1])


def to_nhwc(x, layout):
    return x.transpose(0, 2, 3, 1) if layout == "NCHW" else x


def from_nhwc(x, layout):
    return x.transpose(0, 3, 1, 2) if layout == "NCHW" else x


def padding_pairs(padding, in_hw, kernel, strides, dilations) -> tuple[tuple[int, int], tuple[int, int]]:
    """Per-side padding ((top, bottom), (left, right)) from explicit ints, "SAME" or "VALID"."""
    if isinstance(padding, str):
        if padding.upper() == "VALID":
            return (0, 0), (0, 0)
        if padding.upper() != "SAME":
            raise ValueError(f"padding must be SAME, VALID or [[top, bottom], [left, right]], got {padding!r}")
        result = []
        for n, k, s, d in zip(in_hw, kernel, strides, dilations):
            # TensorFlow's rule: out = ceil(n / s); the odd pixel of padding goes at the end
            total = max((-(-n // s) - 1) * s + (k - 1) * d + 1 - n, 0)
            result.append((total // 2, total - total // 2))
        return result[0], result[1]
    (top, bottom), (left, right) = padding
    return (int(top), int(bottom)), (int(left), int(right))


def windowed_size(n: int | None, pad: tuple[int, int], kernel: int, stride: int, dilation: int) -> int | None:
    """Output size along one axis of a convolution or pooling window (None if ``n`` is unknown)."""
    if n is None:
        return None
    return (n + pad[0] + pad[1] - (kernel - 1) * dilation - 1) // stride + 1


def windows(xp, kernel, strides, dilations):
    """Every kernel window of a padded NHWC input: a view (N, Ho, Wo, kh, kw, C)."""
    n, hp, wp, c = xp.shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    ho = (hp - (kh - 1) * dh - 1) // sh + 1
    wo = (wp - (kw - 1) * dw - 1) // sw + 1
    s_n, s_h, s_w, s_c = xp.strides
    return np.lib.stride_tricks.as_strided(
        xp, (n, ho, wo, kh, kw, c), (s_n, s_h * sh, s_w * sw, s_h * dh, s_w * dw, s_c), writeable=False)


def col2im(taps, padded_shape, strides, dilations, dtype):
    """Adjoint of windows(): sum each window's gradient into place, given tap by tap as
    (kh, kw, N, Ho, Wo, C) (each tap's slab contiguous, so each add runs over whole rows).

    One strided add per kernel tap (kh * kw of them), never a loop over pixels.
    """
    kh, kw, _, ho, wo, _ = taps.shape
    (sh, sw), (dh, dw) = strides, dilations
    out = np.zeros(padded_shape, dtype=dtype)
    for i in range(kh):
        rows = slice(i * dh, i * dh + sh * (ho - 1) + 1, sh)  # the Ho input rows tap i reads
        for j in range(kw):
            cols = slice(j * dw, j * dw + sw * (wo - 1) + 1, sw)
            out[:, rows, cols, :] += taps[i, j]
    return out


def select_or_zero(condition: np.ndarray, g: np.ndarray) -> np.ndarray:
    """np.where(condition, g, 0) for a float32 ``g`` of condition's shape, bit for bit (a NaN
    or inf of g where condition is False gives 0), as one AND with a 0 / all-ones mask:
    several times faster than np.where's per-element branch."""
    if g.dtype != np.float32 or condition.shape != g.shape:
        return np.where(condition, g, g.dtype.type(0))
    mask = np.negative(condition.view(np.uint8), dtype=np.int32)  # 0 or -1 (all bits set)
    return (np.ascontiguousarray(g).view(np.int32) & mask).view(np.float32)


def crop(xp, pads):
    (top, bottom), (left, right) = pads
    return xp[:, top: xp.shape[1] - bottom, left: xp.shape[2] - right, :]


# ---------------------------------------------------------------------------- ids


def check_ids(ids, limit, what):
    if ids.size and (ids.min() < 0 or ids.max() >= limit):
        raise UserError(f"{what} out of range: values in [{ids.min()}, {ids.max()}], expected [0, {limit})")


def reduce_rows(fn, x: np.ndarray, axis, keepdims: bool = False):
    """``fn`` (np.sum, np.mean) of ``x`` over the axes ``axis``, in a tree order whatever the layout. numpy
    sums pairwise only along the contiguous axis and one by one along the others, an fp32 error growing
    with the count (batch norm's statistics over N, H, W of an NHWC map came out 16x further from float64
    than over NCHW's rows; a global average pool over a 32x32 NHWC map 2.4x TF's): so the reduced axes go
    last, one contiguous row per kept element (a copy unless they are last already: a reshape of the
    transposed map may be a strided view, which numpy would again sum one by one), as the device adds a
    reduction's partial sums in a tree across its PEs."""
    axis = tuple(axis)
    kept = [a for a in range(x.ndim) if a not in axis]
    rows = np.ascontiguousarray(np.transpose(x, kept + list(axis))).reshape([x.shape[a] for a in kept] + [-1])
    y = fn(rows, axis=-1)
    return y.reshape([1 if a in axis else x.shape[a] for a in range(x.ndim)]) if keepdims else y
