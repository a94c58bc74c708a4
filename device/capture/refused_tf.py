"""The TF frontend's refusals: the TF op types it cannot lower, and what to use instead.

Three tables, keyed by what is refused:

    OPS     TF op type no rule of the frontend lowers (tf/table.py's MAPPINGS, tf/patterns.py's
            PATTERNS, tf/loops.py's LOOP_OPS) -> suggestion
    FORMS   (TF op type, form) -> suggestion, for an op type a rule lowers in other forms and
            refuses in this one (``CannotMap(reason, form=...)``, tf/plan.py)
    CALLS   TF op type -> the call a user writes, for the report (the torch frontend reads the
            call from the stack; a TF op records only its type)

The lowering attaches the suggestion to the unsupported node it records (the node's
``suggestion`` attribute), and validation reports it as it stands. The module imports no
framework, so that device.api (and the porting assistant through it) reads it without TF;
tests/device/test_refusal_tables.py keeps OPS out of the rules and FORMS within them.
"""

from __future__ import annotations

_DYNAMIC_SHAPES = "data-dependent output shape; the device needs static shapes"
_FFT_ON_HOST = ("complex numbers are not device data: compute the FFT in the input pipeline (a tf.data map) "
                "and feed real float32 features: the magnitude, or the real and imaginary parts as channels")
_HASH_ON_HOST = "strings are not device data: hash them in the input pipeline (tf.data map) and feed int ids"
_PY_FUNC = "Python code cannot run on the device: move it into the input pipeline or host_call"
_UNIQUE = f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline (tf.data)"
_SORT = "sort in the input pipeline, or tf.reduce_max / tf.argmax if only the extreme is needed"
_NO_SCAN = "a product along an axis: exp(cumsum(log(x))) for positive x, or compute it in the input pipeline"
_INT_BITS = ("bit operations on integers: compute them in the input pipeline; on bool masks use "
             "tf.logical_and / tf.logical_or / tf.logical_not")
_BRANCH = ("control flow on a tensor's value: the device runs one static graph; compute both branches and "
           "pick with tf.where(cond, a, b), or unroll a loop to a fixed count")
_SPARSE = "sparse tensors are not device data: use dense tensors (tf.sparse.to_dense in the input pipeline)"
_RAGGED = "ragged tensors are not device data: pad to a fixed length in the input pipeline and pass a mask"
_SCATTER = "an indexed write: build the result from a one-hot mask (tf.one_hot, mul, add, reduce)"
_LINALG = "linear algebra beyond matmul: compute it in the input pipeline, or on the host (host_call)"
_SAMPLE = "sampling in the model: draw the samples in the input pipeline and feed them as a batch tensor"
_STRINGS = "strings are not device data: turn them into int ids in the input pipeline (tf.data map)"
_SEGMENTS = (f"{_DYNAMIC_SHAPES}: tf.math.unsorted_segment_* with a fixed num_segments is a one_hot and a matmul; "
             "or compute it in the input pipeline")

# TF op types no rule of the frontend lowers -> what to use instead
OPS: dict[str, str] = {
    "Unique": _UNIQUE, "UniqueV2": _UNIQUE, "UniqueWithCounts": _UNIQUE,
    "Where": f"tf.where(cond) with one argument has a {_DYNAMIC_SHAPES}: use tf.where(cond, x, y) or a mask multiply",
    "Sort": _SORT, "ArgSort": _SORT,
    "TopKV2": "tf.argmax for top-1, or compute top-k in an eval metric through host_call",
    "StringToHashBucketFast": _HASH_ON_HOST,
    "StringToHashBucketStrong": _HASH_ON_HOST,
    "PyFunc": _PY_FUNC,
    "EagerPyFunc": _PY_FUNC,
    "Print": "remove tf.Print from the model; log from host_call or the runner's summaries",
    "PrintV2": "remove tf.print from the model; log from host_call or the runner's summaries",
    **{fft: _FFT_ON_HOST for fft in ("FFT", "IFFT", "RFFT", "IRFFT", "FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D",
                                     "FFT3D", "IFFT3D", "RFFT3D", "IRFFT3D", "Complex", "Real", "Imag",
                                     "ComplexAbs", "Angle", "Conj")},
    "ResizeBicubic": "tf.image.resize(method='bilinear'), or resize in the input pipeline",
    "Cumprod": _NO_SCAN,
    "Prod": "a product: tf.exp(tf.reduce_sum(tf.math.log(x))) for positive x, or compute it in the input pipeline",
    **{op: _INT_BITS for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "Invert", "LeftShift", "RightShift")},
    # TF1 control flow (tf.cond, and tf.while_loop outside a function); the While op of a function is loops.py's
    **{op: _BRANCH for op in ("If", "StatelessIf", "Switch", "Merge", "Enter", "Exit", "LoopCond", "NextIteration")},
    **{op: _SPARSE for op in ("SparseTensorDenseMatMul", "SparseReduceSum", "SparseReduceSumSparse",
                              "SparseToDense", "SparseAdd", "SparseSoftmax", "SparseReshape", "SparseTensorDenseAdd",
                              "SparseReorder", "SparseFillEmptyRows", "SparseSegmentSum", "SparseSegmentMean")},
    **{op: _RAGGED for op in ("RaggedTensorToTensor", "RaggedTensorFromVariant", "RaggedTensorToVariant",
                              "RaggedGather", "RaggedRange", "RaggedTensorToSparse", "RaggedCross")},
    **{op: _STRINGS for op in ("AsString", "StringJoin", "StringSplit", "StringSplitV2", "StringToNumber",
                               "Substr", "RegexReplace", "StringLength", "StringFormat", "StringLower",
                               "StringUpper", "StaticRegexReplace", "ReduceJoin")},
    **{op: _SCATTER for op in ("ScatterNd", "TensorScatterUpdate", "TensorScatterAdd", "TensorScatterMax",
                               "TensorScatterMin")},
    **{op: _SEGMENTS for op in ("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin", "SegmentProd")},
    "UnsortedSegmentSum": "tf.one_hot(segment_ids, num_segments) and tf.matmul",
    "UnsortedSegmentMax": "compute it in the input pipeline, or with a one_hot mask and reduce_max",
    "Bincount": f"{_DYNAMIC_SHAPES}: tf.reduce_sum(tf.one_hot(x, n), 0) with a fixed n",
    "DenseBincount": "tf.reduce_sum(tf.one_hot(x, n), 0) with a fixed n",
    "HistogramFixedWidth": "tf.one_hot of the bucket ids, summed",
    **{op: _LINALG for op in ("MatrixInverse", "MatrixDeterminant", "Svd", "MatrixSolve", "Qr", "Cholesky")},
    **{op: _SAMPLE for op in ("Multinomial", "RandomGamma", "RandomPoissonV2", "StatelessMultinomial")},
    "DynamicPartition": f"{_DYNAMIC_SHAPES}: multiply by a mask per partition instead",
    "DynamicStitch": "tf.where(cond, a, b) or a one-hot mask",
    "GatherNd": "tf.gather on one axis (with batch_dims), or a one-hot matmul",
}

_BILINEAR = "tf.image.resize(method='bilinear') or Keras UpSampling2D (half-pixel centres)"
_NEAREST = "Keras UpSampling2D, or tf.image.resize(method='nearest') by whole-number factors"
_STATIC_LOOP = ("a loop of a fixed count: a sequence of a fixed length, or a tf.while_loop that stops at a "
                "constant; for a branch on a value, compute both and pick with tf.where(cond, a, b)")

# (TF op type, the form a rule refuses) -> what to use instead; the op type runs in its other forms
FORMS: dict[tuple[str, str], str] = {
    ("MirrorPad", "paddings"): ("paddings fixed when the graph is built (Python ints or a constant), at most "
                                "size - 1 per side for REFLECT and size for SYMMETRIC"),
    ("ResizeBilinear", "corners"): _BILINEAR,
    ("ResizeNearestNeighbor", "corners"): _NEAREST,
    ("ResizeNearestNeighbor", "factor"): _NEAREST,
    ("While", "data-dependent"): _STATIC_LOOP,
    ("StatelessWhile", "data-dependent"): _STATIC_LOOP,
}

# TF op type -> the call a user writes there
CALLS: dict[str, str] = {
    "Cumprod": "tf.math.cumprod", "TopKV2": "tf.math.top_k / tf.sort / tf.argsort", "Prod": "tf.reduce_prod",
    "DepthwiseConv2dNative": "DepthwiseConv2D / tf.nn.depthwise_conv2d", "MirrorPad": "tf.pad(mode='REFLECT')",
    "BitwiseAnd": "tf.bitwise.bitwise_and", "BitwiseOr": "tf.bitwise.bitwise_or",
    "BitwiseXor": "tf.bitwise.bitwise_xor", "Invert": "tf.bitwise.invert", "LeftShift": "tf.bitwise.left_shift",
    "RightShift": "tf.bitwise.right_shift", "Unique": "tf.unique", "UniqueV2": "tf.unique",
    "UniqueWithCounts": "tf.unique_with_counts", "Where": "tf.where(cond) / tf.boolean_mask",
    "PyFunc": "tf.numpy_function", "EagerPyFunc": "tf.py_function", "If": "tf.cond", "StatelessIf": "tf.cond",
    "While": "tf.while_loop", "StatelessWhile": "tf.while_loop", "Switch": "tf.cond", "Merge": "tf.cond",
    "RFFT": "tf.signal.rfft", "FFT": "tf.signal.fft", "IRFFT": "tf.signal.irfft", "Complex": "tf.complex",
    "StringToHashBucketFast": "tf.strings.to_hash_bucket_fast", "AsString": "tf.strings.as_string",
    "SegmentSum": "tf.math.segment_sum", "UnsortedSegmentMax": "tf.math.unsorted_segment_max",
    "Bincount": "tf.math.bincount", "DenseBincount": "tf.math.bincount", "MatrixInverse": "tf.linalg.inv",
    "Multinomial": "tf.random.categorical", "ScatterNd": "tf.scatter_nd",
    "TensorScatterUpdate": "tf.tensor_scatter_nd_update", "PrintV2": "tf.print",
    "SparseReduceSum": "tf.sparse.reduce_sum", "SparseTensorDenseMatMul": "tf.sparse.sparse_dense_matmul",
    "RaggedTensorToTensor": "tf.RaggedTensor.to_tensor", "HistogramFixedWidth": "tf.histogram_fixed_width",
    "ResizeBicubic": "tf.image.resize(method='bicubic')",
    "Real": "tf.math.real", "Imag": "tf.math.imag", "ComplexAbs": "tf.abs of a complex tensor",
    "GatherNd": "tf.gather_nd",
}


def suggestion(op_type: str, form: str = "") -> str:
    """What to use instead of ``op_type`` (in its refused ``form``); "" where the frontend has none."""
    return FORMS.get((op_type, form), "") if form else OPS.get(op_type, "")
