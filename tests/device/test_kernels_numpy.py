"""conv2d against a direct loop convolution written from its definition, forward and backward.

Framework-free, so strides, dilations and TF's SAME padding are checked in every tox env
(torch is absent from the TF one) and on every CPU, whatever kernels the frameworks' CPU
builds lack (TF's has no gradient of a dilated convolution on AVX2-only x86-64). The
reference shares nothing with the op records (device/ops/) (no im2col, no strided views): one
loop over output pixels and kernel taps, and the gradients as the same loop transposed.
"""

from __future__ import annotations

import numpy as np
import pytest

from device.ops import OPS, KernelContext

RNG = np.random.default_rng(7)


def same_pads(n, k, s, d):
    """TF's SAME for one axis: ceil(n / s) outputs; the odd pixel of padding goes at the end."""
    extent = (k - 1) * d + 1
    total = max((-(-n // s) - 1) * s + extent - n, 0)
    return total // 2, total - total // 2


def loop_conv(x, w, strides, dilations, pads):
    """y[n, i, j, o] = sum over taps (a, b) and channels c of x[n, i*s + a*d - pad, ...] * w[a, b, c, o].

    x (N, H, W, C), w (kh, kw, C, O), pads ((top, bottom), (left, right)); pixels outside x
    are zero. Returns y (N, Ho, Wo, O) and the function computing (dx, dw) from dy.
    """
    (n, h, wd, _), (kh, kw, _, o) = x.shape, w.shape
    (sh, sw), (dh, dw), ((top, bottom), (left, right)) = strides, dilations, pads
    ho = (h + top + bottom - (kh - 1) * dh - 1) // sh + 1
    wo = (wd + left + right - (kw - 1) * dw - 1) // sw + 1
    taps = [(i, j, a, b, i * sh + a * dh - top, j * sw + b * dw - left)
            for i in range(ho) for j in range(wo) for a in range(kh) for b in range(kw)]
    taps = [t for t in taps if 0 <= t[4] < h and 0 <= t[5] < wd]  # a tap on padding adds zero
    y = np.zeros((n, ho, wo, o), x.dtype)
    for i, j, a, b, r, c in taps:
        y[:, i, j, :] += x[:, r, c, :] @ w[a, b]

    def backward(dy):
        dx, dwt = np.zeros_like(x), np.zeros_like(w)
        for i, j, a, b, r, c in taps:
            dx[:, r, c, :] += dy[:, i, j, :] @ w[a, b].T
            dwt[a, b] += x[:, r, c, :].T @ dy[:, i, j, :]
        return dx, dwt

    return y, backward


@pytest.mark.parametrize("x_shape, w_shape, strides, dilations, padding", [
    ((2, 9, 9, 2), (3, 3, 2, 3), [1, 1], [2, 2], "SAME"),  # the case TF's CPU gradient lacks
    ((2, 8, 7, 3), (2, 3, 3, 2), [1, 1], [3, 2], "SAME"),  # odd total padding
    ((2, 9, 8, 2), (3, 2, 2, 3), [2, 1], [2, 3], "SAME"),  # stride and dilation together
    ((2, 9, 8, 2), (3, 2, 2, 3), [1, 2], [2, 3], "VALID"),
    ((1, 6, 6, 2), (3, 3, 2, 2), [1, 1], [4, 4], "SAME"),  # dilated extent (9) wider than the input
    ((2, 7, 6, 3), (3, 2, 3, 4), [2, 2], [1, 1], [[1, 0], [2, 1]]),  # explicit, asymmetric
])
@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_conv2d_matches_a_loop_convolution(x_shape, w_shape, strides, dilations, padding, layout):
    x = RNG.standard_normal(x_shape)  # float64: the two sum in different orders
    w = RNG.standard_normal(w_shape)
    if isinstance(padding, str):
        pads = ((0, 0), (0, 0)) if padding == "VALID" else tuple(
            same_pads(n, k, s, d) for n, k, s, d in zip(x_shape[1:3], w_shape[:2], strides, dilations))
    else:
        pads = tuple(tuple(p) for p in padding)
    expected, backward = loop_conv(x, w, strides, dilations, pads)
    dy = RNG.standard_normal(expected.shape)
    expected_dx, expected_dw = backward(dy)

    # the kernel in the layout under test: NCHW activations with OIHW weights, as torch has them
    to_layout = (lambda t: t.transpose(0, 3, 1, 2)) if layout == "NCHW" else (lambda t: t)
    w_in = w.transpose(3, 2, 0, 1) if layout == "NCHW" else w
    attrs = {"strides": strides, "padding": padding, "dilations": dilations, "layout": layout,
             "weight_layout": "OIHW" if layout == "NCHW" else "HWIO"}
    kernel = OPS["conv2d"]
    (y,), saved = kernel.forward([to_layout(x), w_in], attrs, KernelContext(training=True))
    dx, dw = kernel.backward(saved, [to_layout(dy)], attrs, (True, True))
    np.testing.assert_allclose(y, to_layout(expected), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, to_layout(expected_dx), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw, expected_dw.transpose(3, 2, 0, 1) if layout == "NCHW" else expected_dw,
                               rtol=1e-12, atol=1e-12)


def test_loop_reference_gradients_are_the_adjoint_of_its_forward():
    """The reference is linear in x and in w, so <dy, conv(x, w)> = <dx, x> = <dw, w>."""
    x, w = RNG.standard_normal((2, 7, 8, 3)), RNG.standard_normal((3, 2, 3, 4))
    y, backward = loop_conv(x, w, (2, 1), (2, 3), (same_pads(7, 3, 2, 2), same_pads(8, 2, 1, 3)))
    dy = RNG.standard_normal(y.shape)
    dx, dw = backward(dy)
    assert np.vdot(dy, y) == pytest.approx(np.vdot(dx, x), rel=1e-12)
    assert np.vdot(dy, y) == pytest.approx(np.vdot(dw, w), rel=1e-12)
