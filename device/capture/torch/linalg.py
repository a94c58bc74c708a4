"""Handlers of linear algebra: matmul (mm, bmm), linear, addmm and baddbmm, einsum.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

from device.capture.torch.lowering import _Lowering


def _matmul(self: _Lowering, node, self_, other=None, mat2=None, **_):
    shape, dtype = self.out(node)
    return self.emit("matmul", [self.tensor(self_), self.tensor(other if other is not None else mat2)], shape, dtype)


def _linear(self: _Lowering, node, input, weight, bias=None):
    shape, dtype = self.out(node)
    y = self.emit("matmul", [self.tensor(input), self.transpose(self.tensor(weight), [1, 0])], shape, dtype)
    return y if bias is None else self.emit("add", [y, self.tensor(bias)], shape, dtype)


def _addmm(self: _Lowering, node, self_, mat1=None, mat2=None, batch1=None, batch2=None, beta=1, alpha=1):
    shape, dtype = self.out(node)
    a, b = (mat1, mat2) if mat1 is not None else (batch1, batch2)
    y = self.emit("matmul", [self.tensor(a), self.tensor(b)], shape, dtype)
    if alpha != 1:
        y = self.binary("mul", y, self.scalar(alpha, dtype))
    if beta == 0:
        return y
    bias = self.tensor(self_)
    if beta != 1:
        bias = self.binary("mul", bias, self.scalar(beta, dtype))
    return self.emit("add", [y, bias], shape, dtype)


def _einsum(self: _Lowering, node, equation, tensors, path=None):
    shape, dtype = self.out(node)
    return self.emit("einsum", [self.tensor(t) for t in tensors], shape, dtype, equation=equation)
