"""Handlers of language ops: embedding, scaled_dot_product_attention, gathers and advanced indexing.

``scaled_dot_product_attention`` is its math form, softmax(q k^T * scale + mask) v; with a
boolean mask from the batch, a query that attends nowhere gives zeros, as torch's safe softmax.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from device.capture.torch.lowering import _Lowering, _axis, _broadcast
from device.dtypes import FORMATS


def _embedding(self: _Lowering, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        return self.decline("scale_grad_by_freq=True")
    shape, dtype = self.out(node)
    table = self.tensor(weight)
    if padding_idx is not None and padding_idx >= 0:
        # the padding row is read as it is (zero unless the user set it) and gets no gradient
        return self.emit("embedding", [table, self.tensor(indices)], shape, dtype, padding_idx=int(padding_idx))
    return self.emit("embedding", [table, self.tensor(indices)], shape, dtype)


def _sdpa(self: _Lowering, node, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """softmax(q @ k^T * scale + mask) @ v, the math form of scaled_dot_product_attention."""
    if enable_gqa:
        return self.decline("enable_gqa=True")
    shape, dtype = self.out(node)
    q, k, v = self.tensor(query), self.tensor(key), self.tensor(value)
    (*_, length, depth), source_length = self.shape(q), self.shape(k)[-2]
    scale = 1.0 / math.sqrt(depth) if scale is None else scale
    scores_shape = _broadcast(self.shape(q)[:-2], self.shape(k)[:-2]) + (length, source_length)
    scores = self.emit("matmul", [q, self.swap_last(k)], scores_shape, dtype)
    scores = self.binary("mul", scores, self.scalar(scale, dtype))
    if is_causal:
        causal = np.where(np.tril(np.ones((length, source_length), dtype=bool)), 0.0, -np.inf)
        scores = self.binary("add", scores, self.constant(causal, dtype, f"{node.name}.causal_mask"))
    if attn_mask is not None:
        if attn_mask in self.known and self.known[attn_mask].dtype == torch.bool:
            additive = np.where(self.known[attn_mask].numpy(), 0.0, -np.inf)
            scores = self.binary("add", scores, self.constant(additive, dtype, f"{node.name}.mask"))
        elif attn_mask.meta["val"].dtype == torch.bool:  # a padding mask from the batch: True attends
            # torch's safe softmax: a row that attends nowhere (a left-padded query) gives zeros, not
            # NaN; so the fill is finite (that row's softmax is uniform, then zeroed by the mask)
            mask = self.tensor(attn_mask)
            precision = FORMATS.get(self.g.precision)  # finite in the compute format, too
            fill = self.scalar(-(precision.max if precision else float(np.finfo(np.float32).max)), dtype)
            scores = self.emit("where", [mask, scores, fill], self.shape(scores), dtype)
            probs = self.emit("softmax", [scores], self.shape(scores), dtype, axis=len(self.shape(scores)) - 1)
            probs = self.emit("where", [mask, probs, self.scalar(0.0, dtype)], self.shape(probs), dtype)
            return self._attend(probs, v, dropout_p, shape, dtype)
        else:
            scores = self.binary("add", scores, self.tensor(attn_mask, dtype))
    probs = self.emit("softmax", [scores], self.shape(scores), dtype, axis=len(self.shape(scores)) - 1)
    return self._attend(probs, v, dropout_p, shape, dtype)


def _gather(self: _Lowering, node, self_, dim, index, sparse_grad=False):
    # sparse_grad only picks the layout of torch's gradient, never its values
    shape, dtype = self.out(node)
    return self.emit("take_along_axis", [self.tensor(self_), self.tensor(index)], shape, dtype,
                     axis=_axis(dim, len(self_.meta["val"].shape)))


def _index_select(self: _Lowering, node, self_, dim, index):
    shape, dtype = self.out(node)
    return self.emit("gather", [self.tensor(self_), self.tensor(index)], shape, dtype,
                     axis=_axis(dim, len(self_.meta["val"].shape)))


def _index(self: _Lowering, node, self_, indices):
    """x[i0, i1, ...] (advanced indexing), index tensors on consecutive axes from ``first``.

    The indexed axes are flattened into one, the index tensors combined into flat row
    numbers (i0 * n1 + i1 ...), and one gather picks the rows: x[arange(B)[:, None], positions]
    (BERT's masked-position gather) is one gather of (B * T, D) rows.
    """
    shape, dtype = self.out(node)
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used or used != list(range(used[0], used[-1] + 1)):
        return self.decline("index tensors on axes that are not next to each other")
    if any(t.meta["val"].dtype not in (torch.int64, torch.int32) for t in indices if t is not None):
        return self.decline("boolean (mask) indexing: its shape depends on the data")
    x = self.tensor(self_)
    first, count = used[0], len(used)
    dims = self.shape(x)
    index_shape = tuple(shape[first:first + len(shape) - (len(dims) - count)])
    flat = None
    for k, i in enumerate(used):
        ids = self.tensor(indices[i], "int64")
        if ids in self.g.constants:  # python's negative indices count from the end: i + n where i < 0
            ids = self.constant(np.where(self.g.constants[ids] < 0, self.g.constants[ids] + dims[i],
                                         self.g.constants[ids]), "int64", f"{node.name}.index")
        else:
            negative = self.emit("less", [ids, self.scalar(0, "int64")], self.shape(ids), "bool")
            wrapped = self.binary("add", ids, self.scalar(dims[i], "int64"))
            ids = self.emit("where", [negative, wrapped, ids], self.shape(ids), "int64")
        stride = int(np.prod(dims[i + 1:first + count], dtype=np.int64))
        term = ids if stride == 1 else self.binary("mul", ids, self.scalar(stride, "int64"))
        flat = term if flat is None else self.emit("add", [flat, term], _broadcast(self.shape(flat), self.shape(term)),
                                                   "int64")
    if self.shape(flat) != index_shape:
        flat = self.emit("broadcast_to", [flat], index_shape, "int64", shape=list(index_shape))
    rows = self.reshape(x, dims[:first] + (int(np.prod(dims[first:first + count], dtype=np.int64)),)
                        + dims[first + count:])
    return self.emit("gather", [rows, flat], shape, dtype, axis=first)
