"""Handlers of reductions: sum, mean, max (with its indices), argmax, var, cumsum, all and any.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import math

import numpy as np

from device.capture.torch.lowering import _Lowering, _axes, _axis


def _reduction(op: str):
    def lower(self: _Lowering, node, self_, dim=None, keepdim=False, dtype=None):
        out_dtype = self.out(node)[1]
        x = self.tensor(self_, out_dtype)
        return self.reduce(op, x, _axes(dim, len(self.shape(x))), bool(keepdim))
    return lower


def _max_dim(self: _Lowering, node, self_, dim, keepdim=False):
    x = self.tensor(self_)
    axis = _axis(dim, len(self.shape(x)))
    values = self.reduce("reduce_max", x, [axis], bool(keepdim))
    indices = _argmax(self, node, self_, dim, keepdim, index=1)
    return values, indices


def _argmax(self: _Lowering, node, self_, dim=None, keepdim=False, index=None):
    shape, dtype = self.out(node, index)
    x = self.tensor(self_)
    if dim is None:
        x = self.reshape(x, (int(np.prod(self.shape(x))),))
        dim = 0
    axis = _axis(dim, len(self.shape(x)))
    reduced = [d for i, d in enumerate(self.shape(x)) if i != axis]
    y = self.emit("argmax", [x], reduced, dtype, axis=axis)
    return self.reshape(y, shape)


def _var(self: _Lowering, node, self_, dim=None, correction=None, keepdim=False, index=None):
    """var = sum((x - mean)^2) / (n - correction), correction 1 by default (Bessel)."""
    shape, dtype = self.out(node, index)
    x = self.tensor(self_, dtype)
    axes = _axes(dim, len(self.shape(x)))
    mean = self.reduce("reduce_mean", x, axes, True)
    centred = self.binary("sub", x, mean)
    squared = self.emit("square", [centred], self.shape(centred), dtype)
    total = self.reduce("reduce_sum", squared, axes, bool(keepdim))
    count = int(np.prod([self.shape(x)[a] for a in axes]))
    correction = 1 if correction is None else correction
    return self.binary("div", total, self.scalar(float(max(count - correction, 0)), dtype)), mean


def _var_only(self: _Lowering, node, **args):
    return _var(self, node, **args)[0]


def _var_mean(self: _Lowering, node, self_, dim=None, correction=None, keepdim=False):
    var, mean = _var(self, node, self_, dim, correction, keepdim, index=0)
    return var, self.reshape(mean, self.out(node, 1)[0])


def _cumsum(self: _Lowering, node, self_, dim, dtype=None):
    shape, dtype = self.out(node)  # the dtype argument is the output's (bool and ints sum as int64)
    return self.emit("cumsum", [self.tensor(self_, dtype)], shape, dtype, axis=_axis(dim, len(shape)))


def _all_or_any(kind: str):
    """all(x) and any(x) of a bool (or number) tensor, over dims or all: the count of true values
    against the count of values (all) or 0 (any), in int64: exact."""
    def lower(self: _Lowering, node, self_, dim=None, keepdim=False):
        shape, _ = self.out(node)
        x = self.tensor(self_)
        rank = len(self.shape(x))
        dims = [dim] if isinstance(dim, int) else dim
        axes = _axes(dims, rank)
        if self.dtype(x) != "bool":
            x = self.emit("not_equal", [x, self.scalar(0, self.dtype(x))], self.shape(x), "bool")
        count = self.reduce("reduce_sum", self.cast(x, "int64"), axes, bool(keepdim))
        if kind == "all":
            size = math.prod(self.shape(x)[a] for a in axes)
            return self.emit("equal", [count, self.scalar(size, "int64")], shape, "bool")
        return self.emit("greater", [count, self.scalar(0, "int64")], shape, "bool")
    return lower
