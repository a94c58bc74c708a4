"""Handlers of layout ops: views, transposes, slices, splits, concatenation, tiling, flips, pads,
and the writes into tensors that export makes functional (slice and element assignment).

A write lowers onto existing records: the tensor and the written values side by side
(concat), then a gather with constant indices picking each position's source; a boolean
mask with one value is a where.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.fx

from device.capture.torch.lowering import _Lowering, _axes, _axis


def _view(self: _Lowering, node, self_, **_):
    return self.reshape(self.tensor(self_), self.out(node)[0])


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


def _in_order(shape, strides) -> bool:
    """Do these strides lay the elements out in row-major order (a size-1 axis's stride is free)?"""
    return all(d == 1 or s == c for d, s, c in zip(shape, strides, _contiguous_strides(shape)))


def _as_strided(self: _Lowering, node, self_, size, stride, storage_offset=None):
    """torch.as_strided that reads the input's elements in their order (what F.adaptive_avg_pool2d's
    1x1 output gets to restore its memory format): a reshape. Any other window is declined."""
    val = self_.meta["val"]
    size, stride = [int(d) for d in size], [int(s) for s in stride]
    if (not storage_offset and not val.storage_offset() and _in_order(val.shape, val.stride())
            and math.prod(size) == val.numel() and _in_order(size, stride)):
        return self.reshape(self.tensor(self_), size)
    return self.decline(f"a strided window (size {size}, stride {stride}, offset {storage_offset or 0}) over a "
                        f"tensor of shape {list(val.shape)}: only a view that keeps the elements in order runs "
                        "on the device; write it with reshape, permute, slicing or Tensor.unfold", form="window")


def _expand(self: _Lowering, node, self_, **_):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    if self.shape(x) == shape:
        return x
    return self.emit("broadcast_to", [x], shape, dtype, shape=list(shape))


def _permute(self: _Lowering, node, self_, dims):
    return self.transpose(self.tensor(self_), dims)


def _transpose(self: _Lowering, node, self_, dim0, dim1):
    x = self.tensor(self_)
    rank = len(self.shape(x))
    perm = list(range(rank))
    d0, d1 = _axis(dim0, rank), _axis(dim1, rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return self.transpose(x, perm)


def _t(self: _Lowering, node, self_):
    x = self.tensor(self_)
    return self.transpose(x, [1, 0]) if len(self.shape(x)) == 2 else x


def _slice(self: _Lowering, node, self_, dim=0, start=None, end=None, step=1):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    size = shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    return self.slice(x, dim, min(max(start, 0), size), min(max(end, 0), size), step)


def _select(self: _Lowering, node, self_, dim, index):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    index = index + shape[dim] if index < 0 else index
    return self.reshape(self.slice(x, dim, index, index + 1), self.out(node)[0])


def _split(self: _Lowering, node, self_, split_size=None, split_sizes=None, dim=0):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    if split_sizes is None:
        split_sizes = [min(split_size, shape[dim] - s) for s in range(0, shape[dim], split_size)]
    parts, start = [], 0
    for size in split_sizes:
        parts.append(self.slice(x, dim, start, start + size))
        start += size
    return tuple(parts)


def _unbind(self: _Lowering, node, self_, dim=0):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    out_shape = shape[:dim] + shape[dim + 1:]
    return tuple(self.reshape(self.slice(x, dim, i, i + 1), out_shape) for i in range(shape[dim]))


def _cat(self: _Lowering, node, tensors, dim=0):
    shape, dtype = self.out(node)
    names = [self.tensor(t, dtype) for t in tensors]
    names = [n for n in names if self.shape(n) != (0,)]  # torch.cat skips legacy empty 1-D tensors
    return self.emit("concat", names, shape, dtype, axis=_axis(dim, len(shape)))


def _stack(self: _Lowering, node, tensors, dim=0):
    shape, dtype = self.out(node)
    axis = _axis(dim, len(shape))
    names = [self.tensor(t, dtype) for t in tensors]
    expanded = [self.reshape(n, self.shape(n)[:axis] + (1,) + self.shape(n)[axis:]) for n in names]
    return self.emit("concat", expanded, shape, dtype, axis=axis)


def _repeat(self: _Lowering, node, self_, repeats):
    shape, dtype = self.out(node)
    return self.emit("tile", [self.tensor(self_)], shape, dtype, multiples=[int(r) for r in repeats])


def _flip(self: _Lowering, node, self_, dims):
    """x.flip(dims): a gather with the indices reversed, per axis."""
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    for dim in _axes(dims, len(shape)) if dims else []:  # flip([]) changes nothing
        index = self.constant(np.arange(shape[dim] - 1, -1, -1, dtype=np.int64), "int64", f"{node.name}.index")
        x = self.emit("gather", [x, index], shape, dtype, axis=dim)
    return x


def _mode_pad(mode: str) -> Callable:
    """reflection_pad{1,2,3}d (mode reflect) and replication_pad{1,2,3}d (mode edge): pad pairs run from the
    last axis backwards."""
    def lower(self: _Lowering, node, self_, padding):
        shape, dtype = self.out(node)
        x = self.tensor(self_)
        pairs = [[0, 0] for _ in shape]
        for i in range(len(padding) // 2):
            pairs[len(shape) - 1 - i] = [int(padding[2 * i]), int(padding[2 * i + 1])]
        if any(p < 0 for pair in pairs for p in pair):
            return self.decline(f"padding={list(padding)} with negative entries (cropping): slice instead",
                                form="crop")
        return self.emit("pad", [x], shape, dtype, pads=pairs, mode=mode)
    return lower


def _constant_pad(self: _Lowering, node, self_, pad, value=0):
    """F.pad(x, pad, value=...): pad pairs run from the last axis backwards."""
    if any(p < 0 for p in pad):
        return self.decline(f"pad={list(pad)} with negative entries (cropping): slice instead", form="crop")
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    pairs = [[0, 0] for _ in shape]
    for i in range(len(pad) // 2):
        pairs[len(shape) - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    return self.emit("pad", [x], shape, dtype, pads=pairs, value=float(value))


# ---- slice and element assignment (``shifted[:, 1:] = ids[:, :-1]``: BART's and T5's shifted labels) ----

def _copy(self: _Lowering, node, self_, src, non_blocking=False):
    """The functional ``self.copy_(src)``: src in self's dtype and shape (``x[:, 1:] = y`` traces to it)."""
    shape, dtype = self.out(node)
    x = self.tensor(src, dtype)
    if self.shape(x) != shape:
        x = self.emit("broadcast_to", [x], shape, dtype, shape=list(shape))
    return x


def _slice_scatter(self: _Lowering, node, self_, src, dim=0, start=None, end=None, step=1):
    """``self`` with ``self[start:end:step]`` along ``dim`` replaced by ``src`` (a slice assignment):
    the two side by side, then a gather with constant indices picking each position's source."""
    shape, dtype = self.out(node)
    x, y = self.tensor(self_, dtype), self.tensor(src, dtype)
    dim = _axis(dim, len(shape))
    size = shape[dim]
    taken = list(range(size))
    for k, i in enumerate(range(*slice(start, end, step).indices(size))):
        taken[i] = size + k
    both = list(shape)
    both[dim] += self.shape(y)[dim]
    joined = self.emit("concat", [x, y], both, dtype, axis=dim)
    index = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, index], shape, dtype, axis=dim)


def _select_scatter(self: _Lowering, node, self_, src, dim, index):
    """``self`` with ``self.select(dim, index)`` replaced by ``src`` (``x[:, 0] = y``)."""
    shape, dtype = self.out(node)
    dim = _axis(dim, len(shape))
    index = index + shape[dim] if index < 0 else index
    row = list(shape)
    row[dim] = 1
    y = self.reshape(self.tensor(src, dtype), row)
    x = self.tensor(self_, dtype)
    both = list(shape)
    both[dim] += 1
    joined = self.emit("concat", [x, y], both, dtype, axis=dim)
    taken = [shape[dim] if i == index else i for i in range(shape[dim])]
    indices = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, indices], shape, dtype, axis=dim)


def _index_put(self: _Lowering, node, self_, indices, values, accumulate=False):
    """``x[mask] = v`` (one boolean index over x's leading axes, one value) as where(mask, v, x), and
    ``x[:, [0, 2]] = v`` (constant positions on one axis) as a slice assignment; an accumulating
    write, positions read from the data, or a mask with as many values as it holds are refused."""
    shape, dtype = self.out(node)
    used = [i for i, t in enumerate(indices) if t is not None]
    if accumulate:
        return self.decline("accumulate=True (index_put_ with sums: a scatter)", form="accumulate")
    if len(used) != 1:
        return self.decline("indices on more than one axis")
    index = indices[used[0]]
    value = values.meta["val"] if isinstance(values, torch.fx.Node) else torch.tensor(values)
    if index.meta["val"].dtype == torch.bool:
        mask_shape = tuple(index.meta["val"].shape)
        if used[0] != 0 or mask_shape != shape[:len(mask_shape)] or value.numel() != 1:
            return self.decline("a boolean index with a value per selected element (a count read from the data)",
                                form="mask")
        mask = self.reshape(self.tensor(index), mask_shape + (1,) * (len(shape) - len(mask_shape)))
        fill = self.reshape(self.tensor(values, dtype), ())
        return self.emit("where", [mask, fill, self.tensor(self_, dtype)], shape, dtype)
    if index not in self.known:
        return self.decline("positions read from the data", form="positions")
    if self.known[index].dim() != 1:
        return self.decline("positions in a tensor of more than one dimension")
    dim, size = used[0], shape[used[0]]
    positions = [int(i) % size for i in self.known[index].tolist()]
    part = list(shape)
    part[dim] = len(positions)
    y = self.tensor(values, dtype)
    if self.shape(y) != tuple(part):
        y = self.emit("broadcast_to", [self.reshape(y, (1,) * (len(part) - len(self.shape(y))) + self.shape(y))],
                      part, dtype, shape=part)
    taken = list(range(size))
    for k, i in enumerate(positions):
        taken[i] = size + k
    both = list(shape)
    both[dim] += len(positions)
    joined = self.emit("concat", [self.tensor(self_, dtype), y], both, dtype, axis=dim)
    picked = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, picked], shape, dtype, axis=dim)
