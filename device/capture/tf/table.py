"""The TF op type -> mapping table: every TF op the frontend lowers on its own, in one literal.

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
    Slice (tf.slice; size -1, or the static size) / Pack (tf.stack) slice / reshape + concat
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
    ReverseV2 (tf.reverse, Keras' go_backwards)                   slice (step -1 on the reversed axes)
    MatrixBandPart (of a computed matrix)                         where(constant band, x, 0)

A new op is one entry here and its mapping in the module of its family (the families of
device/ops/): elementwise.py, activations.py, linalg.py, layout.py, reductions.py,
normalization.py, vision.py, language.py, losses.py. Patterns of several TF ops (Keras layers
written out in ops) are patterns.py's, loops and TensorLists loops.py's; an op type in none of
them becomes an unsupported node that validation reports at the user's line, with the
suggestion device/capture/refused_tf.py keeps for it (OPS; a form a mapping refuses: FORMS).
"""

from __future__ import annotations

from device.capture.tf.activations import map_elu, map_leaky_relu, map_relu6
from device.capture.tf.elementwise import (integer_division, map_add_n, map_bias_add, map_cast, map_div,
                                           map_div_no_nan, map_floor_div, map_identity_n, map_pow, map_select,
                                           map_squared_difference, map_stop_gradient, simple)
from device.capture.tf.language import map_band_part, map_gather, map_one_hot
from device.capture.tf.layout import (map_broadcast_to, map_concat, map_pack, map_pad, map_reshape, map_reverse,
                                      map_slice, map_split, map_strided_slice, map_tile, map_transpose, map_unpack)
from device.capture.tf.linalg import map_einsum, map_matmul
from device.capture.tf.losses import map_sparse_xent, map_xent
from device.capture.tf.lowering import OpMapping
from device.capture.tf.normalization import map_fused_batch_norm, map_softmax
from device.capture.tf.reductions import map_argmax, map_cumsum, map_reduce
from device.capture.tf.vision import (map_call, map_conv2d, map_conv2d_backprop_input, map_depthwise_conv2d,
                                      map_pool, map_resize)

MAPPINGS: dict[str, OpMapping] = {
    # one IR op on the same inputs
    "AddV2": simple("add"),
    "Add": simple("add"),
    "Sub": simple("sub"),
    "Mul": simple("mul"),
    "RealDiv": simple("div"),
    "Maximum": simple("maximum"),
    "Neg": simple("neg"),
    "Exp": simple("exp"),
    "Erf": simple("erf"),
    "Log": simple("log"),
    "Sqrt": simple("sqrt"),
    "Rsqrt": simple("rsqrt"),
    "Square": simple("square"),
    "Identity": simple("identity"),
    "Snapshot": simple("identity"),
    "Relu": simple("relu"),
    "Tanh": simple("tanh"),
    "Sigmoid": simple("sigmoid"),
    "Selu": simple("selu"),
    "Softplus": simple("softplus"),
    "Equal": simple("equal"),
    # elementwise and activations
    "StopGradient": map_stop_gradient,
    "PreventGradient": map_stop_gradient,
    "Div": map_div,  # floats only
    "DivNoNan": map_div_no_nan,  # a nonzero constant denominator
    "AddN": map_add_n,
    "BiasAdd": map_bias_add,
    "Elu": map_elu,
    "LeakyRelu": map_leaky_relu,
    "Relu6": map_relu6,
    "IdentityN": map_identity_n,  # tf.custom_gradient's forward
    "SquaredDifference": map_squared_difference,
    "Pow": map_pow,  # exponent 1, 2, 0.5 or -0.5
    # normalization and losses
    "Softmax": map_softmax,
    "LogSoftmax": map_softmax,
    "SparseSoftmaxCrossEntropyWithLogits": map_sparse_xent,
    "SoftmaxCrossEntropyWithLogits": map_xent,
    # reductions, layout, linear algebra
    "Mean": map_reduce,
    "Sum": map_reduce,
    "Max": map_reduce,
    "Reshape": map_reshape,
    "Squeeze": map_reshape,
    "ExpandDims": map_reshape,
    "Transpose": map_transpose,
    "ConcatV2": map_concat,
    "StridedSlice": map_strided_slice,
    "Slice": map_slice,
    "Pack": map_pack,
    "MatMul": map_matmul,
    "BatchMatMul": map_matmul,
    "BatchMatMulV2": map_matmul,
    "BatchMatMulV3": map_matmul,
    "Einsum": map_einsum,
    "Cast": map_cast,
    "ArgMax": map_argmax,
    # vision
    "Conv2D": map_conv2d,
    "DepthwiseConv2dNative": map_depthwise_conv2d,
    "MaxPool": map_pool,
    "AvgPool": map_pool,
    "FusedBatchNorm": map_fused_batch_norm,
    "FusedBatchNormV2": map_fused_batch_norm,
    "FusedBatchNormV3": map_fused_batch_norm,
    "Conv2DBackpropInput": map_conv2d_backprop_input,  # Keras Conv2DTranspose
    "ResizeBilinear": map_resize,
    "ResizeNearestNeighbor": map_resize,
    "Tile": map_tile,
    "Unpack": map_unpack,
    "Split": map_split,
    "SplitV": map_split,
    "Pad": map_pad,
    "PadV2": map_pad,
    "MirrorPad": map_pad,
    "PartitionedCall": map_call,  # Keras Conv2D(groups=g); any other call refused
    "StatefulPartitionedCall": map_call,
    # language ops: masks, position buckets, gathers
    "Less": simple("less"),
    "LessEqual": simple("less_equal"),
    "Greater": simple("greater"),
    "GreaterEqual": simple("greater_equal"),
    "NotEqual": simple("not_equal"),
    "LogicalAnd": simple("logical_and"),
    "LogicalOr": simple("logical_or"),
    "LogicalNot": simple("logical_not"),
    "Minimum": simple("minimum"),
    "Abs": simple("abs"),
    "Log1p": simple("log1p"),
    "Floor": simple("floor"),
    "Select": map_select,
    "SelectV2": map_select,
    "FloorDiv": map_floor_div,
    "Cumsum": map_cumsum,
    "GatherV2": map_gather,
    "OneHot": map_one_hot,
    "BroadcastTo": map_broadcast_to,
    "ReverseV2": map_reverse,
    "MatrixBandPart": map_band_part,
    # integer arithmetic: remainders and truncating division, exact on int32 / int64
    "FloorMod": integer_division("floor_mod"),
    "TruncateDiv": integer_division("truncate_div"),
    "TruncateMod": integer_division("truncate_mod"),
}
