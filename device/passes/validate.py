"""Validation: is this graph one the device can run? Reports every problem at once.

Runs in one pass over the nodes and values (no shape inference, no kernel matching), so
that ``--validate_only`` answers in well under a second. Each finding points at the
user's source line (the node's ``loc``) and, where there is one, says what to use
instead: for an op the device cannot take, the suggestion the frontend that refused it
attached to the node (device/capture/refused_torch.py, refused_tf.py: each frontend keeps
the table of the framework ops it cannot lower; this module names none), else a
framework-neutral default. Problems that propagate (a dynamic batch makes every later
shape dynamic, a float64 input makes every later value float64) are reported once, where
they start.
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
_FFT_ON_HOST = ("complex numbers are not device data: compute the FFT in the input pipeline (a tf.data map, "
                "or the PyTorch Dataset) and feed real float32 features: the magnitude, or the real and "
                "imaginary parts as channels")


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
        """The op as the user wrote it, the framework's own op(s) in brackets (``call [op]``, the
        ops without a ``.default`` overload suffix); the framework op alone when the call is unknown."""
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
    call = getattr(loc, "call", "")
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
                                     node.attrs.get("suggestion") or DEFAULT_SUGGESTION, node.name)))
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
        suggestion = issue.get("suggestion") or (DEFAULT_SUGGESTION if kind == "unsupported_op" else "")
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
