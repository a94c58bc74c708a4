"""Mappings of vision ops: Conv2D (grouped too, also through Keras' function call),
DepthwiseConv2dNative, MaxPool AvgPool, Conv2DBackpropInput, ResizeBilinear ResizeNearestNeighbor.

Each mapping takes the lowering and one TF tensor (an output of the op) and answers its Plan;
CannotMap for a variant the device does not take (the tensor then becomes an unsupported node,
which validation reports). table.py maps the TF op types onto them.
"""

from __future__ import annotations

import tensorflow as tf

from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan
from device.capture.tf.tensors import ir_dtype, static_shape


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


def map_conv2d(low: Lowering, tensor):
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    x, w = op.inputs
    attrs = _conv2d_attrs(op.get_attr("strides"), _padding(op, layout), op.get_attr("dilations"), layout,
                          static_shape(x), static_shape(w))
    return Plan([x, w], lambda: low.emit("conv2d", [low.value(x), low.value(w)], op, [tensor], attrs))


def map_depthwise_conv2d(low: Lowering, tensor):
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


def map_pool(low: Lowering, tensor):
    op = tensor.op
    layout = op.get_attr("data_format").decode()
    attrs = {"kernel": _spatial(op.get_attr("ksize"), layout),
             "strides": _spatial(op.get_attr("strides"), layout),
             "padding": _padding(op, layout), "layout": layout}  # AvgPool has no EXPLICIT
    ir_op = "max_pool2d" if op.type == "MaxPool" else "avg_pool2d"
    x = op.inputs[0]
    return Plan([x], lambda: low.emit(ir_op, [low.value(x)], op, [tensor], attrs))


def map_conv2d_backprop_input(low: Lowering, tensor):
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


def map_resize(low: Lowering, tensor):
    """ResizeBilinear / ResizeNearestNeighbor with half-pixel centres (tf.image.resize, Keras UpSampling2D)."""
    op = tensor.op
    if op.get_attr("align_corners"):
        raise CannotMap("align_corners=True (only False)", form="corners")
    if not op.get_attr("half_pixel_centers"):
        raise CannotMap("half_pixel_centers=False (only True, tf.image.resize's)", form="corners")
    x = op.inputs[0]
    (_, h, w, _), (_, out_h, out_w, _) = static_shape(x), static_shape(tensor)
    if None in (h, w, out_h, out_w):
        raise CannotMap("the image sizes are not static")
    method = "bilinear" if op.type == "ResizeBilinear" else "nearest"
    if method == "nearest" and (out_h % h or out_w % w):
        raise CannotMap(f"nearest resizing from {h}x{w} to {out_h}x{out_w} (only by whole-number factors)",
                        form="factor")
    attrs = {"size": [out_h, out_w], "method": method, "layout": "NHWC"}
    return Plan([x], lambda: low.emit("resize2d", [low.value(x)], op, [tensor], attrs))


def _function_def(op: tf.Operation):
    """The FunctionDef that a PartitionedCall / StatefulPartitionedCall runs."""
    name = op.get_attr("f").name
    function = op.graph._get_function(name)  # the graph's library, without serialising the whole graph
    if function is not None and hasattr(function, "definition"):
        return function.definition
    return next(f for f in op.graph.as_graph_def().library.function if f.signature.name == name)


def map_call(low: Lowering, tensor):
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
