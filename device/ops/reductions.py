"""Reductions over axes (numpy's axis and keepdims semantics), argmax, and the running sum cumsum."""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from device.ops.arrays import no_gradient, reduce_rows
from device.ops.record import (NUMBERS, OpRecord, Shape, per_input_element, reads_nothing, reduced_shape,
                               reduction_axes, same_shape)


def _reduce_forward(fn):
    def forward(inputs, attrs, ctx):
        x = inputs[0]
        axes = reduction_axes(attrs.get("axes"), x.ndim)
        keepdims = bool(attrs.get("keepdims", False))
        y = fn(x, axis=axes, keepdims=keepdims)
        return [y], (x, axes, keepdims, y)

    return forward


def _expand_reduced(g, axes, keepdims):
    return g if keepdims else np.expand_dims(g, axes)


def _reduce_sum_backward(saved, grads, attrs, needs):
    x, axes, keepdims, _ = saved
    return [np.broadcast_to(_expand_reduced(grads[0], axes, keepdims), x.shape)]


def _reduce_mean_backward(saved, grads, attrs, needs):
    x, axes, keepdims, _ = saved
    count = math.prod(x.shape[a] for a in axes)
    return [np.broadcast_to(_expand_reduced(grads[0], axes, keepdims) / count, x.shape)]


def _reduce_max_backward(saved, grads, attrs, needs):
    x, axes, keepdims, y = saved
    # ties share the gradient equally (torch.amax and tf.reduce_max agree)
    winners = (x == _expand_reduced(y, axes, keepdims)).astype(x.dtype)
    share = winners / winners.sum(axis=axes, keepdims=True)
    return [_expand_reduced(grads[0], axes, keepdims) * share]


def _argmax_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    axis = attrs["axis"] % len(shapes[0])
    return [tuple(d for i, d in enumerate(shapes[0]) if i != axis)]


def _running_sum(x, axis: int, exclusive: bool, reverse: bool):
    """cumsum along axis; exclusive: each sum leaves out its own element; reverse: from the end."""
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:  # shift by one: 0, x0, x0 + x1, ...
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=axis)), np.delete(y, -1, axis=axis)], axis=axis)
    return np.flip(y, axis) if reverse else y


def _cumsum_forward(inputs, attrs, ctx):
    x = inputs[0]
    axis = int(attrs["axis"]) % x.ndim
    return [_running_sum(x, axis, bool(attrs.get("exclusive", False)), bool(attrs.get("reverse", False)))], axis


def _cumsum_backward(saved, grads, attrs, needs):
    # the adjoint of a running sum is the running sum the other way round
    axis = saved
    return [_running_sum(grads[0], axis, bool(attrs.get("exclusive", False)), not attrs.get("reverse", False))]


def _reduction(name: str, summary: str, forward, backward, **kw) -> OpRecord:
    # one flop per input element
    return OpRecord(name, summary, ("x",), ("axes?", "keepdims?"), "reduction", (NUMBERS,), reduced_shape, forward,
                    backward, cost=per_input_element(1), **kw)


RECORDS = (
    _reduction("reduce_sum", "sum over axes (None: all)", _reduce_forward(partial(reduce_rows, np.sum)),
               _reduce_sum_backward, backward_reads=reads_nothing),
    _reduction("reduce_mean", "mean over axes (None: all)", _reduce_forward(partial(reduce_rows, np.mean)),
               _reduce_mean_backward, backward_reads=reads_nothing),
    _reduction("reduce_max", "max over axes (None: all); ties share the gradient", _reduce_forward(np.max),
               _reduce_max_backward),
    # an eval helper: no gradient, and no backward work
    OpRecord("argmax", "index of the largest value along axis (int64)", ("x",), ("axis",), "reduction", (NUMBERS,),
             _argmax_shape, **no_gradient(lambda inputs, attrs: np.argmax(inputs[0], axis=attrs["axis"])),
             dtype=lambda dtypes, attrs: ["int64"], cost=per_input_element(1), backward_ratio=0.0,
             backward_reads=reads_nothing),
    # language ops: position ids from a padding mask (cumsum of the mask), TF's Cumsum
    OpRecord("cumsum", "running sum along axis; exclusive: without the element itself; reverse: from the end",
             ("x",), ("axis", "exclusive?", "reverse?"), "reduction", (NUMBERS,), same_shape, _cumsum_forward,
             _cumsum_backward, cost=per_input_element(1), backward_reads=reads_nothing),
)
