"""Handlers of vision ops: convolutions (2-d, 1-d as 2-d over a height of 1, transposed, grouped),
max and average pools, adaptive average pooling, upsampling.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.torch.lowering import _Lowering, _pair


def _convolution(self: _Lowering, node, input, weight, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    if len(stride) == 1:  # audio: the 2-d convolution over a height of 1
        return _conv1d(self, node, input, weight, bias, stride, padding, dilation, transposed, groups)
    if len(stride) != 2:
        return self.decline(f"{len(stride)}-d convolution (only 2-d)", form="3-d")
    if transposed:
        return _conv_transpose(self, node, input, weight, bias, stride, padding, dilation, output_padding, groups)
    shape, dtype = self.out(node)
    pad = _pair(padding)
    grouped = {"groups": int(groups)} if groups != 1 else {}  # depthwise: groups = input channels
    y = self.emit("conv2d", [self.tensor(input), self.tensor(weight)], shape, dtype, strides=_pair(stride),
                  padding=[[pad[0], pad[0]], [pad[1], pad[1]]], dilations=_pair(dilation),
                  layout="NCHW", weight_layout="OIHW", **grouped)
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1, 1))], shape, dtype)


def _conv1d(self: _Lowering, node, input, weight, bias, stride, padding, dilation, transposed, groups):
    """(N, C, L) convolved as (N, C, 1, L) by the 2-d kernel over a height of 1: the same sums."""
    if transposed:
        return self.decline("transposed 1-d convolution", form="transposed 1-d")
    shape, dtype = self.out(node)  # (N, O, L')
    x, w = self.tensor(input), self.tensor(weight)
    x = self.reshape(x, self.shape(x)[:2] + (1,) + self.shape(x)[2:])
    w = self.reshape(w, self.shape(w)[:2] + (1,) + self.shape(w)[2:])
    pad = int(padding[0]) if isinstance(padding, (list, tuple)) else int(padding)
    grouped = {"groups": int(groups)} if groups != 1 else {}
    y = self.emit("conv2d", [x, w], shape[:2] + (1,) + shape[2:], dtype, strides=[1, int(stride[0])],
                  padding=[[0, 0], [pad, pad]], dilations=[1, int(_pair(dilation)[0])], layout="NCHW",
                  weight_layout="OIHW", **grouped)
    y = self.reshape(y, shape)
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1,))], shape, dtype)


def _conv_transpose(self: _Lowering, node, input, weight, bias, stride, padding, dilation, output_padding, groups):
    """ConvTranspose2d: the output size (from the export metadata) fixes output_padding."""
    if groups != 1:
        return self.decline(f"groups={groups} (only 1)", form="transposed groups")
    if any(p >= s for p, s in zip(_pair(output_padding), _pair(stride))):
        return self.decline(f"output_padding={list(output_padding)} not below the stride {list(stride)}",
                            form="output_padding")
    shape, dtype = self.out(node)
    pad = _pair(padding)
    y = self.emit("conv_transpose2d", [self.tensor(input), self.tensor(weight)], shape, dtype,
                  output_size=list(shape[2:]), strides=_pair(stride), padding=[[pad[0], pad[0]], [pad[1], pad[1]]],
                  dilations=_pair(dilation), layout="NCHW", weight_layout="IOHW")
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1, 1))], shape, dtype)


def _max_pool(self: _Lowering, node, self_, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation) != [1, 1]:
        return self.decline(f"dilation={dilation}")
    shape, dtype = self.out(node, 0)
    pad = _pair(padding)
    ceil = {"ceil_mode": True} if ceil_mode else {}  # GoogLeNet's pools: the output size rounds up
    y = self.emit("max_pool2d", [self.tensor(self_)], shape, dtype, kernel=_pair(kernel_size),
                  strides=_pair(stride, kernel_size), padding=[[pad[0], pad[0]], [pad[1], pad[1]]], layout="NCHW",
                  **ceil)
    return y, None


def _avg_pool(self: _Lowering, node, self_, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    pad = _pair(padding)
    if divisor_override is not None:
        return self.decline("divisor_override")
    shape, dtype = self.out(node)
    # explicit padding: the kernel divides by the whole window, zeros included (torch's default), or
    # with count_include_pad=False by its input pixels; in ceil_mode never by what runs past the padding
    count = {} if count_include_pad or pad == [0, 0] else {"count_include_pad": False}
    ceil = {"ceil_mode": True} if ceil_mode else {}
    return self.emit("avg_pool2d", [self.tensor(self_)], shape, dtype, kernel=_pair(kernel_size),
                     strides=_pair(stride, kernel_size), padding=[[pad[0], pad[0]], [pad[1], pad[1]]], layout="NCHW",
                     **count, **ceil)


def _adaptive_windows(size: int, out: int) -> np.ndarray:
    """(out, size): row i averages torch's window floor(i * size / out) .. ceil((i + 1) * size / out)."""
    matrix = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _adaptive_avg_pool(self: _Lowering, node, self_, output_size):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    (h, w), (out_h, out_w) = self.shape(x)[2:], shape[2:]
    if len(shape) != 4:
        return self.decline(f"a {len(shape)}-d input (only (N, C, H, W))", form="rank")
    if h % out_h == 0 and w % out_w == 0:
        kernel = [h // out_h, w // out_w]
        return self.emit("avg_pool2d", [x], shape, dtype, kernel=kernel, strides=kernel,
                         padding=[[0, 0], [0, 0]], layout="NCHW")
    # windows that overlap or repeat: y = A_h x A_w^T with torch's windows, a linear map per axis
    rows = self.constant(_adaptive_windows(h, out_h).astype(np.float32), dtype, f"{self.hint}.rows")
    cols = self.constant(_adaptive_windows(w, out_w).astype(np.float32), dtype, f"{self.hint}.cols")
    return self.emit("einsum", [x, rows, cols], shape, dtype, equation="nchw,ih,jw->ncij")


def _upsample(method: str):
    """upsample_nearest2d / upsample_bilinear2d (nn.Upsample, F.interpolate), .vec and .default."""
    def lower(self: _Lowering, node, input, output_size=None, align_corners=False, scale_factors=None,
              scales_h=None, scales_w=None):
        if align_corners:
            return self.decline("align_corners=True (only False)", form="align_corners")
        shape, dtype = self.out(node)
        x = self.tensor(input)
        (h, w), (out_h, out_w) = self.shape(x)[2:], shape[2:]
        scales = scale_factors if scale_factors is not None else [s for s in (scales_h, scales_w) if s is not None]
        # torch maps an output pixel back by 1 / scale_factor when one is given, by in / out otherwise
        if scales and any(float(s) * n != o for s, n, o in zip(_pair(list(scales)), (h, w), (out_h, out_w))):
            return self.decline(f"scale_factor={list(scales)} that does not give a whole output size",
                                    form="scale")
        if method == "nearest" and (out_h % h or out_w % w):
            given = f"scale_factor={list(scales)}" if scales else f"size={[out_h, out_w]}"
            return self.decline(f"{given}: nearest resizing from {h}x{w} to {out_h}x{out_w} "
                                "(only by whole-number factors)", form="factor")
        return self.emit("resize2d", [x], shape, dtype, size=[out_h, out_w], method=method, layout="NCHW")
    return lower
