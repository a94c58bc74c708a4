"""Validation: is this graph one the device can run? Reports every problem at once.

Runs in one pass over the nodes and values (no shape inference, no kernel matching), so
that ``--validate_only`` answers in well under a second. Each finding points at the
user's source line (the node's ``loc``) and, where there is one, says what to use
instead. Problems that propagate (a dynamic batch makes every later shape dynamic, a
float64 input makes every later value float64) are reported once, where they start.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from device.dtypes import DEVICE_DTYPES, FLOATS, HALF_PRECISIONS, INTEGERS, PRECISIONS
from device.ir import Graph, Node, SourceLoc
from device.ops import OPS, OpRecord

MODES = ("train", "eval", "eval_all", "predict", "train_and_eval")

DEFAULT_SUGGESTION = ("rewrite it with supported ops (device/ops/, the table in device/README.md), or move it "
                      "out of the model: into the input pipeline, or into host_call for eval metrics")
_DYNAMIC_SHAPES = "data-dependent output shape; the device needs static shapes"
_HASH_ON_HOST = "strings are not device data: hash them in the input pipeline (tf.data map) and feed int ids"
_FFT_ON_HOST = ("complex numbers are not device data: compute the FFT in the input pipeline (a tf.data map, "
                "or the PyTorch Dataset) and feed real float32 features: the magnitude, or the real and "
                "imaginary parts as channels")

# framework op -> what to use instead. Keys are the names the frontends record in
# SourceLoc.framework_op: torch aten overloads, TF op types.
SUGGESTIONS: dict[str, str] = {
    # torch
    "aten.sort.default": "sort in the input pipeline, or use reduce_max / argmax if only the extreme is needed",
    "aten.sort.stable": "sort in the input pipeline, or use reduce_max / argmax if only the extreme is needed",
    "aten.topk.default": "argmax for top-1, or compute top-k in an eval metric on the host (host_call)",
    "aten.nonzero.default": f"{_DYNAMIC_SHAPES}: multiply by a mask (x * (x != 0)) instead of selecting",
    "aten.index_put_.default": "in-place indexed write: build the result with a one-hot mask (mul, add)",
    "aten.index_put.default": "indexed write at positions from the data: build the result with a one-hot mask "
                              "(mul, add); x[mask] = value with one value runs as it is",
    "aten._unique2.default": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline",
    "aten.unique_dim.default": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline",
    "aten.median.default": "compute the median on the host, or use reduce_mean",
    "aten.masked_select.default": f"{_DYNAMIC_SHAPES}: multiply by the mask instead of selecting",
    "aten.item.default": "keep the value a tensor; reading it on the host breaks the static graph",
    "aten._local_scalar_dense.default": "keep the value a tensor; reading it on the host breaks the static graph",
    "aten._fft_r2c.default": _FFT_ON_HOST,
    "aten._fft_c2c.default": _FFT_ON_HOST,
    "aten._fft_c2r.default": _FFT_ON_HOST,
    "aten.view_as_complex.default": _FFT_ON_HOST,
    # tensorflow
    "Unique": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline (tf.data)",
    "UniqueV2": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline (tf.data)",
    "UniqueWithCounts": f"{_DYNAMIC_SHAPES}: compute unique values in the input pipeline (tf.data)",
    "Where": f"tf.where(cond) with one argument has a {_DYNAMIC_SHAPES}: use tf.where(cond, x, y) or a mask multiply",
    "Sort": "sort in the input pipeline, or tf.reduce_max / tf.argmax if only the extreme is needed",
    "TopKV2": "tf.argmax for top-1, or compute top-k in an eval metric through host_call",
    "StringToHashBucketFast": _HASH_ON_HOST,
    "StringToHashBucketStrong": _HASH_ON_HOST,
    "PyFunc": "Python code cannot run on the device: move it into the input pipeline or host_call",
    "EagerPyFunc": "Python code cannot run on the device: move it into the input pipeline or host_call",
    "Print": "remove tf.Print from the model; log from host_call or the runner's summaries",
    "PrintV2": "remove tf.print from the model; log from host_call or the runner's summaries",
    **{fft: _FFT_ON_HOST for fft in ("FFT", "IFFT", "RFFT", "IRFFT", "FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D",
                                     "FFT3D", "IFFT3D", "RFFT3D", "IRFFT3D", "Complex")},
}


# vision and losses: the forms of these ops the device lacks, and the nearest form it has
_RESIZE = "nn.Upsample / F.interpolate with mode 'nearest' (whole-number factors) or 'bilinear', align_corners=False"
SUGGESTIONS.update({
    "aten.upsample_bilinear2d.vec": _RESIZE,
    "aten.upsample_nearest2d.vec": _RESIZE,
    "aten._upsample_bilinear2d_aa.vec": f"antialias=False: {_RESIZE}",
    "aten._upsample_nearest_exact2d.vec": f"{_RESIZE} (nearest-exact equals nearest for whole-number factors)",
    "aten.upsample_bicubic2d.vec": f"{_RESIZE}, or resize in the input pipeline",
    "aten.convolution.default": "1-d and 2-d convolutions, grouped and depthwise included",
    "aten._adaptive_avg_pool2d.default": "an (N, C, H, W) input",
    "aten.as_strided.default": ("reshape, permute and slicing for a view, Tensor.unfold for sliding windows "
                                "(the device runs a strided view that keeps the elements in order)"),
    "aten.adaptive_max_pool2d.default": ("F.max_pool2d with a kernel and stride that divide the input, or "
                                         "nn.AdaptiveAvgPool2d"),
    "aten.binary_cross_entropy_with_logits.default": ("a pos_weight fixed when the step is captured: a constant "
                                                      "tensor or a buffer, not computed from the batch"),
    "aten.cross_entropy_loss.default": ("class ids as targets, and class weights fixed when the step is "
                                        "captured; ignore_index and label_smoothing are supported"),
    "aten.reflection_pad2d.default": "padding narrower than the input (at most size - 1 per side)",
    "aten.replication_pad2d.default": "non-negative padding; crop by slicing",
    "aten.constant_pad_nd.default": "non-negative padding; crop by slicing",
    "MirrorPad": "padding narrower than the input (REFLECT: at most size - 1 per side, SYMMETRIC: size)",
    "ResizeBilinear": "tf.image.resize(method='bilinear') or Keras UpSampling2D (half-pixel centres)",
    "ResizeNearestNeighbor": "Keras UpSampling2D, or tf.image.resize(method='nearest') by whole-number factors",
    "ResizeBicubic": "tf.image.resize(method='bilinear'), or resize in the input pipeline",
})


# the common ops the device lacks, and what to write instead
_NO_SCAN = ("a product along an axis: exp(cumsum(log(x))) for positive x, or compute it in the input pipeline")
_INT_BITS = ("bit operations on integers: compute them in the input pipeline; on bool masks use "
             "logical and / or / not (&, |, ~ on bool tensors)")
_BRANCH = ("control flow on a tensor's value: the device runs one static graph; compute both branches and "
           "pick with where(cond, a, b), or unroll a loop to a fixed count")
_SPARSE = "sparse tensors are not device data: use dense tensors (to_dense in the input pipeline)"
_RAGGED = "ragged tensors are not device data: pad to a fixed length in the input pipeline and pass a mask"
_SCATTER = "an indexed write: build the result from a one-hot mask (one_hot, mul, add, reduce)"
_DEPTHWISE = ("a depthwise (grouped) convolution: one Conv2D per channel group joined by concat, or a full "
              "Conv2D")
_LINALG = "linear algebra beyond matmul: compute it in the input pipeline, or on the host (host_call)"
_SAMPLE = "sampling in the model: draw the samples in the input pipeline and feed them as a batch tensor"
_STRINGS = "strings are not device data: turn them into int ids in the input pipeline (tf.data map)"
SUGGESTIONS.update({
    "aten.cumprod.default": _NO_SCAN,
    "aten.prod.dim_int": "a product: exp(sum(log(x))) for positive x, or compute it in the input pipeline",
    "aten.prod.default": "a product: exp(sum(log(x))) for positive x, or compute it in the input pipeline",
    **{f"aten.{op}.{overload}": _INT_BITS for op in ("bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not",
                                                       "bitwise_left_shift", "bitwise_right_shift",
                                                       "__lshift__", "__rshift__")
       for overload in ("Tensor", "Scalar", "default")},
    "aten.argsort.default": "sort in the input pipeline, or argmax if only the extreme is needed",
    "aten.argsort.stable": "sort in the input pipeline, or argmax if only the extreme is needed",
    "aten.median.dim": "compute the median on the host, or use reduce_mean",
    "aten.scatter_reduce.two": _SCATTER,
    "aten.scatter.src": _SCATTER,
    "aten.scatter.value": _SCATTER,
    "aten.scatter_add.default": _SCATTER,
    "aten.index_add.default": _SCATTER,
    "aten.slice_scatter.default": ("an in-place write into a view (x[:, :2].exp_()): build the new tensor with "
                                   "torch.cat of the slices instead"),
    "aten.select_scatter.default": "an in-place write into a view: build the new tensor with torch.stack / cat",
    "aten.remainder.Scalar": "x - floor(x / n) * n (floor_divide, mul, sub)",
    "aten.remainder.Tensor": "x - floor(x / n) * n (floor_divide, mul, sub)",
    "aten.repeat_interleave.Tensor": f"{_DYNAMIC_SHAPES}: repeat by a Python int (x.repeat_interleave(2))",
    "aten.bincount.default": f"{_DYNAMIC_SHAPES}: one_hot(x, n).sum(0) with a fixed n",
    "aten.histc.default": "one_hot of the bucket ids, summed, with a fixed number of buckets",
    "aten.multinomial.default": _SAMPLE,
    "aten.bernoulli.default": _SAMPLE,
    "aten.bernoulli.p": _SAMPLE,
    "aten.normal.Tensor_Tensor": _SAMPLE,
    "aten.linalg_inv_ex.default": _LINALG,
    "aten._linalg_svd.default": _LINALG,
    "aten._linalg_det.default": _LINALG,
    "aten.linalg_solve_ex.default": _LINALG,
    "aten._to_sparse.default": _SPARSE,
    "aten._to_sparse.sparse_dim": _SPARSE,
    "aten._sparse_sum.dim": _SPARSE,
    "aten._to_dense.default": _SPARSE,
    "cond": _BRANCH,
    "while_loop": _BRANCH,
    "aten.scalar_tensor.default": "keep the value a tensor; a number read from the data breaks the static graph",
    # tensorflow
    "Cumprod": _NO_SCAN,
    "Prod": "a product: tf.exp(tf.reduce_sum(tf.math.log(x))) for positive x, or compute it in the input pipeline",
    **{op: _INT_BITS for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "Invert", "LeftShift", "RightShift")},
    "DepthwiseConv2dNative": _DEPTHWISE,
    "If": _BRANCH, "StatelessIf": _BRANCH, "While": _BRANCH, "StatelessWhile": _BRANCH,
    "Switch": _BRANCH, "Merge": _BRANCH, "Enter": _BRANCH, "Exit": _BRANCH, "LoopCond": _BRANCH,
    "NextIteration": _BRANCH,
    **{op: _SPARSE for op in ("SparseTensorDenseMatMul", "SparseReduceSum", "SparseReduceSumSparse",
                              "SparseToDense", "SparseAdd", "SparseSoftmax", "SparseReshape", "SparseTensorDenseAdd",
                              "SparseReorder", "SparseFillEmptyRows", "SparseSegmentSum", "SparseSegmentMean")},
    **{op: _RAGGED for op in ("RaggedTensorToTensor", "RaggedTensorFromVariant", "RaggedTensorToVariant",
                              "RaggedGather", "RaggedRange", "RaggedTensorToSparse", "RaggedCross")},
    **{op: _STRINGS for op in ("AsString", "StringJoin", "StringSplit", "StringSplitV2", "StringToNumber",
                               "Substr", "RegexReplace", "StringLength", "StringFormat", "StringLower",
                               "StringUpper", "StaticRegexReplace", "ReduceJoin")},
    "ScatterNd": _SCATTER, "TensorScatterUpdate": _SCATTER, "TensorScatterAdd": _SCATTER,
    "TensorScatterMax": _SCATTER, "TensorScatterMin": _SCATTER,
    **{op: f"{_DYNAMIC_SHAPES}: tf.math.unsorted_segment_* with a fixed num_segments is a one_hot and a matmul; "
           "or compute it in the input pipeline" for op in ("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin",
                                                            "SegmentProd")},
    "UnsortedSegmentSum": "tf.one_hot(segment_ids, num_segments) and tf.matmul",
    "UnsortedSegmentMax": "compute it in the input pipeline, or with a one_hot mask and reduce_max",
    "Bincount": f"{_DYNAMIC_SHAPES}: tf.reduce_sum(tf.one_hot(x, n), 0) with a fixed n",
    "DenseBincount": "tf.reduce_sum(tf.one_hot(x, n), 0) with a fixed n",
    "HistogramFixedWidth": "tf.one_hot of the bucket ids, summed",
    "MatrixInverse": _LINALG, "MatrixDeterminant": _LINALG, "Svd": _LINALG, "MatrixSolve": _LINALG,
    "Qr": _LINALG, "Cholesky": _LINALG,
    "Multinomial": _SAMPLE, "RandomGamma": _SAMPLE, "RandomPoissonV2": _SAMPLE,
    "StatelessMultinomial": _SAMPLE,
    "DynamicPartition": f"{_DYNAMIC_SHAPES}: multiply by a mask per partition instead",
    "DynamicStitch": "tf.where(cond, a, b) or a one-hot mask",
    "ArgSort": "sort in the input pipeline, or tf.argmax if only the extreme is needed",
    **{op: _FFT_ON_HOST for op in ("Real", "Imag", "ComplexAbs", "Angle", "Conj")},
    "GatherNd": "tf.gather on one axis (with batch_dims), or a one-hot matmul",
})

# framework op -> the call a user writes, for frontends that record only the op (TF op types);
# the torch frontend records the call itself (SourceLoc.call)
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


def suggestion_for(framework_op: str, op: str = "") -> str:
    """What to use instead of a framework op the device lacks (the default if unknown)."""
    for key in (framework_op, f"{framework_op.rsplit('.', 1)[0]}.default", op):
        if key in SUGGESTIONS:
            return SUGGESTIONS[key]
    return DEFAULT_SUGGESTION


@dataclass(frozen=True)
class Finding:
    kind: str  # unsupported_op, dynamic_shape, dtype, mode, loss, malformed, precision, memory, or a frontend kind
    message: str
    framework_op: str = ""
    file: str = ""
    line: int = 0
    suggestion: str = ""  # what to use instead, if anything
    node: str = ""  # the IR node, if the finding is about one
    call: str = ""  # the call the user wrote (nn.BCEWithLogitsLoss, torch.cumprod, tf.math.cumprod), if known

    @property
    def what(self) -> str:
        """The op as the user wrote it, the framework's own op(s) in brackets: ``torch.cumprod
        [aten.cumprod]``; the framework op alone when the call is unknown."""
        if not self.call:
            return self.framework_op
        ops = ", ".join(op.removesuffix(".default") for op in self.framework_op.split(", ") if op)
        return f"{self.call} [{ops}]" if ops and ops != self.call else self.call

    def to_text(self) -> str:
        """``file:line: call [framework op]: message (use instead: ...)``; parts that are unknown are left out."""
        where = f"{self.file}:{self.line}" if self.file else "<graph>"
        parts = [where] + ([self.what] if self.what else []) + [self.message]
        text = ": ".join(parts)
        return f"{text} (use instead: {self.suggestion})" if self.suggestion else text


@dataclass
class ValidationReport:
    mode: str
    profile: str
    num_nodes: int
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        """One line: passed or failed, with the counts."""
        verdict = "validation passed" if self.ok else "validation failed"
        return (f"{verdict}: {len(self.errors)} error(s), {len(self.warnings)} warning(s) "
                f"in {self.num_nodes} nodes (mode {self.mode}, profile {self.profile})")

    def to_text(self) -> str:
        """One line per finding, errors first; warnings say so."""
        lines = [f.to_text() for f in self.errors]
        lines += [f"warning: {f.to_text()}" for f in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "summary": self.summary(), "mode": self.mode, "profile": self.profile,
                "num_nodes": self.num_nodes,
                "errors": [dataclasses.asdict(f) for f in self.errors],
                "warnings": [dataclasses.asdict(f) for f in self.warnings]}


def validate(graph: Graph, *, mode: str, profile) -> ValidationReport:
    """Check ``graph`` for ``mode`` on ``profile`` (a device.profiles.Profile, or None to skip the size check)."""
    report = ValidationReport(mode=mode, profile=getattr(profile, "name", str(profile)), num_nodes=len(graph.nodes))
    findings: list[tuple[str, Finding]] = []  # (severity, finding)
    findings += _check_ops(graph)
    findings += _check_frontend_issues(graph)
    findings += _check_shapes(graph)
    findings += _check_dtypes(graph)
    findings += _check_mode(graph, mode)
    if profile is not None:
        findings += _check_size(graph, profile)
    seen = set()
    for severity, finding in _one_per_call(findings):
        # an op the frontend reported and also kept as a node is one finding, not two
        key = (finding.kind, finding.framework_op, finding.file, finding.line)
        if finding.kind != "unsupported_op" or not finding.file:
            key += (finding.message,)
        if key in seen:
            continue
        seen.add(key)
        (report.errors if severity == "error" else report.warnings).append(finding)
    return report


def _one_per_call(findings: list[tuple[str, Finding]]) -> list[tuple[str, Finding]]:
    """One unsupported-op finding per call the user wrote: the framework ops one line's call
    became (``nn.BCEWithLogitsLoss`` -> abs, log1p) are listed in its brackets, in graph order."""
    groups: dict[tuple, list[Finding]] = {}
    for severity, finding in findings:
        if finding.kind == "unsupported_op" and finding.call and finding.file:
            groups.setdefault((finding.call, finding.file, finding.line), []).append(finding)
    out = []
    for severity, finding in findings:
        group = groups.get((finding.call, finding.file, finding.line)) if finding.kind == "unsupported_op" else None
        if not group or len(group) == 1:
            out.append((severity, finding))
        elif finding is group[0]:
            ops = list(dict.fromkeys(f.framework_op for f in group))
            reasons = list(dict.fromkeys(f.message for f in group))
            suggestions = [f.suggestion for f in group if f.suggestion != DEFAULT_SUGGESTION]
            out.append((severity, dataclasses.replace(
                finding, framework_op=", ".join(ops), message="; ".join(reasons),
                suggestion=suggestions[0] if suggestions else finding.suggestion)))
    return out


def _at(loc: SourceLoc, kind: str, message: str, suggestion: str = "", node: str = "") -> Finding:
    call = getattr(loc, "call", "") or CALLS.get(loc.framework_op, "")
    return Finding(kind, message, loc.framework_op, loc.file, loc.line, suggestion, node, call)


def _check_ops(graph: Graph) -> list[tuple[str, Finding]]:
    """Unsupported ops; nodes that disagree with their op's record (a frontend bug, or a dtype
    the op does not take); values the graph never defines."""
    out = []
    inherited: set[str] = set()  # outputs of ops refused only because an input is
    for node in graph.nodes:
        record = OPS.get(node.op)
        if record is None and (node.attrs.get("inherited") or inherited & set(node.inputs)):
            inherited.update(node.outputs)
            continue  # refused only because an input is, which is reported where it starts
        if record is None:
            # the op itself is named in front of the message (Finding.what); an IR op the frontend
            # named otherwise (a graph built by hand) is named here
            message = "not supported on the device"
            if node.op != node.loc.framework_op:
                message = f"op {node.op!r} is {message}"
            if node.attrs.get("reason"):  # a supported op in a form the device lacks (e.g. a grouped conv)
                message += f": {node.attrs['reason']}"
            out.append(("error", _at(node.loc, "unsupported_op", message,
                                     suggestion_for(node.loc.framework_op, node.op), node.name)))
            continue
        found = len(out)
        if not record.variadic and len(node.inputs) != len(record.inputs):
            message = (f"node {node.name!r} ({node.op}) has {len(node.inputs)} inputs, expected "
                       f"{len(record.inputs)} ({', '.join(record.inputs)}); this is a frontend bug")
            out.append(("error", _at(node.loc, "malformed", message, node=node.name)))
        missing = [a for a in record.required_attrs() if a not in node.attrs]
        if missing:
            message = (f"node {node.name!r} ({node.op}) lacks the attribute(s) {', '.join(missing)}; "
                       "this is a frontend bug")
            out.append(("error", _at(node.loc, "malformed", message, node=node.name)))
        for value in list(node.inputs) + list(node.outputs):
            if value not in graph.values:
                message = f"node {node.name!r} ({node.op}) uses value {value!r}, which the graph does not define"
                out.append(("error", _at(node.loc, "malformed", message, node=node.name)))
        if len(out) == found:
            out += _check_against_record(graph, node, record)
    return out


def _kind(dtype: str) -> str | None:
    """float, int or bool; None for a dtype the device lacks (reported where it enters)."""
    if dtype in FLOATS or dtype == "float64":
        return "float"
    if dtype in INTEGERS:
        return "int"
    return "bool" if dtype == "bool" else None


def _compatible(got: tuple, want: tuple) -> bool:
    """Same rank, and every dimension known on both sides equal."""
    return len(got) == len(want) and all(g is None or w is None or g == w for g, w in zip(got, want))


def _check_against_record(graph: Graph, node: Node, record: OpRecord) -> list[tuple[str, Finding]]:
    """The node's input dtypes are ones the op takes; its output shapes and dtypes are what the
    op's shape and dtype rules give (shapes come from the framework, so a mismatch is a frontend bug)."""
    out = []
    values = [graph.values[v] for v in node.inputs]
    if any(d is None for v in values for d in v.shape):
        return []  # a dynamic input, reported where it starts: no rule can check a shape it does not know
    for index, value in enumerate(values):
        accepted = record.input_dtypes(index)
        if value.dtype in DEVICE_DTYPES and value.dtype not in accepted:
            name = record.inputs[min(index, len(record.inputs) - 1)].lstrip("*")
            message = (f"{node.op} does not take {value.dtype} at its input {name} ({value.name!r}); "
                       f"it takes {', '.join(accepted)}")
            out.append(("error", _at(node.loc, "dtype", message, "cast it to one of those", node.name)))
    if out:
        return out
    try:
        shapes = record.shape([v.shape for v in values], node.attrs)
        dtypes = record.dtype([v.dtype for v in values], node.attrs)
    except Exception as error:  # noqa: BLE001 - attributes the rule cannot read: the frontend's bug
        message = f"node {node.name!r} ({node.op}): its attributes do not fit the op ({error}); this is a frontend bug"
        return [("error", _at(node.loc, "malformed", message, node=node.name))]
    if len(node.outputs) > len(shapes):
        message = (f"node {node.name!r} ({node.op}) has {len(node.outputs)} outputs, the op has {len(shapes)}; "
                   "this is a frontend bug")
        return [("error", _at(node.loc, "malformed", message, node=node.name))]
    for name, shape, dtype in zip(node.outputs, shapes, dtypes):
        value = graph.values[name]
        if not _compatible(value.shape, tuple(shape)):
            message = (f"output {name!r} of {node.op!r} has shape {_shape(value.shape)}, the op's shape rule "
                       f"gives {_shape(shape)}; this is a frontend bug")
            out.append(("error", _at(node.loc, "malformed", message, node=node.name)))
        got, want = _kind(value.dtype), _kind(dtype)
        if got and want and got != want:
            message = (f"output {name!r} of {node.op!r} has dtype {value.dtype}, the op's dtype rule gives "
                       f"{dtype}; this is a frontend bug")
            out.append(("error", _at(node.loc, "malformed", message, node=node.name)))
    return out


def _check_frontend_issues(graph: Graph) -> list[tuple[str, Finding]]:
    """The frontend's own findings (ops it could not lower, metrics in a training graph, ...)."""
    out = []
    for issue in graph.issues:
        loc = _as_loc(issue.get("loc"))
        kind = str(issue.get("kind", "frontend"))
        severity = "warning" if issue.get("severity") == "warning" else "error"
        suggestion = issue.get("suggestion") or (suggestion_for(loc.framework_op) if kind == "unsupported_op" else "")
        out.append((severity, _at(loc, kind, str(issue.get("message", "")), suggestion)))
    return out


def _as_loc(loc) -> SourceLoc:
    if isinstance(loc, SourceLoc):
        return loc
    if isinstance(loc, dict):
        return SourceLoc(str(loc.get("framework_op", "")), str(loc.get("file", "")), int(loc.get("line", 0) or 0))
    return SourceLoc("", str(loc) if loc else "", 0)


def _first_use(graph: Graph, value: str) -> SourceLoc:
    for node in graph.nodes:
        if value in node.inputs:
            return node.loc
    return SourceLoc("", "", 0)


def _check_shapes(graph: Graph) -> list[tuple[str, Finding]]:
    """Dynamic dimensions (None), reported where they enter the graph."""
    def dynamic(name: str) -> bool:
        value = graph.values.get(name)
        return value is not None and any(d is None for d in value.shape)

    out = []
    for name in graph.inputs:
        if dynamic(name):
            shape = graph.values[name].shape
            message = (f"input {name!r} (first used here) has a dynamic shape {_shape(shape)}: batch with "
                       "drop_remainder=True (tf.data) or drop_last=True (DataLoader) so every batch has the "
                       "same static shape")
            out.append(("error", _at(_first_use(graph, name), "dynamic_shape", message)))
    for name in list(graph.params) + list(graph.state) + list(graph.constants):
        if dynamic(name):
            message = f"variable {name!r} has a dynamic shape {_shape(graph.values[name].shape)}"
            out.append(("error", _at(_first_use(graph, name), "dynamic_shape", message)))
    for node in graph.nodes:
        if any(dynamic(v) for v in node.inputs):
            continue  # inherited: reported where the dynamic dimension came in
        if node.op not in OPS:
            continue  # an unsupported op, reported as one: its data-dependent size is why (the suggestion says)
        for v in node.outputs:
            if dynamic(v):
                message = (f"output {v!r} of {node.op!r} has a dynamic shape {_shape(graph.values[v].shape)}; "
                           "every shape must be known when the graph is compiled")
                out.append(("error", _at(node.loc, "dynamic_shape", message,
                                         "ops whose output shape depends only on their input shapes", node.name)))
    return out


def _shape(shape) -> str:
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ")"


def dtype_suggestion(dtype: str) -> str:
    """What to use instead of a dtype the device lacks. The frontends keep a framework dtype that
    the IR lacks under its framework name (complex64, uint8, ...), so any name can arrive here."""
    if dtype == "float64":
        return "float32 (torch: model.float() and float32 tensors; tf: tf.float32 / tf.cast)"
    if dtype.startswith("complex"):
        return _FFT_ON_HOST
    if dtype.startswith(("int", "uint")):
        return "int32 or int64 for ids and labels, float32 for data (cast in the input pipeline)"
    return f"one of {', '.join(DEVICE_DTYPES)}"


def _check_dtypes(graph: Graph) -> list[tuple[str, Finding]]:
    """dtypes the device cannot compute in (float64, complex from an FFT, uint8, ...), where they start.

    A value is reported where it enters: an input, a variable, a constant, or the output of an
    op none of whose inputs is already reported. A constant used only beside such a value (a
    scalar the frontend typed to match, as in ``x.double() * 2``) is not where it started.
    """
    def bad(name: str) -> bool:
        value = graph.values.get(name)
        return value is not None and value.dtype not in DEVICE_DTYPES

    def finding(name: str, loc: SourceLoc, what: str, node: str = "") -> Finding:
        dtype = graph.values[name].dtype
        return _at(loc, "dtype", f"{what} {name!r} has dtype {dtype}, which the device does not support",
                   dtype_suggestion(dtype), node)

    out = []
    for name in graph.inputs:
        if bad(name):
            out.append(("error", finding(name, _first_use(graph, name), "input")))
    for name in list(graph.params) + list(graph.state):
        if bad(name):
            out.append(("error", finding(name, _first_use(graph, name), "variable")))
    carried = {v for v in graph.values if bad(v) and v not in graph.constants}
    consumers = graph.consumers()
    for name in graph.constants:
        users = consumers.get(name, [])
        if bad(name) and (not users or any(not carried & set(n.inputs) for n in users)):
            out.append(("error", finding(name, _first_use(graph, name), "constant")))
    for node in graph.nodes:
        if any(bad(v) for v in node.inputs):
            continue  # inherited: reported where the dtype came in
        for v in node.outputs:
            if bad(v):
                out.append(("error", finding(v, node.loc, "output", node.name)))
    for name in graph.params:
        value = graph.values.get(name)
        if value is not None and value.dtype in HALF_PRECISIONS:
            message = (f"parameter {name!r} is stored in {value.dtype}; the device keeps weights in float32 "
                       "and computes in 16 bit (mixed precision)")
            out.append(("warning", _at(_first_use(graph, name), "precision", message)))
    if graph.precision not in PRECISIONS:
        out.append(("error", Finding("precision", f"compute precision {graph.precision!r} is not one of "
                                                  f"{', '.join(PRECISIONS)}")))
    return out


def _check_mode(graph: Graph, mode: str) -> list[tuple[str, Finding]]:
    if mode == "train_and_eval":
        message = ("mode train_and_eval is not allowed on the device (one static graph per run): "
                   "run --mode train, then --mode eval")
        return [("error", Finding("mode", message))]
    if mode not in MODES:
        return [("error", Finding("mode", f"unknown mode {mode!r}; valid modes: {', '.join(MODES)}"))]
    out = []
    if mode == "train":
        if graph.loss is None:
            out.append(("error", Finding("loss", "a training graph needs a loss, and none was captured "
                                                 "(TF: EstimatorSpec(loss=...); torch: the model's __call__ "
                                                 "returns the loss)")))
        elif graph.loss not in graph.values:
            out.append(("error", Finding("malformed", f"the loss {graph.loss!r} is not a value of the graph")))
        else:
            shape = graph.values[graph.loss].shape
            if any(d is not None and d != 1 for d in shape):
                out.append(("error", Finding("loss", f"the loss {graph.loss!r} must be a scalar, "
                                                     f"its shape is {_shape(shape)}")))
        if not graph.params:
            out.append(("error", Finding("params", "a training graph has no trainable parameters")))
        if graph.optimizer is None:
            out.append(("warning", Finding("optimizer", "no optimizer was captured; memory estimates "
                                                        "assume plain SGD (no optimizer state)")))
    elif graph.loss is None and not graph.outputs:
        out.append(("error", Finding("outputs", f"mode {mode} needs a loss or outputs, the graph has neither")))
    if graph.precision == "float32":
        own = sorted({v.dtype for v in graph.values.values() if v.dtype in HALF_PRECISIONS})
        if own:  # the model casts to 16 bit itself (torch.autocast in its forward, tf.cast before a matmul)
            out.append(("warning", Finding("precision", f"compute precision is float32 except where the model casts "
                                                        f"to {'/'.join(own)} itself (e.g. torch.autocast in its "
                                                        f"forward): those kernels are costed at the 16-bit rate, "
                                                        f"the rest at float32's half rate; mixed precision in "
                                                        f"params computes all of it in 16 bit")))
        else:
            out.append(("warning", Finding("precision", "compute precision is float32; the device is built for "
                                                        "mixed precision (float16/bfloat16/cb16 compute, float32 "
                                                        "weights), float32 runs at half the rate")))
    return out


def _check_size(graph: Graph, profile) -> list[tuple[str, Finding]]:
    """A cheap early warning: fp32 weights alone larger than the wafer's SRAM."""
    try:
        weight_bytes = 4 * graph.num_params()
    except TypeError:  # a dynamic parameter shape, reported above
        return []
    if weight_bytes > profile.sram_bytes:
        message = (f"the fp32 weights alone ({weight_bytes:,} bytes) exceed the {profile.name} SRAM "
                   f"({profile.sram_bytes:,} bytes): layer-pipelined execution cannot hold them")
        return [("warning", Finding("memory", message, suggestion="device.execution_mode=weight_streaming"))]
    return []
