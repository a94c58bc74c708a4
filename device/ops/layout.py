"""Layout ops: they only change how data is laid out (shape, order, dtype), so they take no PEs.

A layout op between kernels is routing; on a weight it is folded into the kernel that
uses the weight (a weight is laid out once, where it lives: device/passes/match.py).
"""

from __future__ import annotations

import math

import numpy as np

from device.dtypes import FLOATS, FORMATS, round_to
from device.ops.arrays import unbroadcast
from device.ops.record import ANY, OpRecord, Shape, free, reads_nothing, same_shape
from zoo_base.errors import UserError


def _identity_backward(saved, grads, attrs, needs):
    # tf.stop_gradient is captured as an identity marked stop_gradient (device/capture/tf/elementwise.py)
    return [None if attrs.get("stop_gradient") else grads[0]]


def _cast_forward(inputs, attrs, ctx):
    x = inputs[0]
    dtype = attrs["dtype"]
    # the 16-bit formats are stored as float32, rounded to the format
    y = round_to(x, dtype) if dtype in FLOATS else x.astype(dtype)
    return [y], (x.dtype, dtype)


def _cast_backward(saved, grads, attrs, needs):
    in_dtype, out_dtype = saved
    if not (np.issubdtype(in_dtype, np.floating) and (out_dtype in FLOATS or out_dtype == "float64")):
        return [None]
    g = grads[0]
    # the gradient of a 16-bit value is itself 16-bit (as torch's .to(bfloat16) backward)
    if out_dtype in FORMATS:
        g = round_to(g, out_dtype)
    return [g.astype(in_dtype, copy=False)]


def _reshape_forward(inputs, attrs, ctx):
    x = inputs[0]
    return [x.reshape(attrs["shape"])], x.shape


def _transpose_forward(inputs, attrs, ctx):
    perm = attrs["perm"]
    return [np.transpose(inputs[0], perm)], np.argsort(perm)


def _concat_forward(inputs, attrs, ctx):
    axis = attrs["axis"]
    return [np.concatenate(inputs, axis=axis)], [x.shape[axis] for x in inputs]


def _concat_backward(saved, grads, attrs, needs):
    return np.split(grads[0], np.cumsum(saved)[:-1], axis=attrs["axis"])


def _slice_index(attrs, ndim: int) -> tuple[slice, ...]:
    begin, end = attrs["begin"], attrs["end"]
    step = attrs.get("step") or [1] * len(begin)
    return tuple(slice(b, e, s) for b, e, s in zip(begin, end, step)) + (slice(None),) * (ndim - len(begin))


def _slice_forward(inputs, attrs, ctx):
    x = inputs[0]
    index = _slice_index(attrs, x.ndim)
    return [x[index]], (x.shape, index)


def _slice_backward(saved, grads, attrs, needs):
    shape, index = saved
    g = np.zeros(shape, dtype=grads[0].dtype)
    g[index] = grads[0]
    return [g]


def _reshape_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    """The target shape; its one -1 is what the input's known size leaves (None if unknown)."""
    target = list(attrs["shape"])
    if -1 in target:
        known = [d for d in target if d != -1]
        size = math.prod(shapes[0]) if all(d is not None for d in shapes[0]) else None
        rest = math.prod(known) if all(d is not None for d in known) else None
        target[target.index(-1)] = size // rest if size is not None and rest else None
    return [tuple(target)]


def _concat_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    axis = attrs["axis"] % len(shapes[0])
    sizes = [s[axis] for s in shapes]
    out = list(shapes[0])
    out[axis] = None if None in sizes else sum(sizes)
    return [tuple(out)]


def _slice_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    shape = shapes[0]
    begin, end = attrs["begin"], attrs["end"]
    step = attrs.get("step") or [1] * len(begin)
    out = list(shape)
    for axis, (b, e, s) in enumerate(zip(begin, end, step)):
        out[axis] = None if shape[axis] is None else len(range(*slice(b, e, s).indices(shape[axis])))
    return [tuple(out)]


# ---- tile (vision and losses) ----


def _tile_forward(inputs, attrs, ctx):
    x = inputs[0]
    multiples = list(attrs["multiples"])
    x = x.reshape((1,) * (len(multiples) - x.ndim) + x.shape)  # torch's repeat: more multiples than axes
    return [np.tile(x, multiples)], (inputs[0].shape, x.shape)


def _tile_backward(saved, grads, attrs, needs):
    shape, lifted = saved
    multiples = list(attrs["multiples"])
    # (m0 * d0, m1 * d1, ...) -> (m0, d0, m1, d1, ...): each copy's gradient adds up
    split = [n for m, d in zip(multiples, lifted) for n in (m, d)]
    g = grads[0].reshape(split).sum(axis=tuple(range(0, 2 * len(multiples), 2)))
    return [g.reshape(shape)]


def _tile_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    multiples = list(attrs["multiples"])
    shape = tuple(shapes[0])
    if len(multiples) < len(shape) or any(int(m) < 1 for m in multiples):
        raise ValueError(f"multiples {multiples} must be positive, one per axis of {shape}")
    shape = (1,) * (len(multiples) - len(shape)) + shape
    return [tuple(None if d is None else d * int(m) for d, m in zip(shape, multiples))]


# ---- padding: constant, reflect, symmetric, edge (vision and losses) ----

# mode -> numpy.pad's mode: torch's reflect and TF's MirrorPad REFLECT leave the edge out, TF's
# SYMMETRIC repeats it, torch's replicate repeats the edge pixel
PAD_MODES = {"constant": "constant", "reflect": "reflect", "symmetric": "symmetric", "edge": "edge"}


def _pad_sources(n: int, before: int, after: int, mode: str) -> np.ndarray:
    """For each position along a padded axis of ``n`` elements, the input index it copies."""
    return np.pad(np.arange(n), (before, after), mode=PAD_MODES[mode])


def _pad_forward(inputs, attrs, ctx):
    x = inputs[0]
    pads = [tuple(p) for p in attrs["pads"]]
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        value = attrs.get("value") or 0
        index = tuple(slice(before, before + n) for (before, _), n in zip(pads, x.shape))
        return [np.pad(x, pads, constant_values=x.dtype.type(value))], (mode, index)
    return [np.pad(x, pads, mode=PAD_MODES[mode])], (mode, x.shape)


def _pad_backward(saved, grads, attrs, needs):
    mode, index = saved
    if mode == "constant":  # the gradient is the unpadded part
        return [grads[0][index]]
    g = grads[0]
    for axis, ((before, after), n) in enumerate(zip(attrs["pads"], index)):  # index: the input's shape
        if before == after == 0:
            continue
        # every padded position adds its gradient to the input position it copies
        summed = np.zeros(g.shape[:axis] + (n,) + g.shape[axis + 1:], dtype=g.dtype)
        np.add.at(summed, (slice(None),) * axis + (_pad_sources(n, before, after, mode),), g)
        g = summed
    return [g]


def _pad_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    pads = [list(p) for p in attrs["pads"]]
    shape = tuple(shapes[0])
    if len(pads) != len(shape) or any(len(p) != 2 or min(p) < 0 for p in pads):
        raise ValueError(f"pads {pads} must be one non-negative [before, after] per axis of {shape}")
    mode = attrs.get("mode", "constant")
    if mode not in PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not one of {', '.join(PAD_MODES)}")
    # reflect takes at most n - 1 from each side, symmetric n (numpy would wrap around; torch and TF refuse)
    most = {"reflect": lambda n: n - 1, "symmetric": lambda n: n}.get(mode)
    if most and any(d is not None and max(p) > most(d) for d, p in zip(shape, pads)):
        raise ValueError(f"{mode} padding {pads} is wider than the axes of {shape} allow")
    return [tuple(None if d is None else d + p[0] + p[1] for d, p in zip(shape, pads))]


def _layout(name: str, summary: str, attrs: tuple, shape, forward, backward, inputs=("x",), **kw) -> OpRecord:
    return OpRecord(name, summary, inputs, attrs, "layout", (ANY,), shape, forward, backward,
                    cost=free, backward_reads=reads_nothing, **kw)


RECORDS = (
    _layout("reshape", "x with the shape attribute (one -1 allowed)", ("shape",), _reshape_shape, _reshape_forward,
            lambda shape, grads, attrs, needs: [grads[0].reshape(shape)]),
    _layout("transpose", "numpy.transpose(x, perm)", ("perm",),
            lambda shapes, attrs: [tuple(shapes[0][p] for p in attrs["perm"])], _transpose_forward,
            lambda inverse, grads, attrs, needs: [np.transpose(grads[0], inverse)]),
    _layout("concat", "operands joined along axis", ("axis",), _concat_shape, _concat_forward, _concat_backward,
            inputs=("*operands",)),
    _layout("slice", "x[begin:end:step] per axis (lists; axes beyond them whole)", ("begin", "end", "step?"),
            _slice_shape, _slice_forward, _slice_backward),
    _layout("broadcast_to", "numpy.broadcast_to(x, shape)", ("shape",),
            lambda shapes, attrs: [tuple(attrs["shape"])],
            lambda inputs, attrs, ctx: ([np.broadcast_to(inputs[0], attrs["shape"])], inputs[0].shape),
            lambda shape, grads, attrs, needs: [unbroadcast(grads[0], shape)]),
    # stop_gradient: tf.stop_gradient, an identity no gradient flows back through
    _layout("identity", "x (stop_gradient: no gradient flows back)", ("stop_gradient?",), same_shape,
            lambda inputs, attrs, ctx: ([inputs[0]], None), _identity_backward),
    # the 16-bit formats are float32 rounded to the format; the gradient of a 16-bit value is 16-bit
    _layout("cast", "x as dtype (a 16-bit format: rounded)", ("dtype",), same_shape, _cast_forward, _cast_backward,
            dtype=lambda dtypes, attrs: [attrs["dtype"]]),
    # vision and losses: tf.tile, torch's repeat (and the nearest upsampling Keras writes with it)
    _layout("tile", "numpy.tile(x, multiples) (more multiples than axes: leading axes of 1 first)", ("multiples",),
            _tile_shape, _tile_forward, _tile_backward),
    # torch's F.pad (constant, reflect, replicate), tf.pad (CONSTANT, REFLECT, SYMMETRIC), Keras ZeroPadding2D
    _layout("pad", "x padded, pads one [before, after] per axis; mode constant (with value, default 0), reflect "
            "(mirrored without the edge), symmetric (with it) or edge (the edge repeated)",
            ("pads", "value?", "mode?"), _pad_shape, _pad_forward, _pad_backward),
)


# ---- the host's checks on the data ----


def _host_check_forward(inputs, attrs, ctx):
    value = bool(np.asarray(inputs[0]).reshape(()))
    if value != attrs["expected"]:
        raise UserError(f"`{attrs['code']}` is {value} on this batch and was {attrs['expected']} on the batch the "
                        "step was captured with: the device runs the branch it captured, so it refuses this batch "
                        "(the host checks this condition on every batch)")
    return [np.asarray(value)], None


RECORDS += (
    # an if or assert on a tensor in the step (`if labels.max() >= vocab: raise`, `assert (n > 0).all()`): the
    # capture follows the branch the first batch takes, the host checks every batch takes it; no PEs
    _layout("host_check", "bool(condition), which must be expected (the captured branch): a batch where it is not "
            "is refused at the user's line, naming the condition (code)", ("expected", "code"),
            lambda shapes, attrs: [()], _host_check_forward, None, inputs=("condition",),
            dtype=lambda dtypes, attrs: ["bool"]),
)
