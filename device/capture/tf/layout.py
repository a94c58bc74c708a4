"""Mappings of layout ops: reshapes, transpose, concat, Pack (tf.stack), slices (StridedSlice,
Slice, Unpack, Split, a reverse as a slice of step -1), tile, pad, broadcast_to.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import ir_dtype, static_shape


def map_reshape(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    if tensor.shape.is_fully_defined():
        shape = tensor.shape.as_list()
    elif op.type == "Reshape" and low.const(op.inputs[1]) is not None:
        shape = [int(d) for d in low.const(op.inputs[1])]
    elif tensor.shape.rank is not None and sum(d is None for d in tensor.shape.as_list()) == 1:
        shape = [-1 if d is None else d for d in tensor.shape.as_list()]
    else:
        raise CannotMap("the target shape is not static")
    return Plan([x], lambda: low.emit("reshape", [low.value(x)], op, [tensor], {"shape": shape}))


def map_transpose(low: Lowering, tensor):
    op = tensor.op
    perm = [int(p) for p in low.attr(op.inputs[1], "the permutation")]
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("transpose", [low.value(x)], op, [tensor], {"perm": perm}))


def map_concat(low: Lowering, tensor):
    op = tensor.op
    operands = list(op.inputs[:-1])
    axis = int(low.attr(op.inputs[-1], "the concat axis")) % tensor.shape.rank
    return Plan(operands, lambda: low.emit("concat", [low.value(t) for t in operands], op, [tensor],
                                              {"axis": axis}))


def map_pack(low: Lowering, tensor):
    """tf.stack (Pack): each operand reshaped with the new axis, then one concat along it."""
    op = tensor.op
    operands = list(op.inputs)
    out_shape = [-1 if d is None else d for d in static_shape(tensor)]
    axis = op.get_attr("axis") % len(out_shape)
    if out_shape.count(-1) > 1:
        raise CannotMap("more than one dimension of unknown size")

    def build():
        if len(operands) == 1:
            low.emit("reshape", [low.value(operands[0])], op, [tensor], {"shape": out_shape})
            return
        part_shape = out_shape[:axis] + [1] + out_shape[axis + 1:]
        parts = [low.aux("reshape", [low.value(t)], op, [None if d == -1 else d for d in part_shape],
                         ir_dtype(t.dtype), {"shape": part_shape}) for t in operands]
        low.emit("concat", parts, op, [tensor], {"axis": axis})
    return Plan(operands, build)


def map_slice(low: Lowering, tensor):
    """tf.slice (Slice): ``size`` -1 runs to the end; a size that is no constant (computed from
    tf.shape of a static tensor, as a layer slicing a table to the sequence length does) is
    the output's static size."""
    op = tensor.op
    x = op.inputs[0]
    begin = [int(b) for b in low.attr(op.inputs[1], "the slice begin")]
    size = low.const(op.inputs[2])
    out = static_shape(tensor)
    bounds = []
    for axis, (b, dim) in enumerate(zip(begin, static_shape(x))):
        n = int(size[axis]) if size is not None else out[axis]
        if n is None:
            raise CannotMap("the slice size is neither a constant nor static")
        end = dim if n == -1 else b + n
        if dim is None and (b != 0 or end is not None):
            raise CannotMap("slicing a dimension of unknown size")
        bounds.append((b, end))
    attrs = {"begin": [b for b, _ in bounds], "end": [e for _, e in bounds], "step": [1] * len(bounds)}
    return Plan([x], lambda: low.emit("slice", [low.value(x)], op, [tensor], attrs))


def map_strided_slice(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    begin = [int(v) for v in low.attr(op.inputs[1], "the slice begin")]
    end = [int(v) for v in low.attr(op.inputs[2], "the slice end")]
    strides = [int(v) for v in low.attr(op.inputs[3], "the slice strides")]
    if any(s <= 0 for s in strides):
        raise CannotMap("a negative stride")
    begin_mask, end_mask, shrink = (op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
    if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):  # x[..., 0], x[:, None]
        begin, end, strides, begin_mask, end_mask, shrink = _dense_slice_spec(
            x.shape.rank, begin, end, strides, begin_mask, end_mask, shrink,
            op.get_attr("ellipsis_mask"), op.get_attr("new_axis_mask"))
    bounds = []  # per axis (start, stop, step), numpy's slice semantics
    for axis, dim in enumerate(x.shape.as_list()):
        if axis >= len(begin):  # axes the spec does not name are kept whole
            bounds.append((0, dim, 1))
            continue
        b = None if begin_mask >> axis & 1 else begin[axis]
        e = None if end_mask >> axis & 1 else end[axis]
        s = strides[axis]
        if shrink >> axis & 1:  # x[b]: the one element b, its axis dropped by the reshape below
            e, s = (None if b == -1 else b + 1), 1
        if dim is None:
            if (b or 0) != 0 or e is not None or s != 1:
                raise CannotMap("slicing a dimension of unknown size")
            bounds.append((0, None, 1))
            continue
        bounds.append(slice(b, e, s).indices(dim))
    attrs = {"begin": [b for b, _, _ in bounds], "end": [e for _, e, _ in bounds], "step": [s for _, _, s in bounds]}
    sliced_shape = [None if e is None else len(range(b, e, s)) for b, e, s in bounds]

    def build():
        if not shrink and sliced_shape == list(static_shape(tensor)):
            low.emit("slice", [low.value(x)], op, [tensor], attrs)
            return
        part = low.aux("slice", [low.value(x)], op, sliced_shape, ir_dtype(x.dtype), attrs)
        shape = [-1 if d is None else d for d in static_shape(tensor)]
        low.emit("reshape", [part], op, [tensor], {"shape": shape})
    return Plan([x], build)


def _dense_slice_spec(rank, begin, end, strides, begin_mask, end_mask, shrink, ellipsis_mask, new_axis_mask):
    """StridedSlice's sparse spec (an ellipsis entry, new-axis entries) as one entry per input axis.

    The ellipsis stands for the axes the other entries do not name; a new axis names none
    (the reshape to the output's static shape inserts it, and drops shrunk axes).
    """
    entries = len(begin)
    if bin(ellipsis_mask).count("1") > 1:
        raise CannotMap("more than one ellipsis")
    named = sum(1 for i in range(entries) if not (ellipsis_mask >> i & 1 or new_axis_mask >> i & 1))
    dense = [(0, 0, 1, 1, 1, 0)] * rank  # whole axes by default: begin and end masked
    axis = 0
    for i in range(entries):
        if ellipsis_mask >> i & 1:
            axis += rank - named
        elif not new_axis_mask >> i & 1:
            dense[axis] = (begin[i], end[i], strides[i], begin_mask >> i & 1, end_mask >> i & 1, shrink >> i & 1)
            axis += 1
    columns = list(zip(*dense)) if dense else [()] * 6
    masks = [sum(bit << a for a, bit in enumerate(col)) for col in columns[3:]]
    return [list(c) for c in columns[:3]] + masks


def map_tile(low: Lowering, tensor):
    op = tensor.op
    multiples = [int(m) for m in low.attr(op.inputs[1], "the multiples")]
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("tile", [low.value(x)], op, [tensor], {"multiples": multiples}))


def _emit_part(low: Lowering, ir_op: str, inputs: list[str], op, tensor, attrs) -> None:
    """emit for one output of a multi-output TF op (Unpack, Split): a node of its own per output."""
    low.graph.add_value(tensor.name, static_shape(tensor), ir_dtype(tensor.dtype))
    low.value_of[tensor.name] = tensor.name
    low.graph.add_node(ir_op, inputs, [tensor.name], attrs, low.loc(op), name=f"{op.name}/{tensor.value_index}")


def _part(low: Lowering, tensor, x, axis: int, start: int, size: int, drop_axis: bool) -> Plan:
    """Output ``tensor`` is x[start:start + size] along ``axis`` (the axis dropped: Unpack)."""
    op = tensor.op
    shape = list(static_shape(x))
    if shape[axis] is None:
        raise CannotMap("splitting a dimension of unknown size")
    attrs = {"begin": [0] * len(shape), "end": list(shape), "step": [1] * len(shape)}  # None: to the end
    attrs["begin"][axis], attrs["end"][axis] = start, start + size

    def build():
        if not drop_axis:
            _emit_part(low, "slice", [low.value(x)], op, tensor, attrs)
            return
        sliced = shape[:axis] + [size] + shape[axis + 1:]
        part = low.aux("slice", [low.value(x)], op, sliced, ir_dtype(x.dtype), attrs)
        _emit_part(low, "reshape", [part], op, tensor, {"shape": [-1 if d is None else d for d in static_shape(tensor)]})
    return Plan([x], build)


def map_unpack(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    axis = op.get_attr("axis") % x.shape.rank
    return _part(low, tensor, x, axis, tensor.value_index, 1, drop_axis=True)


def map_split(low: Lowering, tensor):
    """Split(axis, x) into equal parts; SplitV(x, sizes, axis)."""
    op = tensor.op
    axis_t, x = op.inputs if op.type == "Split" else (op.inputs[2], op.inputs[0])
    axis = int(low.attr(axis_t, "the split axis")) % x.shape.rank
    size = static_shape(x)[axis]
    if size is None:
        raise CannotMap("splitting a dimension of unknown size")
    if op.type == "Split":
        sizes = [size // op.get_attr("num_split")] * op.get_attr("num_split")
    else:
        sizes = [int(v) for v in low.attr(op.inputs[1], "the split sizes")]
    if -1 in sizes:  # SplitV: one size is what the others leave
        sizes[sizes.index(-1)] = size - (sum(sizes) + 1)
    index = tensor.value_index
    return _part(low, tensor, x, axis, sum(sizes[:index]), sizes[index], drop_axis=False)


def map_pad(low: Lowering, tensor):
    """Pad / PadV2 (tf.pad mode CONSTANT, Keras ZeroPadding2D), MirrorPad (tf.pad REFLECT, SYMMETRIC)."""
    op = tensor.op
    x = op.inputs[0]
    if op.type == "MirrorPad" and low.const(op.inputs[1]) is None:
        raise CannotMap("the paddings are not a constant", form="paddings")
    pads = [[int(a), int(b)] for a, b in low.attr(op.inputs[1], "the paddings")]
    if op.type == "MirrorPad":
        attrs = {"pads": pads, "mode": op.get_attr("mode").decode().lower()}  # reflect or symmetric
        return Plan([x], lambda: low.emit("pad", [low.value(x)], op, [tensor], attrs))
    value = low.scalar(op.inputs[2]) if op.type == "PadV2" else 0.0
    if value is None:
        raise CannotMap("constant_values is not a constant")
    return Plan([x], lambda: low.emit("pad", [low.value(x)], op, [tensor], {"pads": pads, "value": float(value)}))


def map_reverse(low: Lowering, tensor):
    """tf.reverse (Keras' go_backwards and Bidirectional): a slice with step -1 on each axis reversed."""
    op = tensor.op
    x = op.inputs[0]
    shape = static_shape(x)
    axes = {int(a) % len(shape) for a in np.reshape(low.attr(op.inputs[1], "the reversed axes"), -1)}
    if any(shape[a] is None for a in axes):
        raise CannotMap("reversing an axis of unknown size")
    # numpy's x[n - 1:-n - 1:-1] is the whole axis backwards (an end of -1 would be the last element)
    attrs = {"begin": [d - 1 if a in axes else 0 for a, d in enumerate(shape)],
             "end": [-d - 1 if a in axes else d for a, d in enumerate(shape)],
             "step": [-1 if a in axes else 1 for a in range(len(shape))]}
    return Plan([x], lambda: low.emit("slice", [low.value(x)], op, [tensor], attrs))


def map_broadcast_to(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    if not tensor.shape.is_fully_defined():
        raise CannotMap("the target shape is not static")
    shape = tensor.shape.as_list()
    return Plan([x], lambda: low.emit("broadcast_to", [low.value(x)], op, [tensor], {"shape": shape}))
