"""One TF op -> one or a few IR ops: the frontend mapping of each TF op type the device lowers.

    AddV2 Add BiasAdd / Sub / Mul / RealDiv Div(float) / Maximum    add / sub / mul / div / maximum
    DivNoNan (denominator a nonzero constant)                      div
    AddN                                                          a chain of add
    Neg Exp Erf Log Sqrt Rsqrt Square Relu Tanh Sigmoid Selu      the same name, lower case
    Softplus                                                      softplus (beta 1, no threshold)
    Elu / LeakyRelu                                               elu(alpha=1) / maximum(x, alpha * x)
    Relu6                                                         clamp [0, 6] (no gradient on the bounds)
    IdentityN (tf.custom_gradient's forward)                      identity per output
    SquaredDifference                                             sub, square
    Pow (exponent 1, 2, 0.5, -0.5)                                identity, square, sqrt, rsqrt
    Identity Snapshot                                             identity
    StopGradient PreventGradient                                  identity {"stop_gradient": True}
    Softmax / LogSoftmax                                          softmax / log_softmax (last axis)
    SparseSoftmaxCrossEntropyWithLogits                           sparse_softmax_cross_entropy (output 0)
    SoftmaxCrossEntropyWithLogits                                 neg(reduce_sum(labels * log_softmax))
    Mean Sum Max                                                  reduce_mean reduce_sum reduce_max
    Reshape Squeeze ExpandDims                                    reshape (the static output shape)
    Transpose / ConcatV2 / StridedSlice (ellipsis, new axis)      transpose / concat / slice (+ reshape)
    MatMul BatchMatMul{,V2,V3}                                    matmul (transpose_a/b, adj_x/y -> transpose)
    Einsum / Cast / ArgMax / Equal                                einsum / cast / argmax / equal
    Conv2D                                                        conv2d (layout NHWC or NCHW, weight HWIO, groups)
    DepthwiseConv2dNative                                         reshape of the filter, conv2d (groups = C)
    (Stateful)PartitionedCall of one Conv2D (Keras Conv2D(groups)) conv2d (groups); other calls refused
    MaxPool AvgPool                                               max_pool2d avg_pool2d
    FusedBatchNorm{,V2,V3} training / inference                  batch_norm / its elementwise formula
    Conv2DBackpropInput (Keras Conv2DTranspose)                   conv_transpose2d (weight HWOI)
    ResizeBilinear ResizeNearestNeighbor (half-pixel centres)     resize2d (bilinear, nearest)
    Tile / Unpack / Split SplitV                                  tile / slice + reshape / slice
    Pad PadV2 (tf.pad constant, Keras ZeroPadding2D)              pad
    MirrorPad (tf.pad REFLECT, SYMMETRIC)                         pad (mode reflect, symmetric)
    language ops (masks, position buckets, gathers):
    Select SelectV2                                               where (Select's vector condition picks rows)
    Less LessEqual Greater GreaterEqual NotEqual                  less ... not_equal (bool)
    LogicalAnd LogicalOr LogicalNot                               logical_and logical_or logical_not
    Minimum Abs Log1p Floor                                       minimum abs log1p floor
    FloorDiv (ints / floats)                                      floor_div / floor(div)
    FloorMod TruncateDiv TruncateMod (ints)                       floor_div, mul, sub (+ a select by signs)
    Cumsum / GatherV2 / OneHot (axis -1)                          cumsum / gather (axis, batch_dims) / one_hot
    BroadcastTo (a static shape)                                  broadcast_to
    MatrixBandPart (of a computed matrix)                         where(constant band, x, 0)

Keras BatchNormalization at inference (fixed statistics) stays elementwise on purpose:
the IR's batch_norm takes its statistics from the runtime's training flag. Patterns of
several TF ops (Keras layers written out in ops) are device/capture/tf/patterns.py's;
an op type in neither table becomes an unsupported node for validation to report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np
import tensorflow as tf

from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import f32, ir_dtype, read_handle, static_shape

if TYPE_CHECKING:
    from device.capture.tf.lowering import Lowering

OpMapping = Callable[["Lowering", tf.Tensor], Plan]

# tf.stop_gradient: the IR has no stop-gradient op, so it is an identity marked with this
# attribute; the runtime must not pass a gradient through a node that has it.
STOP_GRADIENT_ATTR = "stop_gradient"


def _simple(ir_op: str) -> OpMapping:
    """One TF op -> the IR op ``ir_op`` on the same inputs."""
    def plan(low: Lowering, tensor: tf.Tensor) -> Plan:
        op = tensor.op
        return Plan(list(op.inputs), lambda: low.emit(ir_op, [low.value(t) for t in op.inputs], op, [tensor]))
    return plan


def _map_stop_gradient(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor], {STOP_GRADIENT_ATTR: True}))


def _map_div(low: Lowering, tensor):
    if not tensor.dtype.is_floating:
        raise CannotMap("integer division")
    return _simple("div")(low, tensor)


def _map_div_no_nan(low: Lowering, tensor):
    denominator = low.const(tensor.op.inputs[1])
    if denominator is None or np.any(denominator == 0):
        raise CannotMap("the denominator is not a nonzero constant")
    return _simple("div")(low, tensor)


def _map_add_n(low: Lowering, tensor):
    op = tensor.op
    terms = list(op.inputs)

    def build():
        acc = low.value(terms[0])
        for t in terms[1:-1]:
            acc = low.aux("add", [acc, low.value(t)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        if len(terms) == 1:
            low.emit("identity", [acc], op, [tensor])
        else:
            low.emit("add", [acc, low.value(terms[-1])], op, [tensor])
    return Plan(terms, build)


def _map_bias_add(low: Lowering, tensor):
    op = tensor.op
    x, bias = op.inputs

    def build():
        b = low.value(bias)
        if op.get_attr("data_format") == b"NCHW" and x.shape.rank > 2:
            # bias (C,) -> (C, 1, ..., 1) so that it broadcasts over N C H W
            shape = [bias.shape[0]] + [1] * (x.shape.rank - 2)
            b = low.aux("reshape", [b], op, shape, ir_dtype(bias.dtype), {"shape": shape})
        low.emit("add", [low.value(x), b], op, [tensor])
    return Plan([x, bias], build)


def _map_elu(low: Lowering, tensor):
    op = tensor.op
    return Plan([op.inputs[0]], lambda: low.emit("elu", [low.value(op.inputs[0])], op, [tensor], {"alpha": 1.0}))


def _map_relu6(low: Lowering, tensor):
    """Relu6 (Keras ReLU(6.0), MobileNet's activation): clamp to [0, 6], no gradient on the bounds (Relu6Grad)."""
    op = tensor.op
    x = op.inputs[0]
    attrs = {"min": 0.0, "max": 6.0}
    return Plan([x], lambda: low.emit("clamp", [low.value(x)], op, [tensor], attrs))


def _map_identity_n(low: Lowering, tensor):
    """IdentityN (what tf.custom_gradient wraps a forward in, e.g. Keras' swish): each output is its input.
    The custom gradient is not taken: the IR differentiates the forward ops, the same function."""
    op = tensor.op
    x = op.inputs[tensor.value_index]
    return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor]))


def _map_leaky_relu(low: Lowering, tensor):
    op = tensor.op
    alpha = f32(op.get_attr("alpha"))
    if not 0.0 <= alpha <= 1.0:
        raise CannotMap("alpha outside [0, 1]")
    x = op.inputs[0]

    def build():
        # leaky_relu(x) = max(x, alpha * x) for 0 <= alpha <= 1
        a = low.constant(op, "alpha", np.asarray(alpha, dtype=x.dtype.as_numpy_dtype))
        scaled = low.aux("mul", [low.value(x), a], op, static_shape(x), ir_dtype(x.dtype))
        low.emit("maximum", [low.value(x), scaled], op, [tensor])
    return Plan([x], build)


def _map_squared_difference(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs

    def build():
        diff = low.aux("sub", [low.value(a), low.value(b)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        low.emit("square", [diff], op, [tensor])
    return Plan([a, b], build)


def _map_pow(low: Lowering, tensor):
    op = tensor.op
    exponent = low.scalar(op.inputs[1])
    ir_op = {1.0: "identity", 2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}.get(exponent)
    if ir_op is None:
        raise CannotMap("the exponent is not a constant 1, 2, 0.5 or -0.5")
    x = op.inputs[0]
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor]))


def _map_softmax(low: Lowering, tensor):
    op = tensor.op
    ir_op = "softmax" if op.type == "Softmax" else "log_softmax"
    axis = tensor.shape.rank - 1
    return Plan([op.inputs[0]], lambda: low.emit(ir_op, [low.value(op.inputs[0])], op, [tensor], {"axis": axis}))


def _map_sparse_xent(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("the backprop output is not part of a forward pass")
    logits, labels = op.inputs
    return Plan([logits, labels], lambda: low.emit("sparse_softmax_cross_entropy",
                                                      [low.value(logits), low.value(labels)], op, [tensor]))


def _map_xent(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("the backprop output is not part of a forward pass")
    logits, labels = op.inputs

    def build():
        # loss = -sum(labels * log_softmax(logits), -1): (N, C) -> (N,)
        dtype = ir_dtype(logits.dtype)
        log_p = low.aux("log_softmax", [low.value(logits)], op, static_shape(logits), dtype, {"axis": 1})
        weighted = low.aux("mul", [low.value(labels), log_p], op, static_shape(logits), dtype)
        total = low.aux("reduce_sum", [weighted], op, static_shape(tensor), dtype, {"axes": [1], "keepdims": False})
        low.emit("neg", [total], op, [tensor])
    return Plan([logits, labels], build)


def _map_reduce(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    rank = x.shape.rank
    axes = sorted({int(a) % rank for a in np.atleast_1d(low.attr(op.inputs[1], "the reduction axis"))})
    keepdims = bool(op.get_attr("keep_dims"))
    ir_op = {"Mean": "reduce_mean", "Sum": "reduce_sum", "Max": "reduce_max"}[op.type]
    if not axes:  # TF reduces over nothing: the value itself
        return Plan([x], lambda: low.emit("identity", [low.value(x)], op, [tensor]))
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor], {"axes": axes, "keepdims": keepdims}))


def _map_reshape(low: Lowering, tensor):
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


def _map_transpose(low: Lowering, tensor):
    op = tensor.op
    perm = [int(p) for p in low.attr(op.inputs[1], "the permutation")]
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("transpose", [low.value(x)], op, [tensor], {"perm": perm}))


def _map_concat(low: Lowering, tensor):
    op = tensor.op
    operands = list(op.inputs[:-1])
    axis = int(low.attr(op.inputs[-1], "the concat axis")) % tensor.shape.rank
    return Plan(operands, lambda: low.emit("concat", [low.value(t) for t in operands], op, [tensor],
                                              {"axis": axis}))


def _map_strided_slice(low: Lowering, tensor):
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


def _transposed(low: Lowering, value: str, tensor: tf.Tensor, op: tf.Operation) -> str:
    """``value`` with its last two axes swapped."""
    shape = list(static_shape(tensor))
    perm = list(range(len(shape)))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return low.aux("transpose", [value], op, [shape[p] for p in perm], ir_dtype(tensor.dtype), {"perm": perm})


def _map_matmul(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs
    keys = ("transpose_a", "transpose_b") if op.type == "MatMul" else ("adj_x", "adj_y")
    swap_a, swap_b = (bool(op.get_attr(k)) for k in keys)

    def build():
        va, vb = low.value(a), low.value(b)
        if swap_a:
            va = _transposed(low, va, a, op)
        if swap_b:
            vb = _transposed(low, vb, b, op)
        low.emit("matmul", [va, vb], op, [tensor])
    return Plan([a, b], build)


def _map_einsum(low: Lowering, tensor):
    op = tensor.op
    equation = op.get_attr("equation").decode()
    operands = list(op.inputs)
    return Plan(operands, lambda: low.emit("einsum", [low.value(t) for t in operands], op, [tensor],
                                              {"equation": equation}))


def _map_cast(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    return Plan([x], lambda: low.emit("cast", [low.value(x)], op, [tensor], {"dtype": ir_dtype(tensor.dtype)}))


def _map_argmax(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    axis = int(low.attr(op.inputs[1], "the argmax axis")) % x.shape.rank
    return Plan([x], lambda: low.emit("argmax", [low.value(x)], op, [tensor], {"axis": axis}))


def _spatial(values, layout: str) -> list[int]:
    """The H and W entries of a 4-element strides/ksize/dilations attribute."""
    values = list(values)
    return [int(v) for v in (values[1:3] if layout == "NHWC" else values[2:4])]


def _padding(op, layout: str):
    """"SAME", "VALID", or EXPLICIT's [[top, bottom], [left, right]] (Conv2D, MaxPool)."""
    padding = op.get_attr("padding").decode()
    if padding != "EXPLICIT":
        return padding
    pads = list(op.get_attr("explicit_paddings"))
    pairs = [pads[i:i + 2] for i in range(0, 8, 2)]
    return [[int(v) for v in p] for p in (pairs[1:3] if layout == "NHWC" else pairs[2:4])]


def _conv2d_attrs(strides, padding, dilations, layout: str, x_shape, filter_shape) -> dict:
    """conv2d's attributes from a TF Conv2D's; grouped where the filter (kh, kw, C / g, O) sees fewer
    channels than the input has (Keras Conv2D(groups=g))."""
    attrs = {"strides": _spatial(strides, layout), "padding": padding, "dilations": _spatial(dilations, layout),
             "layout": layout, "weight_layout": "HWIO"}
    channels, group_channels = x_shape[3 if layout == "NHWC" else 1], filter_shape[2]
    if channels and group_channels and channels != group_channels:
        attrs["groups"] = channels // group_channels
    return attrs


def _map_conv2d(low: Lowering, tensor):
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    x, w = op.inputs
    attrs = _conv2d_attrs(op.get_attr("strides"), _padding(op, layout), op.get_attr("dilations"), layout,
                          static_shape(x), static_shape(w))
    return Plan([x, w], lambda: low.emit("conv2d", [low.value(x), low.value(w)], op, [tensor], attrs))


def _map_depthwise_conv2d(low: Lowering, tensor):
    """DepthwiseConv2dNative (Keras DepthwiseConv2D, SeparableConv2D's first half): a grouped conv2d with one
    group per input channel; the filter (kh, kw, C, M) read as HWIO (kh, kw, 1, C * M), output channel c * M + m."""
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    x, w = op.inputs
    kh, kw, channels, multiplier = static_shape(w)
    attrs = {"strides": _spatial(op.get_attr("strides"), layout), "padding": _padding(op, layout),
             "dilations": _spatial(op.get_attr("dilations"), layout), "layout": layout,
             "weight_layout": "HWIO", "groups": channels}
    grouped = [kh, kw, 1, channels * multiplier]

    def build():
        filters = low.aux("reshape", [low.value(w)], op, grouped, ir_dtype(w.dtype), {"shape": grouped})
        low.emit("conv2d", [low.value(x), filters], op, [tensor], attrs)
    return Plan([x, w], build)


def _map_pool(low: Lowering, tensor):
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    attrs = {"kernel": _spatial(op.get_attr("ksize"), layout),
             "strides": _spatial(op.get_attr("strides"), layout),
             "padding": _padding(op, layout), "layout": layout}  # AvgPool has no EXPLICIT
    ir_op = "max_pool2d" if op.type == "MaxPool" else "avg_pool2d"
    x = op.inputs[0]
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor], attrs))


def _map_fused_batch_norm(low: Lowering, tensor):
    op = tensor.op
    if tensor.value_index != 0:
        raise CannotMap("only the normalised output of a fused batch norm is lowered")
    x, gamma, beta, mean, variance = op.inputs[:5]
    eps = f32(op.get_attr("epsilon"))
    axis = 3 if op.get_attr("data_format").decode() == "NHWC" else 1
    if op.get_attr("is_training"):
        # running stats: the variables read into mean/variance, updated by
        # exponential_avg_factor f: new = (1 - f) * old + f * batch
        stats = [read_handle(t) for t in (mean, variance)]
        if any(s is None for s in stats):
            raise CannotMap("the running mean and variance are not variables")
        factor = float(op.get_attr("exponential_avg_factor")) if "exponential_avg_factor" in op.node_def.attr \
            else 1.0
        # the IR's momentum is torch's: new = (1 - m) * old + m * batch, so m = f
        attrs = {"axis": axis, "eps": eps, "momentum": f32(factor)}

        def build():
            low.emit("batch_norm", [low.value(x), low.value(gamma), low.value(beta),
                                      low.variable(stats[0]), low.variable(stats[1])], op, [tensor], attrs)
        return Plan([x, gamma, beta], build)

    def build_inference():
        _normalize_inference(low, op, tensor, x, gamma, beta, mean, variance, eps, axis)
    return Plan([x, gamma, beta, mean, variance], build_inference)


def _normalize_inference(low: Lowering, op, tensor, x, gamma, beta, mean, variance, eps, axis):
    """y = x * inv + (beta - mean * inv), inv = gamma * rsqrt(var + eps), with fixed stats."""
    dtype = ir_dtype(x.dtype)
    rank = x.shape.rank
    channel_shape = [1] * rank
    channel_shape[axis] = x.shape[axis]

    def per_channel(value: str) -> str:  # (C,) -> broadcastable against x
        if axis == rank - 1:
            return value
        return low.aux("reshape", [value], op, channel_shape, dtype, {"shape": channel_shape})

    c = [x.shape[axis]]
    e = low.constant(op, "epsilon", np.asarray(eps, dtype=x.dtype.as_numpy_dtype))
    var_eps = low.aux("add", [low.value(variance), e], op, c, dtype)
    inv = low.aux("mul", [low.aux("rsqrt", [var_eps], op, c, dtype), low.value(gamma)], op, c, dtype)
    shift = low.aux("sub", [low.value(beta), low.aux("mul", [low.value(mean), inv], op, c, dtype)], op, c, dtype)
    scaled = low.aux("mul", [low.value(x), per_channel(inv)], op, static_shape(x), dtype)
    low.emit("add", [scaled, per_channel(shift)], op, [tensor])


# ---- vision and losses ----


def _map_conv2d_backprop_input(low: Lowering, tensor):
    """Keras Conv2DTranspose, tf.nn.conv2d_transpose: the input gradient of a Conv2D, as a layer."""
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    padding = op.get_attr("padding").decode()
    if padding == "EXPLICIT":
        pads = list(op.get_attr("explicit_paddings"))
        pairs = [pads[i:i + 2] for i in range(0, 8, 2)]
        padding = [[int(v) for v in p] for p in (pairs[1:3] if layout == "NHWC" else pairs[2:4])]
    shape = static_shape(tensor)
    output_size = list(shape[1:3] if layout == "NHWC" else shape[2:4])
    if None in output_size:
        raise CannotMap("the output's height and width are not static")
    _, w, x = op.inputs  # input_sizes, filter (kh, kw, C_out, C_in), the gradient it maps back
    attrs = {"output_size": output_size,
             "strides": _spatial(op.get_attr("strides"), layout), "padding": padding,
             "dilations": _spatial(op.get_attr("dilations"), layout), "layout": layout, "weight_layout": "HWOI"}
    return Plan([x, w], lambda: low.emit("conv_transpose2d", [low.value(x), low.value(w)], op, [tensor], attrs))


def _map_resize(low: Lowering, tensor):
    """ResizeBilinear / ResizeNearestNeighbor with half-pixel centres (tf.image.resize, Keras UpSampling2D)."""
    op = tensor.op
    if op.get_attr("align_corners"):
        raise CannotMap("align_corners=True (only False)")
    if not op.get_attr("half_pixel_centers"):
        raise CannotMap("half_pixel_centers=False (only True, tf.image.resize's)")
    x = op.inputs[0]
    (_, h, w, _), (_, out_h, out_w, _) = static_shape(x), static_shape(tensor)
    if None in (h, w, out_h, out_w):
        raise CannotMap("the image sizes are not static")
    method = "bilinear" if op.type == "ResizeBilinear" else "nearest"
    if method == "nearest" and (out_h % h or out_w % w):
        raise CannotMap(f"nearest resizing from {h}x{w} to {out_h}x{out_w} (only by whole-number factors)")
    attrs = {"size": [out_h, out_w], "method": method, "layout": "NHWC"}
    return Plan([x], lambda: low.emit("resize2d", [low.value(x)], op, [tensor], attrs))


def _map_tile(low: Lowering, tensor):
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


def _map_unpack(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    axis = op.get_attr("axis") % x.shape.rank
    return _part(low, tensor, x, axis, tensor.value_index, 1, drop_axis=True)


def _map_split(low: Lowering, tensor):
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


def _map_pad(low: Lowering, tensor):
    """Pad / PadV2 (tf.pad mode CONSTANT, Keras ZeroPadding2D), MirrorPad (tf.pad REFLECT, SYMMETRIC)."""
    op = tensor.op
    x = op.inputs[0]
    pads = [[int(a), int(b)] for a, b in low.attr(op.inputs[1], "the paddings")]
    if op.type == "MirrorPad":
        attrs = {"pads": pads, "mode": op.get_attr("mode").decode().lower()}  # reflect or symmetric
        return Plan([x], lambda: low.emit("pad", [low.value(x)], op, [tensor], attrs))
    value = low.scalar(op.inputs[2]) if op.type == "PadV2" else 0.0
    if value is None:
        raise CannotMap("constant_values is not a constant")
    return Plan([x], lambda: low.emit("pad", [low.value(x)], op, [tensor], {"pads": pads, "value": float(value)}))


def _function_def(op: tf.Operation):
    """The FunctionDef that a PartitionedCall / StatefulPartitionedCall runs."""
    name = op.get_attr("f").name
    function = op.graph._get_function(name)  # the graph's library, without serialising the whole graph
    if function is not None and hasattr(function, "definition"):
        return function.definition
    return next(f for f in op.graph.as_graph_def().library.function if f.signature.name == name)


def _map_call(low: Lowering, tensor):
    """A function call whose body is one Conv2D on its arguments: Keras 3 builds Conv2D(groups=g) so (an
    XLA-compiled function, TF's CPU kernels having no grouped convolution), the filter (kh, kw, C / g, O)
    read through a resource argument. Lowered as that Conv2D, grouped; any other call is refused (the
    capture does not enter function bodies)."""
    op = tensor.op
    fdef = _function_def(op)
    nodes = {n.name: n for n in fdef.node_def}
    args = {a.name: i for i, a in enumerate(fdef.signature.input_arg)}

    def node_of(ref: str):  # "name:output:0" or an argument's name -> its NodeDef (None: an argument)
        return nodes.get(ref.split(":")[0])

    refused = CannotMap(f"a call of the function {fdef.signature.name}: the TF capture enters only a function "
                        "that is one Conv2D (Keras Conv2D(groups=g)); write the layer without a tf.function")
    conv = node_of(fdef.ret[fdef.signature.output_arg[tensor.value_index].name])
    while conv is not None and conv.op == "Identity":
        conv = node_of(conv.input[0])
    if conv is None or conv.op != "Conv2D" or conv.attr["padding"].s == b"EXPLICIT":
        raise refused
    x_ref, w_ref = conv.input[:2]
    read = node_of(w_ref)
    if x_ref not in args or read is None or read.op != "ReadVariableOp" or read.input[0] not in args:
        raise refused
    x, resource = op.inputs[args[x_ref]], op.inputs[args[read.input[0]]]
    if resource.op.type != "VarHandleOp":
        raise refused
    layout = conv.attr["data_format"].s.decode()
    attrs = _conv2d_attrs(conv.attr["strides"].list.i, conv.attr["padding"].s.decode(), conv.attr["dilations"].list.i,
                          layout, static_shape(x), tf.TensorShape(resource.op.get_attr("shape")).as_list())
    return Plan([x, resource], lambda: low.emit("conv2d", [low.value(x), low.value(resource)], op, [tensor], attrs))


# TF op types that are one IR op on the same inputs
_ONE_TO_ONE = {
    "AddV2": "add", "Add": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div", "Maximum": "maximum",
    "Neg": "neg", "Exp": "exp", "Erf": "erf", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Square": "square",
    "Identity": "identity", "Snapshot": "identity", "Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid",
    "Selu": "selu", "Softplus": "softplus", "Equal": "equal",
}

# TF op type -> its mapping
MAPPINGS: dict[str, OpMapping] = {
    **{tf_op: _simple(ir_op) for tf_op, ir_op in _ONE_TO_ONE.items()},
    "StopGradient": _map_stop_gradient, "PreventGradient": _map_stop_gradient,
    "Div": _map_div, "DivNoNan": _map_div_no_nan, "AddN": _map_add_n,
    "BiasAdd": _map_bias_add, "Elu": _map_elu, "LeakyRelu": _map_leaky_relu, "Relu6": _map_relu6,
    "IdentityN": _map_identity_n,
    "SquaredDifference": _map_squared_difference, "Pow": _map_pow,
    "Softmax": _map_softmax, "LogSoftmax": _map_softmax,
    "SparseSoftmaxCrossEntropyWithLogits": _map_sparse_xent,
    "SoftmaxCrossEntropyWithLogits": _map_xent,
    "Mean": _map_reduce, "Sum": _map_reduce, "Max": _map_reduce,
    "Reshape": _map_reshape, "Squeeze": _map_reshape, "ExpandDims": _map_reshape,
    "Transpose": _map_transpose, "ConcatV2": _map_concat, "StridedSlice": _map_strided_slice,
    "MatMul": _map_matmul, "BatchMatMul": _map_matmul, "BatchMatMulV2": _map_matmul,
    "BatchMatMulV3": _map_matmul, "Einsum": _map_einsum, "Cast": _map_cast,
    "ArgMax": _map_argmax, "Conv2D": _map_conv2d, "DepthwiseConv2dNative": _map_depthwise_conv2d,
    "MaxPool": _map_pool,
    "AvgPool": _map_pool, "FusedBatchNorm": _map_fused_batch_norm,
    "FusedBatchNormV2": _map_fused_batch_norm, "FusedBatchNormV3": _map_fused_batch_norm,
    # vision and losses
    "Conv2DBackpropInput": _map_conv2d_backprop_input, "ResizeBilinear": _map_resize,
    "ResizeNearestNeighbor": _map_resize, "Tile": _map_tile, "Unpack": _map_unpack, "Split": _map_split,
    "SplitV": _map_split, "Pad": _map_pad, "PadV2": _map_pad, "MirrorPad": _map_pad,
    "PartitionedCall": _map_call, "StatefulPartitionedCall": _map_call,  # Keras Conv2D(groups=g)
}


# ---- language ops: masks, position buckets, gathers ----

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


def _map_select(low: Lowering, tensor):
    op = tensor.op
    condition, a, b = op.inputs

    def build():
        cond = low.value(condition)
        rank = len(static_shape(tensor))
        if op.type == "Select" and condition.shape.rank == 1 and rank > 1:  # v1 where: a vector picks rows
            shape = [condition.shape[0]] + [1] * (rank - 1)
            cond = low.aux("reshape", [cond], op, shape, "bool", {"shape": shape})
        low.emit("where", [cond, low.value(a), low.value(b)], op, [tensor])
    return Plan([condition, a, b], build)


def _map_floor_div(low: Lowering, tensor):
    op = tensor.op
    a, b = op.inputs
    if not tensor.dtype.is_floating:
        return _simple("floor_div")(low, tensor)

    def build():  # floats: floor(a / b)
        q = low.aux("div", [low.value(a), low.value(b)], op, static_shape(tensor), ir_dtype(tensor.dtype))
        low.emit("floor", [q], op, [tensor])
    return Plan([a, b], build)


def _map_cumsum(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    attrs = {"axis": int(low.attr(op.inputs[1], "the cumsum axis")) % x.shape.rank,
             "exclusive": bool(op.get_attr("exclusive")), "reverse": bool(op.get_attr("reverse"))}
    return Plan([x], lambda: low.emit("cumsum", [low.value(x)], op, [tensor], attrs))


def _map_reverse(low: Lowering, tensor):
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


def _map_gather(low: Lowering, tensor):
    op = tensor.op
    params, indices = op.inputs[:2]
    rank = params.shape.rank
    axis = int(low.attr(op.inputs[2], "the gather axis"))
    batch_dims = int(op.get_attr("batch_dims"))
    if batch_dims < 0:
        batch_dims += indices.shape.rank
    attrs = {"axis": axis % rank, "batch_dims": batch_dims}
    return Plan([params, indices], lambda: low.emit("gather", [low.value(params), low.value(indices)], op, [tensor],
                                                    attrs))


def _map_one_hot(low: Lowering, tensor):
    op = tensor.op
    indices = op.inputs[0]
    if op.get_attr("axis") not in (-1, indices.shape.rank):
        raise CannotMap(f"axis={op.get_attr('axis')} (only the last axis)")
    depth = int(low.attr(op.inputs[1], "the one-hot depth"))
    on, off = (low.scalar(t) for t in op.inputs[2:4])
    if on is None or off is None:
        raise CannotMap("on_value and off_value are not constants")
    attrs = {"depth": depth, "dtype": ir_dtype(tensor.dtype), "on_value": on, "off_value": off}
    return Plan([indices], lambda: low.emit("one_hot", [low.value(indices)], op, [tensor], attrs))


def _map_broadcast_to(low: Lowering, tensor):
    op = tensor.op
    x = op.inputs[0]
    if not tensor.shape.is_fully_defined():
        raise CannotMap("the target shape is not static")
    shape = tensor.shape.as_list()
    return Plan([x], lambda: low.emit("broadcast_to", [low.value(x)], op, [tensor], {"shape": shape}))


def _map_band_part(low: Lowering, tensor):
    """tf.linalg.band_part(x, lower, upper) of a computed x: where(band, x, 0) with the band a constant."""
    op = tensor.op
    x = op.inputs[0]
    lower, upper = (int(low.attr(t, "the band's width")) for t in op.inputs[1:3])
    rows, cols = x.shape.as_list()[-2:]
    if rows is None or cols is None:
        raise CannotMap("the matrix size is not static")
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    band = ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))

    def build():
        zero = low.constant(op, "zero", np.zeros((), dtype=x.dtype.as_numpy_dtype))
        low.emit("where", [low.constant(op, "band", band), low.value(x), zero], op, [tensor])
    return Plan([x], build)


_LANGUAGE_ONE_TO_ONE = {
    "Less": "less", "LessEqual": "less_equal", "Greater": "greater", "GreaterEqual": "greater_equal",
    "NotEqual": "not_equal", "LogicalAnd": "logical_and", "LogicalOr": "logical_or", "LogicalNot": "logical_not",
    "Minimum": "minimum", "Abs": "abs", "Log1p": "log1p", "Floor": "floor",
}

MAPPINGS.update({
    **{tf_op: _simple(ir_op) for tf_op, ir_op in _LANGUAGE_ONE_TO_ONE.items()},
    "Select": _map_select, "SelectV2": _map_select, "FloorDiv": _map_floor_div, "Cumsum": _map_cumsum,
    "GatherV2": _map_gather, "OneHot": _map_one_hot, "BroadcastTo": _map_broadcast_to, "ReverseV2": _map_reverse,
    "MatrixBandPart": _map_band_part,
})


# ---- integer arithmetic: remainders and truncating division, exact on int32 / int64 ----

def _integer_division(result: str) -> OpMapping:
    """FloorMod, TruncateDiv, TruncateMod of integers, from floor_div (numpy's //), never a float:
    q = a // b and r = a - q * b (r has b's sign: FloorMod); where r != 0 and r's sign is not a's,
    the truncated quotient is q + 1 and the truncated remainder r - b. Floats are refused (a float
    remainder through floor(a / b) is not TF's exact fmod)."""
    def plan(low: Lowering, tensor):
        op = tensor.op
        a, b = op.inputs
        if not tensor.dtype.is_integer:
            raise CannotMap(f"{op.type} of {tensor.dtype.name} values (integers only: exact there)")
        shape, dtype = static_shape(tensor), ir_dtype(tensor.dtype)

        def build():
            x, y = low.value(a), low.value(b)
            q = low.aux("floor_div", [x, y], op, shape, dtype)
            qy = low.aux("mul", [q, y], op, shape, dtype)
            if result == "floor_mod":
                low.emit("sub", [x, qy], op, [tensor])
                return
            r = low.aux("sub", [x, qy], op, shape, dtype)
            zero = low.constant(op, "zero", np.zeros((), dtype=tensor.dtype.as_numpy_dtype))
            signs_differ = low.aux("not_equal", [low.aux("less", [r, zero], op, shape, "bool"),
                                                 low.aux("less", [x, zero], op, static_shape(a), "bool")],
                                   op, shape, "bool")
            off = low.aux("logical_and", [low.aux("not_equal", [r, zero], op, shape, "bool"), signs_differ], op,
                          shape, "bool")
            if result == "truncate_div":
                one = low.constant(op, "one", np.ones((), dtype=tensor.dtype.as_numpy_dtype))
                low.emit("add", [q, low.aux("where", [off, one, zero], op, shape, dtype)], op, [tensor])
            else:
                low.emit("sub", [r, low.aux("where", [off, y, zero], op, shape, dtype)], op, [tensor])
        return Plan([a, b], build)
    return plan


MAPPINGS.update({
    "FloorMod": _integer_division("floor_mod"), "TruncateDiv": _integer_division("truncate_div"),
    "TruncateMod": _integer_division("truncate_mod"),
})
