"""Vision: 2-D convolution and pooling, in NCHW (torch) or NHWC (TF) with OIHW or HWIO weights;
the transposed convolution (IOHW or HWOI weights) and resizing (nearest, bilinear).

Padding is explicit pairs [[top, bottom], [left, right]], "SAME" (TensorFlow's rule) or
"VALID". Every kernel works on NHWC windows of the padded input (a strided view), so
forward and backward are one GEMM or one reduction, never a loop over pixels; a
transposed convolution is a convolution's input gradient (one GEMM, then the windows'
adjoint), and a resize one interpolation matrix per axis.
"""

from __future__ import annotations

import math

import numpy as np

from device.ops.arrays import col2im, crop, from_nhwc, padding_pairs, pair, to_nhwc, windowed_size, windows
from device.ops.record import FLOAT, OpRecord, Shape, Work, contraction, reads_nothing


def _contiguous(y, layout):
    """An NHWC result in ``layout``, contiguous."""
    return np.ascontiguousarray(from_nhwc(y, layout))


def _conv2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)  # (N, H, W, C)
    w = inputs[1] if attrs.get("weight_layout", "OIHW") == "HWIO" else inputs[1].transpose(2, 3, 1, 0)  # (kh, kw, C/g, O)
    kh, kw, cg, o = w.shape
    groups = int(attrs.get("groups", 1))
    strides, dilations = pair(attrs.get("strides", 1)), pair(attrs.get("dilations", 1))
    pads = padding_pairs(attrs.get("padding", "VALID"), x.shape[1:3], (kh, kw), strides, dilations)
    xp = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    win = windows(xp, (kh, kw), strides, dilations)  # (N, Ho, Wo, kh, kw, C)
    n, ho, wo = win.shape[:3]
    if groups == 1:
        cols = win.reshape(n * ho * wo, kh * kw * cg)  # im2col: one row per output pixel
        w2 = w.reshape(kh * kw * cg, o)
        y = cols @ w2
    else:
        # one GEMM per group, batched: (g, N*Ho*Wo, kh*kw*C/g) @ (g, kh*kw*C/g, O/g)
        cols = np.ascontiguousarray(win.reshape(n * ho * wo, kh * kw, groups, cg).transpose(2, 0, 1, 3))
        cols = cols.reshape(groups, n * ho * wo, kh * kw * cg)
        w2 = np.ascontiguousarray(w.reshape(kh * kw, cg, groups, o // groups).transpose(2, 0, 1, 3))
        w2 = w2.reshape(groups, kh * kw * cg, o // groups)
        y = np.matmul(cols, w2).transpose(1, 0, 2)  # (N*Ho*Wo, g, O/g): output channel g * O/g + j
    y = y.reshape(n, ho, wo, o)
    # contiguous in the user's layout: what follows (batch norm, elementwise) runs over whole rows
    return [_contiguous(y, layout)], (cols, w2, w.shape, win.shape, xp.shape, pads, strides, dilations, groups)


def _conv2d_backward(saved, grads, attrs, needs):
    cols, w2, w_shape, win_shape, padded_shape, pads, strides, dilations, groups = saved
    layout = attrs.get("layout", "NCHW")
    n, ho, wo, kh, kw, c = win_shape
    g2 = to_nhwc(grads[0], layout).reshape(n * ho * wo, -1)  # (N*Ho*Wo, O)
    dx = dw = None
    if groups == 1:
        if needs[0]:
            # one batched GEMM, tap by tap: (kh * kw, N*Ho*Wo, C), each tap's slab contiguous
            taps = np.matmul(g2, w2.reshape(kh * kw, c, -1).transpose(0, 2, 1)).reshape(kh, kw, n, ho, wo, c)
            dx = _contiguous(crop(col2im(taps, padded_shape, strides, dilations, g2.dtype), pads), layout)
        if needs[1]:
            dw = (cols.T @ g2).reshape(w_shape)  # (kh, kw, C, O)
    else:
        cg, o = w_shape[2], w_shape[3]
        gg = np.ascontiguousarray(g2.reshape(-1, groups, o // groups).transpose(1, 0, 2))  # (g, N*Ho*Wo, O/g)
        if needs[0]:
            dcols = np.matmul(gg, w2.transpose(0, 2, 1))  # (g, N*Ho*Wo, kh*kw*C/g)
            taps = dcols.reshape(groups, n * ho * wo, kh * kw, cg).transpose(2, 1, 0, 3)  # (kh*kw, N*Ho*Wo, g, C/g)
            taps = np.ascontiguousarray(taps).reshape(kh, kw, n, ho, wo, c)
            dx = _contiguous(crop(col2im(taps, padded_shape, strides, dilations, g2.dtype), pads), layout)
        if needs[1]:
            dw = np.matmul(cols.transpose(0, 2, 1), gg)  # (g, kh*kw*C/g, O/g)
            dw = dw.reshape(groups, kh * kw, cg, o // groups).transpose(1, 2, 0, 3).reshape(w_shape)  # (kh, kw, C/g, O)
    if dw is not None and attrs.get("weight_layout", "OIHW") != "HWIO":
        dw = dw.transpose(3, 2, 0, 1)  # (O, C/g, kh, kw)
    return [dx, dw]


def _ceil_pads(x_hw, pads, kernel, strides) -> tuple:
    """The padding of a pool in ceil_mode (torch's, GoogLeNet's): the output size rounds up, so a last
    window may run past the input's end, as long as it starts inside the input or its left padding
    (torch's rule: the last start (out - 1) * stride < size + left pad); what it runs past is extra
    padding at the end (bottom, right), which max never picks and a mean never counts."""
    result = []
    for n, (before, after), k, s in zip(x_hw, pads, kernel, strides):
        if n is None:
            result.append((before, after))
            continue
        out = -(-(n + before + after - k) // s) + 1  # ceil((n + pads - k) / s) + 1
        if (out - 1) * s >= n + before:  # the last window would start in the right padding
            out -= 1
        result.append((before, max(after, (out - 1) * s + k - n - before)))
    return tuple(result)


def _pool_pads(x_hw, attrs, kernel, strides) -> tuple:
    """((top, bottom), (left, right)) of a pool: its padding attribute, extended at the end in ceil_mode."""
    pads = padding_pairs(attrs.get("padding", "VALID"), x_hw, kernel, strides, (1, 1))
    return _ceil_pads(x_hw, pads, kernel, strides) if attrs.get("ceil_mode", False) else pads


def _pool_setup(x, attrs, fill):
    """Padded NHWC windows of a pooling op: (windows, padded shape, pads, strides)."""
    kernel = pair(attrs["kernel"])
    strides = pair(attrs.get("strides") or kernel)
    pads = _pool_pads(x.shape[1:3], attrs, kernel, strides)
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
    return [_contiguous(y, layout)], (idx, win.shape, padded_shape, pads, strides)


def _max_pool2d_backward(saved, grads, attrs, needs):
    idx, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = to_nhwc(grads[0], layout)  # (N, Ho, Wo, C)
    n, ho, wo, kh, kw, c = win_shape
    taps = np.zeros((kh * kw, n, ho, wo, c), dtype=g.dtype)
    np.put_along_axis(taps, idx.transpose(3, 0, 1, 2, 4), g[None], axis=0)  # the maximum's tap gets g
    dxp = col2im(taps.reshape(kh, kw, n, ho, wo, c), padded_shape, strides, (1, 1), g.dtype)
    return [_contiguous(crop(dxp, pads), layout)]


def _avg_pool_count(x_hw, attrs, pads, strides, dtype):
    """Divisor per output pixel: the window size, or its unpadded part.

    "SAME" averages over the input pixels only (TensorFlow); explicit padding counts the
    zeros (torch's default count_include_pad=True); an attr count_include_pad overrides.
    ceil_mode's extra padding at the end (``pads`` holds it) is never counted: torch divides a
    window that runs past the padded input by its part inside it.
    """
    kernel = pair(attrs["kernel"])
    padding = attrs.get("padding", "VALID")
    explicit = padding_pairs(padding, x_hw, kernel, strides, (1, 1))
    include_pad = attrs.get("count_include_pad", not isinstance(padding, str))
    if include_pad and tuple(explicit) == tuple(pads):
        return float(kernel[0] * kernel[1])
    # 1 where the divisor counts (the input, and the explicit padding with include_pad), 0 elsewhere
    counted = explicit if include_pad else ((0, 0), (0, 0))
    ones = np.pad(np.ones((1, *x_hw, 1), dtype=dtype), ((0, 0), *counted, (0, 0)), constant_values=1)
    rest = [(p[0] - c[0], p[1] - c[1]) for p, c in zip(pads, counted)]
    ones = np.pad(ones, ((0, 0), *rest, (0, 0)))
    return windows(ones, kernel, strides, (1, 1)).sum(axis=(3, 4))  # (1, Ho, Wo, 1)


def _avg_pool2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)
    win, padded_shape, pads, strides = _pool_setup(x, attrs, 0)
    count = _avg_pool_count(x.shape[1:3], attrs, pads, strides, x.dtype)
    y = win.sum(axis=(3, 4)) / count  # (N, Ho, Wo, C)
    return [_contiguous(y, layout)], (count, win.shape, padded_shape, pads, strides)


def _avg_pool2d_backward(saved, grads, attrs, needs):
    count, win_shape, padded_shape, pads, strides = saved
    layout = attrs.get("layout", "NCHW")
    g = to_nhwc(grads[0], layout) / count  # (N, Ho, Wo, C)
    n, ho, wo, kh, kw, c = win_shape
    taps = np.broadcast_to(g, (kh, kw, n, ho, wo, c))  # every tap of a window gets its output's g
    dxp = col2im(taps, padded_shape, strides, (1, 1), g.dtype)
    return [_contiguous(crop(dxp, pads), layout)]


def _spatial(shape: Shape, layout: str) -> tuple:
    """(N, H, W, C) of an activation shape in ``layout``."""
    return (shape[0], shape[2], shape[3], shape[1]) if layout == "NCHW" else tuple(shape)


def _output_shape(x: Shape, channels, kernel, attrs: dict, strides, dilations) -> Shape:
    layout = attrs.get("layout", "NCHW")
    n, h, w, _ = _spatial(x, layout)
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
    kh, kw, group_channels, out_channels = _conv2d_weight(shapes[1], attrs)
    groups = int(attrs.get("groups", 1))
    channels = _spatial(shapes[0], attrs.get("layout", "NCHW"))[3]
    if groups < 1 or out_channels % groups or (channels is not None and channels != group_channels * groups):
        raise ValueError(f"groups={groups}: the input's {channels} channels and the weight's {out_channels} outputs "
                         f"must split into {groups} groups of {group_channels} inputs each")
    # a convolution's strides default to 1 (a pool's to its kernel)
    return [_output_shape(shapes[0], out_channels, (kh, kw), attrs, pair(attrs.get("strides", 1)),
                          pair(attrs.get("dilations", 1)))]


def _conv2d_macs(work: Work) -> float:
    # per output element: C_in / groups x kh x kw (the weight holds one group's input channels)
    kh, kw, cin, _ = _conv2d_weight(work.inputs[1], work.attrs)
    return float(math.prod(work.outputs[0]) * cin * kh * kw)


def _pool_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    layout = attrs.get("layout", "NCHW")
    channels = _spatial(shapes[0], layout)[3]
    kernel = pair(attrs["kernel"])
    strides = pair(attrs.get("strides") or kernel)
    padding = attrs.get("padding", "VALID")
    if attrs.get("ceil_mode", False) and not (isinstance(padding, str) and padding.upper() == "SAME"):
        # the windows over the padding _ceil_pads extends (an unknown size stays unknown)
        _, h, w, _ = _spatial(shapes[0], layout)
        attrs = dict(attrs, padding=[list(p) for p in _pool_pads((h, w), attrs, kernel, strides)])
    return [_output_shape(shapes[0], channels, kernel, attrs, strides, (1, 1))]


def _pool_cost(work: Work) -> tuple[float, float]:
    # one flop per window element of each output; a pass over the input and output
    kernel = work.attrs.get("kernel", 1)
    kh, kw = (int(kernel[0]), int(kernel[-1])) if isinstance(kernel, (list, tuple)) else (int(kernel), int(kernel))
    return float(work.out * kh * kw), work.moved


# ceil_mode (optional, torch's): the output size rounds up (_ceil_pads)
_POOL_ATTRS = ("kernel", "strides?", "padding?", "layout?", "ceil_mode?")


# ---- transposed convolution, resizing (vision and losses) ----


def _conv_transpose_weight(w: Shape, attrs: dict) -> tuple:
    """(kh, kw, C_out, C_in) of a transposed convolution's weight: torch's IOHW (C_in, C_out, kh, kw)
    or TF's HWOI (kh, kw, C_out, C_in), TF naming the filter by the convolution it transposes."""
    return tuple(w) if attrs.get("weight_layout", "IOHW") == "HWOI" else (w[2], w[3], w[1], w[0])


def _conv_transpose_geometry(x_hw, attrs: dict, kernel) -> tuple:
    """(pads, strides, dilations) of the convolution whose input gradient this op is.

    The output (size ``output_size``) is that convolution's input: padded by ``pads`` it has
    windows exactly at the input's pixels. Raises ValueError when the sizes do not fit.
    """
    strides, dilations = pair(attrs.get("strides", 1)), pair(attrs.get("dilations", 1))
    out_hw = pair(list(attrs["output_size"]))
    pads = padding_pairs(attrs.get("padding", "VALID"), out_hw, kernel, strides, dilations)
    for n, o, pad, k, s, d in zip(x_hw, out_hw, pads, kernel, strides, dilations):
        if n is not None and windowed_size(o, pad, k, s, d) != n:
            raise ValueError(f"output_size {out_hw} with padding {attrs.get('padding', 'VALID')!r} is not the input "
                             f"of a convolution whose output has {tuple(x_hw)} pixels")
        if pad[0] < 0 or pad[1] < 0:
            raise ValueError(f"negative padding {pads}")
    return pads, strides, dilations


def _conv_transpose2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)  # (N, H, W, C_in)
    w = inputs[1] if attrs.get("weight_layout", "IOHW") == "HWOI" else inputs[1].transpose(2, 3, 1, 0)
    kh, kw, o, c = w.shape  # (kh, kw, C_out, C_in)
    pads, strides, dilations = _conv_transpose_geometry(x.shape[1:3], attrs, (kh, kw))
    n, h, wd, _ = x.shape
    out_h, out_w = pair(list(attrs["output_size"]))
    padded_shape = (n, out_h + sum(pads[0]), out_w + sum(pads[1]), o)
    x2 = x.reshape(n * h * wd, c)
    w2 = w.reshape(kh * kw * o, c)
    # the input gradient of a convolution: each input pixel scatters its kernel-sized patch,
    # computed tap by tap in one batched GEMM: (kh * kw, N*H*W, C_out)
    taps = np.matmul(x2, w2.reshape(kh * kw, o, c).transpose(0, 2, 1)).reshape(kh, kw, n, h, wd, o)
    y = crop(col2im(taps, padded_shape, strides, dilations, x.dtype), pads)
    return [_contiguous(y, layout)], (x2, w2, w.shape, x.shape, pads, strides, dilations)


def _conv_transpose2d_backward(saved, grads, attrs, needs):
    x2, w2, w_shape, x_shape, pads, strides, dilations = saved
    layout = attrs.get("layout", "NCHW")
    kh, kw, o, c = w_shape
    g = to_nhwc(grads[0], layout)  # (N, Ho, Wo, C_out)
    gp = np.pad(g, ((0, 0), pads[0], pads[1], (0, 0)))
    n, h, wd, _ = x_shape
    # the forward convolution: one window per input pixel
    win = windows(gp, (kh, kw), strides, dilations)  # (N, H, W, kh, kw, C_out)
    cols = win.reshape(n * h * wd, kh * kw * o)
    dx = dw = None
    if needs[0]:
        dx = _contiguous((cols @ w2).reshape(x_shape), layout)
    if needs[1]:
        dw = (cols.T @ x2).reshape(w_shape)  # (kh, kw, C_out, C_in)
        if attrs.get("weight_layout", "IOHW") != "HWOI":
            dw = dw.transpose(3, 2, 0, 1)  # (C_in, C_out, kh, kw)
    return [dx, dw]


def _conv_transpose2d_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    layout = attrs.get("layout", "NCHW")
    kh, kw, out_channels, in_channels = _conv_transpose_weight(shapes[1], attrs)
    n, h, w, channels = _spatial(shapes[0], layout)
    if channels is not None and channels != in_channels:
        raise ValueError(f"the input's {channels} channels are not the weight's {in_channels} inputs")
    _conv_transpose_geometry((h, w), attrs, (kh, kw))
    out_h, out_w = pair(list(attrs["output_size"]))
    return [(n, out_channels, out_h, out_w) if layout == "NCHW" else (n, out_h, out_w, out_channels)]


def _conv_transpose2d_macs(work: Work) -> float:
    # per input element: kh x kw x C_out
    kh, kw, cout, _ = _conv_transpose_weight(work.inputs[1], work.attrs)
    return float(math.prod(work.inputs[0]) * cout * kh * kw)


RESIZE_METHODS = ("nearest", "bilinear")


def _interpolation(n_in: int, n_out: int, method: str, dtype) -> np.ndarray:
    """(n_out, n_in) matrix of one axis: torch's align_corners=False, TF's half_pixel_centers.

    nearest: source floor(dst * n_in / n_out) (whole-number factors only, where torch's and
    TF's rules agree); bilinear: source (dst + 0.5) * n_in / n_out - 0.5, clamped to the edges.
    """
    a = np.zeros((n_out, n_in), dtype=np.float64)
    dst = np.arange(n_out)
    if method == "nearest":
        a[dst, dst * n_in // n_out] = 1.0
        return a.astype(dtype)
    src = np.maximum((dst + 0.5) * n_in / n_out - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(int), n_in - 1)
    high = np.minimum(low + 1, n_in - 1)
    frac = src - low
    np.add.at(a, (dst, low), 1.0 - frac)
    np.add.at(a, (dst, high), frac)
    return a.astype(dtype)


def _resize2d_forward(inputs, attrs, ctx):
    layout = attrs.get("layout", "NCHW")
    x = to_nhwc(inputs[0], layout)  # (N, H, W, C)
    out_h, out_w = pair(list(attrs["size"]))
    a_h = _interpolation(x.shape[1], out_h, attrs["method"], x.dtype)  # (Ho, H)
    a_w = _interpolation(x.shape[2], out_w, attrs["method"], x.dtype)  # (Wo, W)
    y = np.matmul(a_w, np.matmul(a_h, x.transpose(0, 3, 1, 2)).transpose(0, 1, 3, 2))  # (N, C, Wo, Ho)
    return [from_nhwc(np.ascontiguousarray(y.transpose(0, 3, 2, 1)), layout)], (a_h, a_w)


def _resize2d_backward(saved, grads, attrs, needs):
    a_h, a_w = saved
    layout = attrs.get("layout", "NCHW")
    g = to_nhwc(grads[0], layout).transpose(0, 3, 2, 1)  # (N, C, Wo, Ho)
    dx = np.matmul(a_h.T, np.matmul(a_w.T, g).transpose(0, 1, 3, 2))  # (N, C, H, W)
    return [from_nhwc(np.ascontiguousarray(dx.transpose(0, 2, 3, 1)), layout)]


def _resize2d_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    layout = attrs.get("layout", "NCHW")
    if attrs["method"] not in RESIZE_METHODS:
        raise ValueError(f"method {attrs['method']!r} is not one of {', '.join(RESIZE_METHODS)}")
    n, h, w, c = _spatial(shapes[0], layout)
    out_h, out_w = pair(list(attrs["size"]))
    if attrs["method"] == "nearest" and any(i is not None and o % i for i, o in ((h, out_h), (w, out_w))):
        raise ValueError(f"nearest resizing from {(h, w)} to {(out_h, out_w)} is not by whole-number factors")
    return [(n, c, out_h, out_w) if layout == "NCHW" else (n, out_h, out_w, c)]


def _resize2d_cost(work: Work) -> tuple[float, float]:
    # bilinear: 4 taps of a multiply-add per output element; nearest: a copy
    taps = 8 if work.attrs.get("method") == "bilinear" else 0
    return float(taps * work.out), work.moved

RECORDS = (
    # a contraction: backward computes two products, d(input) and d(weight)
    # groups: the channels split into groups, each convolved with its own slice of the weight
    # (depthwise: groups = input channels); the weight's input dimension is one group's channels
    OpRecord("conv2d", "2-D convolution (cross-correlation) of x with w; strides, dilations, padding, groups "
             "(output channel k reads input group k // (C_out / groups))",
             ("x", "w"), ("strides?", "padding?", "dilations?", "layout?", "weight_layout?", "groups?"), "conv",
             (FLOAT, FLOAT),
             _conv2d_shape, _conv2d_forward, _conv2d_backward,
             cost=contraction(_conv2d_macs), backward_ratio=2.0),
    OpRecord("max_pool2d", "maximum over each window (padding never wins; the first maximum gets the gradient)",
             ("x",), _POOL_ATTRS, "pool", (FLOAT,), _pool_shape, _max_pool2d_forward, _max_pool2d_backward,
             cost=_pool_cost),
    # count_include_pad (optional): padded zeros count in the divisor (torch's default with explicit padding)
    OpRecord("avg_pool2d", "mean over each window (SAME: of the input pixels only, as TF)", ("x",),
             _POOL_ATTRS + ("count_include_pad?",), "pool", (FLOAT,), _pool_shape, _avg_pool2d_forward,
             _avg_pool2d_backward, cost=_pool_cost),
    # vision and losses: the input gradient of a convolution, as a layer (UNet up blocks)
    OpRecord("conv_transpose2d", "transposed 2-D convolution of x with w to output_size; strides, dilations, padding "
             "(of the convolution it transposes)", ("x", "w"),
             ("output_size", "strides?", "padding?", "dilations?", "layout?", "weight_layout?"), "conv",
             (FLOAT, FLOAT), _conv_transpose2d_shape, _conv_transpose2d_forward, _conv_transpose2d_backward,
             cost=contraction(_conv_transpose2d_macs), backward_ratio=2.0),
    # upsampling: a linear map per axis, so the backward is its transpose and reads nothing
    OpRecord("resize2d", "x resized to size by method: nearest (whole-number factors) or bilinear (half-pixel "
             "centres: torch's align_corners=False, TF's half_pixel_centers=True)", ("x",),
             ("size", "method", "layout?"), "pool", (FLOAT,), _resize2d_shape, _resize2d_forward,
             _resize2d_backward, cost=_resize2d_cost, backward_reads=reads_nothing),
)
