"""Vision: 2-D convolution and pooling, in NCHW (torch) or NHWC (TF) with OIHW or HWIO weights.

Padding is explicit pairs [[top, bottom], [left, right]], "SAME" (TensorFlow's rule) or
"VALID". Every kernel works on NHWC windows of the padded input (a strided view), so
forward and backward are one GEMM or one reduction, never a loop over pixels.
"""

from __future__ import annotations

import math

import numpy as np

from device.ops.arrays import col2im, crop, from_nhwc, padding_pairs, pair, to_nhwc, windowed_size, windows
from device.ops.record import FLOAT, OpRecord, Shape, Work, contraction


def _conv2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)  # (N, H, W, C)
    w = inputs[1] if attrs.get("weight_layout", "OIHW") == "HWIO" else inputs[1].transpose(2, 3, 1, 0)  # (kh, kw, C, O)
    kh, kw, c, o = w.shape
    strides, dilations = pair(attrs.get("strides", 1)), pair(attrs.get("dilations", 1))
    pads = padding_pairs(attrs.get("padding", "VALID"), x.shape[1:3], (kh, kw), strides, dilations)
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    win = windows(xp, (kh, kw), strides, dilations)  # (N, Ho, Wo, kh, kw, C)
    n, ho, wo = win.shape[:3]
    cols = win.reshape(n * ho * wo, kh * kw * c)  # im2col: one row per output pixel
    w2 = w.reshape(kh * kw * c, o)
    y = (cols @ w2).reshape(n, ho, wo, o)
    return [from_nhwc(y, layout)], (cols, w2, w.shape, win.shape, xp.shape, pads, strides, dilations)


def _conv2d_backward(saved, grads, attrs, needs):
    cols, w2, w_shape, win_shape, padded_shape, pads, strides, dilations = saved
    layout = attrs.get("layout", "NCHW")
    g2 = to_nhwc(grads[0], layout).reshape(cols.shape[0], -1)  # (N*Ho*Wo, O)
    dx = dw = None
    if needs[0]:
        dwin = (g2 @ w2.T).reshape(win_shape)  # (N, Ho, Wo, kh, kw, C)
        dx = from_nhwc(crop(col2im(dwin, padded_shape, strides, dilations, g2.dtype), pads), layout)
    if needs[1]:
        dw = (cols.T @ g2).reshape(w_shape)  # (kh, kw, C, O)
        if attrs.get("weight_layout", "OIHW") != "HWIO":
            dw = dw.transpose(3, 2, 0, 1)  # (O, C, kh, kw)
    return [dx, dw]


def _pool_setup(x, attrs, fill):
    """Padded NHWC windows of a pooling op: (windows, padded shape, pads, strides)."""
    kernel = pair(attrs["kernel"])
    strides = pair(attrs.get("strides") or kernel)
    pads = padding_pairs(attrs.get("padding", "VALID"), x.shape[1:3], kernel, strides, (1, 1))
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=fill)
    return windows(xp, kernel, strides, (1, 1)), xp.shape, pads, strides


def _max_pool2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)
    win, padded_shape, pads, strides = _pool_setup(x, attrs, -np.inf)  # padding never wins
    n, ho, wo, kh, kw, c = win.shape
    flat = win.reshape(n, ho, wo, kh * kw, c)
    idx = flat.argmax(axis=3)[:, :, :, None, :]  # the first maximum gets the gradient, as in torch
    y = np.take_along_axis(flat, idx, axis=3)[:, :, :, 0, :]
    return [from_nhwc(y, layout)], (idx, win.shape, padded_shape, pads, strides)


def _max_pool2d_backward(saved, grads, attrs, needs):
    idx, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = to_nhwc(grads[0], layout)  # (N, Ho, Wo, C)
    n, ho, wo, kh, kw, c = win_shape
    dwin = np.zeros((n, ho, wo, kh * kw, c), dtype=g.dtype)
    np.put_along_axis(dwin, idx, g[:, :, :, None, :], axis=3)
    dxp = col2im(dwin.reshape(win_shape), padded_shape, strides, (1, 1), g.dtype)
    return [from_nhwc(crop(dxp, pads), layout)]


def _avg_pool_count(x_hw, attrs, pads, strides, dtype):
    """Divisor per output pixel: the window size, or its unpadded part.

    "SAME" averages over the input pixels only (TensorFlow); explicit padding counts the
    zeros (torch's default count_include_pad=True); an attr count_include_pad overrides.
    """
    kernel = pair(attrs["kernel"])
    padding = attrs.get("padding", "VALID")
    if attrs.get("count_include_pad", not isinstance(padding, str)):
        return float(kernel[0] * kernel[1])
    ones = np.pad(np.ones((1, *x_hw, 1), dtype=dtype), ((0, 0), pads[0], pads[1], (0, 0)))
    return windows(ones, kernel, strides, (1, 1)).sum(axis=(3, 4))  # (1, Ho, Wo, 1)


def _avg_pool2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)
    win, padded_shape, pads, strides = _pool_setup(x, attrs, 0)
    count = _avg_pool_count(x.shape[1:3], attrs, pads, strides, x.dtype)
    y = win.sum(axis=(3, 4)) / count  # (N, Ho, Wo, C)
    return [from_nhwc(y, layout)], (count, win.shape, padded_shape, pads, strides)


def _avg_pool2d_backward(saved, grads, attrs, needs):
    count, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = to_nhwc(grads[0], layout) / count  # (N, Ho, Wo, C)
    dwin = np.broadcast_to(g[:, :, :, None, None, :], win_shape)
    dxp = col2im(dwin, padded_shape, strides, (1, 1), g.dtype)
    return [from_nhwc(crop(dxp, pads), layout)]


def _spatial(shape: Shape, layout: str) -> tuple:
    """(N, H, W, C) of an activation shape in ``layout``."""
    return (shape[0], shape[2], shape[3], shape[1]) if layout == "NCHW" else tuple(shape)


def _output_shape(x: Shape, channels, kernel, attrs: dict, dilations) -> Shape:
    layout = attrs.get("layout", "NCHW")
    n, h, w, _ = _spatial(x, layout)
    strides = pair(attrs.get("strides") or kernel)
    padding = attrs.get("padding", "VALID")
    if isinstance(padding, str) and padding.upper() == "SAME" and (h is None or w is None):
        out_h = out_w = None
    else:
        pads = padding_pairs(padding, (h or 0, w or 0), kernel, strides, dilations)
        out_h = windowed_size(h, pads[0], kernel[0], strides[0], dilations[0])
        out_w = windowed_size(w, pads[1], kernel[1], strides[1], dilations[1])
    return (n, channels, out_h, out_w) if layout == "NCHW" else (n, out_h, out_w, channels)


def _conv2d_weight(w: Shape, attrs: dict) -> tuple:
    """(kh, kw, C_in, C_out) of the weight's shape."""
    return tuple(w) if attrs.get("weight_layout", "OIHW") == "HWIO" else (w[2], w[3], w[1], w[0])


def _conv2d_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    kh, kw, _, out_channels = _conv2d_weight(shapes[1], attrs)
    return [_output_shape(shapes[0], out_channels, (kh, kw), attrs, pair(attrs.get("dilations", 1)))]


def _conv2d_macs(work: Work) -> float:
    # per output element: C_in x kh x kw
    kh, kw, cin, _ = _conv2d_weight(work.inputs[1], work.attrs)
    return float(math.prod(work.outputs[0]) * cin * kh * kw)


def _pool_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    layout = attrs.get("layout", "NCHW")
    channels = _spatial(shapes[0], layout)[3]
    return [_output_shape(shapes[0], channels, pair(attrs["kernel"]), attrs, (1, 1))]


def _pool_cost(work: Work) -> tuple[float, float]:
    # one flop per window element of each output; a pass over the input and output
    kernel = work.attrs.get("kernel", 1)
    kh, kw = (int(kernel[0]), int(kernel[-1])) if isinstance(kernel, (list, tuple)) else (int(kernel), int(kernel))
    return float(work.out * kh * kw), work.moved


_POOL_ATTRS = ("kernel", "strides?", "padding?", "layout?")

RECORDS = (
    # a contraction: backward computes two products, d(input) and d(weight)
    OpRecord("conv2d", "2-D convolution (cross-correlation) of x with w; strides, dilations, padding",
             ("x", "w"), ("strides?", "padding?", "dilations?", "layout?", "weight_layout?"), "conv", (FLOAT, FLOAT),
             _conv2d_shape, _conv2d_forward, _conv2d_backward,
             cost=contraction(_conv2d_macs), backward_ratio=2.0),
    OpRecord("max_pool2d", "maximum over each window (padding never wins; the first maximum gets the gradient)",
             ("x",), _POOL_ATTRS, "pool", (FLOAT,), _pool_shape, _max_pool2d_forward, _max_pool2d_backward,
             cost=_pool_cost),
    # count_include_pad (optional): padded zeros count in the divisor (torch's default with explicit padding)
    OpRecord("avg_pool2d", "mean over each window (SAME: of the input pixels only, as TF)", ("x",),
             _POOL_ATTRS + ("count_include_pad?",), "pool", (FLOAT,), _pool_shape, _avg_pool2d_forward,
             _avg_pool2d_backward, cost=_pool_cost),
)
