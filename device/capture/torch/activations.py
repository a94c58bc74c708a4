"""Handlers of activations (gelu, softplus, elu and selu, leaky_relu, clamp, hardtanh) and dropout.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import math

from device.capture.torch.lowering import _Lowering


_SELU_ALPHA = 1.6732632423543772


_SELU_SCALE = 1.0507009873554805


def _gelu(self: _Lowering, node, self_, approximate="none"):
    shape, dtype = self.out(node)
    return self.emit("gelu", [self.tensor(self_)], shape, dtype, approximate=approximate)


def _softplus(self: _Lowering, node, self_, beta=1, threshold=20):
    shape, dtype = self.out(node)
    return self.emit("softplus", [self.tensor(self_)], shape, dtype, beta=float(beta), threshold=float(threshold))


def _elu(self: _Lowering, node, self_, alpha=1, scale=1, input_scale=1):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    if input_scale != 1:
        return self.decline(f"input_scale={input_scale}")
    if math.isclose(alpha, _SELU_ALPHA) and math.isclose(scale, _SELU_SCALE):
        return self.emit("selu", [x], shape, dtype)
    y = self.emit("elu", [x], shape, dtype, alpha=float(alpha))
    return y if scale == 1 else self.binary("mul", y, self.scalar(scale, dtype))


def _leaky_relu(self: _Lowering, node, self_, negative_slope=0.01):
    if not 0 <= negative_slope <= 1:
        return self.decline(f"negative_slope={negative_slope}")
    x = self.tensor(self_)
    # max(x, a*x) == leaky_relu(x) for 0 <= a <= 1
    return self.binary("maximum", x, self.binary("mul", x, self.scalar(negative_slope, self.dtype(x))))


def _clamp(self: _Lowering, node, self_, min=None, max=None, **_):
    dtype = self.out(node)[1]
    x = self.tensor(self_, dtype)
    bounds = [b for b in (min, max) if b is not None]
    if bounds and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
        # one clamp node: its gradient is torch's on the bounds too (maximum's would split a tie);
        # integer values (a QA head's start and end positions) keep integer bounds: exact, no float
        number = int if dtype in ("int32", "int64") else float
        attrs = {k: number(v) for k, v in (("min", min), ("max", max)) if v is not None}
        return self.emit("clamp", [x], self.shape(x), dtype, **attrs)
    # tensor bounds (aten.clamp.Tensor): maximum, then minimum, whose ties split the gradient in
    # halves between x and the bound, as torch's clamp.Tensor backward does; exact on integers
    if min is not None:
        x = self.binary("maximum", x, self.tensor(min, dtype))
    if max is not None:
        x = self.binary("minimum", x, self.tensor(max, dtype))
    return x


def _hardtanh(self: _Lowering, node, self_, min_val=-1, max_val=1):
    return _clamp(self, node, self_, min=min_val, max=max_val)


def _bernoulli(self: _Lowering, node, self_, p=0.5, generator=None):
    """``torch.empty(...).bernoulli_(p)``: a 0/1 mask, 1 with probability p, of the input's shape (its values
    are never read). In-place dropout (``nn.Dropout(inplace=True)``) and torchvision's stochastic depth draw
    their masks so; the emulator draws it as dropout of ones at rate 1 - p (the values 1 / p), times p."""
    if generator is not None:
        return self.decline("a generator argument (the device draws from its own)", form="generator")
    shape, dtype = self.out(node)
    ones = self.emit("broadcast_to", [self.scalar(1.0, dtype)], shape, dtype, shape=list(shape))
    kept = self.emit("dropout", [ones], shape, dtype, rate=1.0 - float(p))
    return self.binary("mul", kept, self.scalar(float(p), dtype))


def _dropout(self: _Lowering, node, input, p, train):
    x = self.tensor(input)
    if train is False or p == 0:
        y = x
    else:
        y = self.emit("dropout", [x], self.shape(x), self.dtype(x), rate=float(p))
    return (y, None) if str(node.target) == "aten.native_dropout.default" else y
