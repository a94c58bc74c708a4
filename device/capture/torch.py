"""PyTorch frontend: one training step of an ``nn.Module``, lowered to the device IR.

Pipeline:

1. ``torch.export`` traces a small wrapper module whose ``forward(*batch)`` calls the
   user's ``step_fn(batch)`` (non-strict, module in train mode, fake tensors: the module's
   weights, buffers and RNG are not touched).
2. ``run_decompositions`` reaches the core aten op set, except for the ops in
   ``_KEPT_WHOLE`` that lower to fewer, clearer IR nodes when kept whole (``linear`` is
   transpose + matmul + add instead of views around ``addmm``; ``log_softmax`` followed
   by ``nll_loss_forward``, and ``cross_entropy_loss``, are the IR's ``cross_entropy_loss``).
3. Each FX node is lowered by the table ``_LOWERINGS`` (aten op -> handler). A node whose
   inputs are all known at capture time (``arange``, ``full``, a causal mask built from
   a buffer that is never written) is evaluated here with torch and becomes a constant.
   An aten op without a handler, or a variant its handler declines (a grouped
   convolution), becomes an IR node whose ``op`` is the aten name with its output values
   taken from the FX metadata, so that validation reports every unsupported op at once.
4. Nodes that reach neither the loss nor an output are dropped, and so are the params,
   state and constants they alone used.

Naming: parameters and state are IR values named by their ``module.state_dict()`` key
(``graph.params[key] == key``); batch inputs are ``batch_0``, ``batch_1``, ... (a tuple or list
batch) or the batch's keys (a dict batch: ``input_ids``, ...; ``batch_tensors``); every other
value is named after the FX node it came from. A tied parameter (one tensor under several
keys, GPT-2's ``head.weight = tok_emb.weight``) is one value, named by its first key as
``named_parameters()`` lists it; a name the module lacks is a validation finding.

Parameters with ``requires_grad`` become ``graph.params``; buffers the step writes
(batch norm's running statistics) and frozen parameters become ``graph.state``; buffers
the step only reads (a registered causal mask) become constants with their value at
capture time.

Known differences from torch, by design of the IR:
- ``detach`` is lowered to identity (the IR has no stop-gradient op; torch's own
  decomposition already turns it into ``alias``).
- ``scaled_dot_product_attention`` is lowered as softmax(q k^T * scale + mask) v; a fully
  masked row gives NaN here where torch gives zeros.
"""

from __future__ import annotations

import ast
import contextlib
import linecache
import math
import operator
import os
import re
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from device.capture.frames import ZOO_DIRS
from device.capture.torch_recurrent import LOWERINGS as _RECURRENT_LOWERINGS, packed_sequence_hint
from device.dtypes import FORMATS, NUMPY_STORAGE
from device.ir import Graph, SourceLoc
from device.optimizer import DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, OptimizerSpec
from zoo_base.errors import UserError

SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "AdamW")

_aten = torch.ops.aten

# Ops that run_decompositions would break up, kept whole because each has a direct IR
# lowering (see the handlers below).
_KEPT_WHOLE = (
    _aten.linear.default,
    _aten.matmul.default,
    _aten.dropout.default,
    _aten.nll_loss_forward.default,
    _aten.scaled_dot_product_attention.default,
    _aten.softplus.default,
    # vision and losses: a loss is one fused record, so findings name the user's loss
    _aten.binary_cross_entropy_with_logits.default,
    _aten.cross_entropy_loss.default,
    _aten.nll_loss2d_forward.default,
    # the pad record's reflect and edge modes (torch decomposes them into indexing)
    _aten.reflection_pad1d.default, _aten.reflection_pad2d.default, _aten.reflection_pad3d.default,
    _aten.replication_pad1d.default, _aten.replication_pad2d.default, _aten.replication_pad3d.default,
    # recurrent layers, unrolled by torch_recurrent.py (torch's decomposition drops their dropout)
    _aten.lstm.input, _aten.gru.input, _aten.rnn_tanh.input, _aten.rnn_relu.input,
)

_DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.bool: "bool",
}

# FX nodes that only check metadata and produce nothing the step uses
_IGNORED = {"aten._assert_tensor_metadata.default", "aten._assert_async.msg", "aten._assert_scalar.default",
            "aten.sym_constrain_range_for_size.default"}
# ops whose result depends only on their input's shape and dtype, never its values
_SHAPE_ONLY = {"aten.full_like.default", "aten.zeros_like.default", "aten.ones_like.default",
               "aten.empty_like.default", "aten.new_zeros.default", "aten.new_ones.default",
               "aten.new_full.default", "aten.new_empty.default"}

_SELU_ALPHA = 1.6732632423543772
_SELU_SCALE = 1.0507009873554805

_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def capture(step_fn: Callable, module: torch.nn.Module, batch, *, optimizer: torch.optim.Optimizer | None = None,
            precision: str = "float32", max_gradient_norm=None, max_gradient_value=None, loss_scale=None,
            initial_loss_scale=DEFAULT_INITIAL_LOSS_SCALE, steps_per_increase=DEFAULT_STEPS_PER_INCREASE) -> Graph:
    """Capture ``step_fn(batch)`` (the forward pass and loss of ``module``) as a device IR graph.

    ``step_fn(batch)`` returns the scalar loss, or ``(loss, outputs)`` with ``outputs`` a dict
    of tensors (e.g. ``{"logits": ...}``) that become ``graph.outputs``. ``batch`` is a tuple,
    list or dict of tensors (a value may itself be a tuple, list or dict of tensors), passed to
    ``step_fn`` as given; its tensors become ``graph.inputs`` in the order and under the names
    ``batch_tensors`` gives them.

    What the device cannot run (an unsupported op, a float64 model, inputs whose batch
    sizes differ, a non-scalar loss, an unknown precision) comes through to the graph as it
    is, for ``device.passes.validate`` to report all at once; only a step that cannot be
    traced at all raises ``UserError``.
    """
    inputs = batch_tensors(batch)
    tensors = tuple(inputs.values())
    wrapper = _Step(step_fn, module, batch, list(inputs))
    modes = {m: m.training for m in module.modules()}
    module.train()
    try:
        try:
            exported = _export(wrapper, tensors)
        except _NeedsTheBatch:  # an if or assert on the data: its branches are the first batch's
            wrapper.checks.run_eagerly(wrapper, tensors)
            exported = _export(wrapper, tensors)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - any tracing failure is the user's step: say so in one line
        raise UserError(_export_failure(e)) from e
    finally:
        for m, training in modes.items():
            m.train(training)
    table = torch.export.default_decompositions()
    for op in _KEPT_WHOLE:
        table.pop(op, None)
    exported = exported.run_decompositions(table)

    graph = Graph(frontend="torch", precision=precision)
    # the output dict's keys, in the order its tensors were flattened into the graph outputs
    output_keys = list(exported.call_spec.out_spec.child(1).context)
    _Lowering(graph, exported, wrapper).run(output_keys)
    _prune(graph)
    _fuse_erf_gelu(graph)
    _check_names(graph, module)
    if optimizer is not None:
        graph.optimizer = optimizer_spec(
            optimizer, module, max_gradient_norm=max_gradient_norm, max_gradient_value=max_gradient_value,
            loss_scale=loss_scale, initial_loss_scale=initial_loss_scale, steps_per_increase=steps_per_increase)
    return graph


def batch_tensors(batch) -> dict[str, torch.Tensor]:
    """The tensors of a batch by the name each takes as a graph input, in the order they become
    ``graph.inputs``: a tuple's or list's are ``batch_0``, ``batch_1``, ...; a dict's are its keys,
    in its order (a DataLoader over dicts collates a dict of tensors, the habit of Hugging Face:
    ``{"input_ids": ..., "attention_mask": ..., "labels": ...}``). A value may itself be a tuple,
    list or dict of tensors, one level deep: its tensors are ``key.0``, ``key.1``, ... or
    ``key.subkey``, as ``state_dict()`` names a module's children.

    Anything else (a list of strings, a number, deeper nesting, a key that is not a str) is one
    ``UserError`` naming where in the batch it is.
    """
    if not isinstance(batch, (tuple, list, Mapping)):
        raise UserError(f"the device takes a batch that is a tuple, list or dict of tensors; the batch is "
                        f"{_kind(batch)}")
    tensors: dict[str, torch.Tensor] = {}
    for name, where, value in _items(batch, "batch", "" if isinstance(batch, Mapping) else "batch_"):
        leaves = [(name, where, value)]
        if isinstance(value, (tuple, list, Mapping)):  # one level of tuple, list or dict in the batch
            leaves = _items(value, where, f"{name}.")
        if not all(isinstance(tensor, torch.Tensor) for _, _, tensor in leaves):
            raise UserError(f"{where} is {_kind(value)}; the device takes a batch whose values are tensors, or "
                            "tuples, lists or dicts of tensors")
        for leaf, leaf_where, tensor in leaves:
            if leaf in tensors:
                raise UserError(f"{leaf_where} would be the device's input {leaf!r}, as another tensor of the batch "
                                "is: rename one of their keys")
            tensors[leaf] = tensor
    if not tensors:
        raise UserError("the batch holds no tensor; the device takes a batch that is a tuple, list or dict of "
                        "tensors")
    return tensors


def _items(container, where: str, prefix: str) -> list[tuple[str, str, Any]]:
    """(input name, where in the batch, value) of each item of a tuple, list or dict."""
    if not isinstance(container, Mapping):
        return [(f"{prefix}{i}", f"{where}[{i}]", value) for i, value in enumerate(container)]
    for key in container:
        if not isinstance(key, str):
            raise UserError(f"{where} has the key {key!r}, {_kind(key)}; the keys of a dict in the batch name the "
                            "device's inputs: they must be str")
    return [(f"{prefix}{key}", f"{where}[{key!r}]", value) for key, value in container.items()]


def _kind(value) -> str:
    """'a str', 'an int', 'a list of str': the type of a value the device does not take, and of
    the first item in it that is not a tensor."""
    name = type(value).__name__
    described = f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
    first = next((item for item in items if not isinstance(item, torch.Tensor)), None)
    return described if first is None else f"{described} of {type(first).__name__}"


def _rebuilt(template, tensors):
    """A batch of the form of ``template`` (a batch, or its form: None where each tensor goes), its
    tensors taken in ``batch_tensors``' order from the iterator ``tensors``."""
    if template is None or isinstance(template, torch.Tensor):
        return next(tensors)
    if isinstance(template, Mapping):
        return type(template)({key: _rebuilt(value, tensors) for key, value in template.items()})
    values = [_rebuilt(value, tensors) for value in template]
    return type(template)(*values) if hasattr(template, "_fields") else type(template)(values)  # a namedtuple


class _Step(torch.nn.Module):
    """The module torch.export traces: forward(*batch) -> (loss, {name: output tensor}), the step
    called with the batch's tensors (``batch_tensors``) in the batch's own form (a tuple, list or dict)."""

    _PREFIX = "module."  # the user's module is the attribute ``module``: state_dict keys get this prefix

    def __init__(self, step_fn: Callable, module: torch.nn.Module, batch, input_names: list[str]):
        super().__init__()
        self.module = module
        # not a submodule even when it is an nn.Module: names come from `module` alone
        object.__setattr__(self, "step_fn", step_fn)
        # the form of the batch (tuple, list or dict, its keys; None for each tensor) forward gives its
        # tensors: the first batch's tensors themselves stay out of the traced module's attributes
        self.form = _rebuilt(batch, iter([None] * len(input_names)))
        self.input_names = input_names  # what the graph names each of forward's tensors (batch_tensors)
        self.checks = _HostChecks()
        # export keeps only `forward` frames in node stack traces, plus registered anchors;
        # annotate_fn registers its function as one (the wrapper it returns only tags
        # metadata and is not needed), so that a loss written in step_fn gets its own line
        function = step_fn if hasattr(step_fn, "__code__") else getattr(type(step_fn), "__call__", None)
        if hasattr(function, "__code__"):
            torch.fx.traceback.annotate_fn({})(function)

    def forward(self, *batch):  # the batch's tensors (export names them batch_0, batch_1, ...)
        result = self.step_fn(_rebuilt(self.form, iter(batch)))
        outputs: dict = {}
        if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[1], dict):
            result, outputs = result
        if not isinstance(result, torch.Tensor):
            raise UserError("step_fn(batch) must return the loss tensor or a pair (loss, dict of tensors); "
                            f"got {type(result).__name__}")
        for key, value in outputs.items():
            if not isinstance(value, torch.Tensor):
                raise UserError(f"step_fn output {key!r} must be a tensor; got {type(value).__name__}")
        checked = {f"{_CHECK_KEY}{i}": condition for i, (condition, _, _) in enumerate(self.checks.conditions)}
        return result, {**{str(k): v for k, v in outputs.items()}, **checked}


@contextlib.contextmanager
def _every_frame():
    """Keep every frame from the traced ``forward`` inwards in node stack traces.

    Export keeps only frames named ``forward`` (and registered anchors), so an op in a helper
    function the user's forward calls (a loss written as a function) would be placed at the
    forward's line; with every frame kept, ``_source_loc`` finds the helper's own line.
    """
    tracer = torch.fx.proxy.TracerBase
    original = getattr(tracer, "_filter_traceback_frames", None)
    if original is None:  # a torch without the hook: export's own frames
        yield
        return

    def every_frame(self, summary):
        forward_only = self._record_forward_stack_traces_only
        self._record_forward_stack_traces_only = False
        try:
            return original(self, summary)
        finally:
            self._record_forward_stack_traces_only = forward_only

    tracer._filter_traceback_frames = every_frame
    try:
        yield
    finally:
        tracer._filter_traceback_frames = original


def _export(wrapper: _Step, batch) -> torch.export.ExportedProgram:
    with _every_frame(), wrapper.checks.tracing(), _ctc_loss_whole(), warnings.catch_warnings():
        # nn.LSTM / GRU / RNN re-assign their list of weights on every call: export warns, but the
        # capture reads those weights by their parameter names
        warnings.filterwarnings("ignore", message=r"The tensor attributes .*_flat_weights")
        return torch.export.export(wrapper, tuple(batch), strict=False)


# ---- the host's checks on the data ----

_CHECK_KEY = "\0host_check:"  # the step's outputs under this prefix are the checks' conditions, not outputs


class _NeedsTheBatch(Exception):
    """An if or assert on a tensor's value met while tracing: the step must run on the batch first."""


class _HostChecks:
    """``bool(tensor)`` on the data in the step (``if labels.max() >= vocab: raise ...``,
    ``assert (lengths > 0).all()``), which torch.export cannot trace.

    Such a check belongs to the host. The step runs once eagerly on the capture's batch, recording
    each such bool by the user's line; the export then takes the branch that batch took, and each
    condition becomes a ``host_check`` node that refuses, at the user's line, a later batch on which
    the condition has the other value. The eager run leaves the module's buffers and the random
    generators as it found them.
    """

    def __init__(self):
        self.values: dict[tuple[str, int], list[bool]] | None = None  # the eager run's, per user line
        self.conditions: list[tuple[torch.Tensor, bool, SourceLoc]] = []  # (traced condition, value, line)

    def run_eagerly(self, wrapper: _Step, batch) -> None:
        buffers = [(b, b.detach().clone()) for b in wrapper.module.buffers()]
        rng, np_rng = torch.get_rng_state(), np.random.get_state()
        values: dict[tuple[str, int], list[bool]] = {}
        original = torch.Tensor.__bool__

        def recorded(tensor):
            value = original(tensor)
            file, line, _ = _user_frame()
            values.setdefault((file, line), []).append(value)
            return value

        torch.Tensor.__bool__ = recorded
        try:
            with torch.no_grad():
                wrapper(*batch)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the step fails on its own batch: the user's line, one line
            raise UserError(_export_failure(e).replace("torch.export could not capture the training step",
                                                       "the step fails on the batch it is captured with")) from e
        finally:
            torch.Tensor.__bool__ = original
            torch.set_rng_state(rng)
            np.random.set_state(np_rng)
            with torch.no_grad():
                for buffer, value in buffers:
                    buffer.copy_(value)
        self.values = values

    @contextlib.contextmanager
    def tracing(self):
        original = torch.Tensor.__bool__
        seen: dict[tuple[str, int], int] = {}
        self.conditions = []

        def traced(tensor):
            from torch._subclasses.fake_tensor import is_fake
            if not is_fake(tensor) or getattr(tensor, "constant", None) is not None:
                return original(tensor)  # a value known while tracing
            file, line, code = _user_frame()
            if not _is_check(file, line):
                return original(tensor)  # a branch of the computation: refused as torch.export refuses it
            if self.values is None:
                raise _NeedsTheBatch()
            index = seen[(file, line)] = seen.get((file, line), -1) + 1
            taken = self.values.get((file, line), [])
            if index >= len(taken):
                raise UserError(f"{file}:{line}: {code}: the step tests a tensor's value here more often while being "
                                "captured than it did on the batch: it cannot be captured as one static graph")
            self.conditions.append((tensor, taken[index], SourceLoc("bool(Tensor)", file, line, code)))
            return taken[index]

        torch.Tensor.__bool__ = traced
        try:
            yield
        finally:
            torch.Tensor.__bool__ = original


def _is_check(file: str, line: int) -> bool:
    """Is the test at ``file:line`` an ``assert``, or an ``if`` whose whole body raises (and has no else)?
    Only such a test is the host's: any other branch on the data changes what the step computes."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return False
    for statement in ast.walk(tree):
        if isinstance(statement, ast.Assert) or (
                isinstance(statement, ast.If) and not statement.orelse
                and all(isinstance(s, ast.Raise) for s in statement.body)):
            if statement.test.lineno <= line <= (statement.test.end_lineno or statement.test.lineno):
                return True
    return False


def _user_frame() -> tuple[str, int, str]:
    """The innermost frame of the running Python stack that is the user's code: (file, line, its text)."""
    for frame in reversed(traceback.extract_stack()):
        real = os.path.realpath(frame.filename)
        if not frame.filename.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS):
            return frame.filename, frame.lineno or 0, (frame.line or "").strip()
    return "<unknown>", 0, ""


# ---- audio: CTC kept whole ----

_CTC_REDUCTIONS = ("none", "mean", "sum")
_ctc_loss_function = torch.nn.functional.ctc_loss  # torch's, which the capture's own op runs eagerly


@torch.library.custom_op("zoo_device::ctc_loss", mutates_args=())
def _ctc_loss_op(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                 target_lengths: torch.Tensor, blank: int, reduction: str, zero_infinity: bool) -> torch.Tensor:
    """F.ctc_loss as one op while the capture traces: torch's own has no fake kernel (its alignment
    table's size is read from the target lengths), so export cannot trace it."""
    return _ctc_loss_function(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity)


@_ctc_loss_op.register_fake
def _ctc_loss_shape(log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity):
    return log_probs.new_empty((log_probs.shape[1],) if reduction == "none" else ())


@contextlib.contextmanager
def _ctc_loss_whole():
    """F.ctc_loss (which nn.CTCLoss calls) is the capture's one op while tracing; another form (unbatched
    log_probs) is torch's, refused as before."""
    def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False):
        if log_probs.dim() != 3 or reduction not in _CTC_REDUCTIONS:
            return _ctc_loss_function(log_probs, targets, input_lengths, target_lengths, blank, reduction,
                                      zero_infinity)
        lengths = [t if isinstance(t, torch.Tensor) else torch.as_tensor(t, dtype=torch.long)
                   for t in (input_lengths, target_lengths)]
        return _ctc_loss_op(log_probs, targets, *lengths, int(blank), reduction, bool(zero_infinity))

    torch.nn.functional.ctc_loss = ctc_loss
    try:
        yield
    finally:
        torch.nn.functional.ctc_loss = _ctc_loss_function


# what torch.export's refusals mean, in the user's words
_EXPORT_HINTS = (
    ("data-dependent", "control flow or a size that depends on a tensor's values (if on a tensor, .item(), "
                       ".tolist(), a slice bound read from a tensor): the device runs one static graph; use "
                       "torch.where or a mask instead of branching, and sizes known from the input shapes"),
    ("sparse", "sparse tensors are not device data: use dense tensors"),
)


def _export_failure(error: Exception) -> str:
    """One line: the user's file and line where tracing stopped, what stopped it, and what to do."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        real = os.path.realpath(frame.filename)
        if not frame.filename.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS):
            where = f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}: "
            break
    hint = packed_sequence_hint(error) or next(
        (h for key, h in _EXPORT_HINTS if key in text.lower() or key in type(error).__name__.lower()), "")
    return f"{where}torch.export could not capture the training step: {first}" + (f" ({hint})" if hint else "")


def _ir_dtype(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def _ir_shape(shape) -> tuple[int | None, ...]:
    # a symbolic (data-dependent or dynamic) size is unknown: None, which validation rejects
    return tuple(d if type(d) is int else None for d in shape)


def _internal_dirs() -> tuple[str, ...]:
    """Folders whose frames are never the user's line: torch, the emulator, the runners."""
    return (os.path.realpath(os.path.dirname(torch.__file__)), *ZOO_DIRS)


_INTERNAL_DIRS = _internal_dirs()


def _source_loc(node: torch.fx.Node) -> SourceLoc:
    """The innermost frame of the node's stack trace that is the user's own code, and the call
    the user wrote there."""
    op, call = str(node.target), _user_call(node)
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    for path, line in reversed(frames):
        real = os.path.realpath(path)
        # "<eval_with_key>" is code torch generated (the branches of torch.cond)
        if not path.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS):
            return SourceLoc(op, path, int(line), call)
    return SourceLoc(op, call=call)


# Python operators on tensors, as the user wrote them
_OPERATORS = {"__and__": "&", "__rand__": "&", "__or__": "|", "__ror__": "|", "__xor__": "^", "__rxor__": "^",
              "__invert__": "~", "__lshift__": "<<", "__rshift__": ">>", "__mod__": "%", "__rmod__": "%",
              "__floordiv__": "//", "__rfloordiv__": "//", "__pow__": "**", "__rpow__": "**", "__matmul__": "@",
              "__getitem__": "tensor[...]", "__setitem__": "tensor[...] = ...", "__add__": "+", "__radd__": "+",
              "__sub__": "-", "__rsub__": "-", "__mul__": "*", "__rmul__": "*", "__truediv__": "/",
              "__rtruediv__": "/", "__neg__": "-", "__abs__": "abs", "__lt__": "<", "__le__": "<=", "__gt__": ">",
              "__ge__": ">=", "__eq__": "==", "__ne__": "!="}


def _user_call(node: torch.fx.Node) -> str:
    """The call the user wrote that made this node: the torch.nn layer it runs in
    (``nn.BCEWithLogitsLoss``), else the torch function, Tensor method or Python operator
    (``torch.cumprod``, ``F.pad``, ``Tensor.sort``, ``&``); empty if export recorded neither."""
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        _, kind = list(stack.values())[-1]
        kind = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
        if kind.startswith("torch.nn.modules."):
            return "nn." + kind.rsplit(".", 1)[-1]
    fn = node.meta.get("torch_fn")
    if not (isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[1], str) and "." in fn[1]):
        return ""
    kind, name = fn[1].split(".", 1)
    if name in _OPERATORS:
        return _OPERATORS[name]
    if kind in ("method_descriptor", "method", "getset_descriptor"):
        return f"Tensor.{name}"
    if kind in ("builtin_function_or_method", "function"):
        return f"F.{name}" if hasattr(torch.nn.functional, name) else f"torch.{name}"
    return name


def _bind(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in (``self`` is spelled ``self_``)."""
    bound = {}
    for i, arg in enumerate(node.target._schema.arguments):
        name = "self_" if arg.name == "self" else arg.name
        if i < len(node.args) and not arg.kwarg_only:
            bound[name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[name] = node.kwargs[arg.name]
        else:
            bound[name] = arg.default_value if arg.has_default_value() else None
    return bound


def _axis(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _axes(dims, rank: int) -> list[int]:
    """Reduction axes, non-negative and sorted; None or [] means all (torch's convention)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(_axis(d, rank) for d in dims)


def _pair(value, default=None) -> list[int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        value = default
    if isinstance(value, int):
        return [value, value]
    return list(value) * 2 if len(value) == 1 else list(value)


def _broadcast(a: tuple, b: tuple) -> tuple:
    """numpy broadcasting of two shapes; None (unknown) wins over 1."""
    rank = max(len(a), len(b))
    a = (1,) * (rank - len(a)) + tuple(a)
    b = (1,) * (rank - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


class _Lowering:
    """Lowers the exported FX graph, node by node, into ``graph``."""

    def __init__(self, graph: Graph, exported: torch.export.ExportedProgram, wrapper: _Step):
        self.g = graph
        self.ep = exported
        self.wrapper = wrapper
        self.env: dict[torch.fx.Node, Any] = {}  # FX node -> IR value name, or a tuple of them (None: not produced)
        self.known: dict[torch.fx.Node, Any] = {}  # FX node -> its value computed at capture time
        # getitem nodes that pick a result the lowering does not produce (max-pool indices):
        # reported as unsupported only if something uses them
        self.missing: dict[torch.fx.Node, torch.fx.Node] = {}
        self.scalars: dict[tuple, str] = {}  # (value, dtype) -> IR constant, so each scalar is stored once
        self.loc = SourceLoc("<unknown>")
        self.hint = ""
        self.reason = ""

    # ---- the walk ----

    def run(self, output_keys: list[str]) -> None:
        self._placeholders()
        checks = self._checks(output_keys)
        for node in list(self.env):
            self._check(node, checks)
        for node in self.ep.graph.nodes:
            if node.op != "call_function" or str(node.target) in _IGNORED:
                continue
            self.loc, self.hint, self.reason = _source_loc(node), node.name, ""
            if node.target is operator.getitem:
                self._getitem(node)
            elif self._fold(node):
                continue
            else:
                handler = _LOWERINGS.get(str(node.target))
                first_new = len(self.g.nodes)
                try:
                    result = handler(self, node, **_bind(node)) if handler else None
                except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
                    # arguments the handler cannot read (a size computed from the data is an FX
                    # node, not an int): refused at the user's line, with what it could not read
                    del self.g.nodes[first_new:]
                    result = self.decline(f"arguments it cannot take ({type(error).__name__}: {error})")
                if result is None:
                    result = self._unsupported(node)
                self.env[node] = self._adopt_name(result, first_new)
            self._check(node, checks)
        self._outputs(output_keys)

    def _placeholders(self) -> None:
        mutated = {spec.target for spec in self.ep.graph_signature.output_specs
                   if spec.kind == OutputKind.BUFFER_MUTATION}
        nodes = {n.name: n for n in self.ep.graph.nodes if n.op == "placeholder"}
        # a batch input is named as batch_tensors names it (a dict's key), unless a parameter or buffer
        # has that name: then export's name for it (batch_<position>)
        weights = {name for name, _ in _named_tensors(self.wrapper.module)}
        names = iter(self.wrapper.input_names)
        for spec in self.ep.graph_signature.input_specs:
            node = nodes[spec.arg.name]
            if spec.kind == InputKind.USER_INPUT:
                val = node.meta["val"]
                name = next(names)
                name = node.name if name in weights or name in self.g.values else name
                self.env[node] = self.g.add_value(name, _ir_shape(val.shape), _ir_dtype(val.dtype))
                self.g.inputs.append(name)
                continue
            if spec.target is None:  # an effect token (ops with side effects are ordered by these): no data
                self.env[node] = None
                continue
            key = spec.target.removeprefix(_Step._PREFIX)
            if spec.kind == InputKind.PARAMETER:
                param = self.wrapper.get_parameter(spec.target)
                # a tied parameter (head.weight = tok_emb.weight) is one weight: export names
                # it by one of its keys, the IR by the first, as named_parameters() lists it
                key = _first_names(self.wrapper.module).get(id(param), key)
                if key in self.g.values:  # export may give each key of a tied parameter its own input
                    self.env[node] = key
                    continue
                self.env[node] = self.g.add_value(key, _ir_shape(param.shape), _ir_dtype(param.dtype))
                (self.g.params if param.requires_grad else self.g.state)[key] = key
            elif spec.kind == InputKind.BUFFER and spec.target in mutated:
                buffer = self.wrapper.get_buffer(spec.target)
                key = _first_names(self.wrapper.module).get(id(buffer), key)
                self.env[node] = self.g.add_value(key, _ir_shape(buffer.shape), _ir_dtype(buffer.dtype))
                self.g.state[key] = key
            elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                # read-only buffers and tensors the step closed over: values known now
                value = self.ep.constants.get(spec.target)
                if value is None:
                    value = self.ep.state_dict[spec.target]
                self.known[node] = value.detach().clone()
            else:
                raise UserError(f"capture: unsupported input kind {spec.kind.name} ({spec.target})")

    def _outputs(self, output_keys: list[str]) -> None:
        returned = self.ep.graph.output_node().args[0]
        user = [arg for arg, spec in zip(returned, self.ep.graph_signature.output_specs)
                if spec.kind == OutputKind.USER_OUTPUT]
        outputs = [(key, arg) for key, arg in zip(output_keys, user[1:]) if not key.startswith(_CHECK_KEY)]
        self.g.loss = self.tensor(user[0])
        self.g.outputs = {key: self.tensor(arg) for key, arg in outputs}

    def _checks(self, output_keys: list[str]) -> dict[torch.fx.Node, list[tuple[bool, SourceLoc]]]:
        """The FX node of each host check's condition -> (the value it must have, where the user wrote it)."""
        returned = self.ep.graph.output_node().args[0]
        user = [arg for arg, spec in zip(returned, self.ep.graph_signature.output_specs)
                if spec.kind == OutputKind.USER_OUTPUT]
        checks: dict[torch.fx.Node, list[tuple[bool, SourceLoc]]] = {}
        for key, arg in zip(output_keys, user[1:]):
            if key.startswith(_CHECK_KEY):
                _, expected, loc = self.wrapper.checks.conditions[int(key.removeprefix(_CHECK_KEY))]
                checks.setdefault(arg, []).append((expected, loc))
        return checks

    def _check(self, node: torch.fx.Node, checks: dict) -> None:
        """A host_check node right after the condition it checks, so that a batch is refused there."""
        if node not in checks or node not in self.env:
            return  # a condition known at capture time (no data in it) holds for every batch
        for expected, loc in checks[node]:
            self.loc, self.hint = loc, f"check_{loc.line}"
            condition = self.tensor(node)
            self.emit("host_check", [condition], (), "bool", expected=expected, code=loc.call)

    def _getitem(self, node: torch.fx.Node) -> None:
        source, index = node.args
        if source in self.known:
            self.known[node] = self.known[source][index]
            return
        name = self.env[source][index]
        if name is None:
            self.missing[node] = source
        else:
            self.env[node] = name

    def _fold(self, node: torch.fx.Node) -> bool:
        """Evaluate a node whose inputs are all known at capture time; True if it was."""
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or torch.Tag.nondeterministic_seeded in target.tags:
            return False
        shape_only = str(target) in _SHAPE_ONLY

        def value(arg):
            if arg in self.known:
                return self.known[arg]
            if shape_only:
                val = arg.meta["val"]
                return torch.zeros(tuple(val.shape), dtype=val.dtype)
            raise KeyError(arg)

        try:
            args = torch.fx.node.map_arg(node.args, value)
            kwargs = torch.fx.node.map_arg(node.kwargs, value)
        except KeyError:
            return False
        try:
            with torch.no_grad():
                self.known[node] = target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that cannot run here is lowered like any other
            return False
        return True

    # ---- values and nodes ----

    def shape(self, name: str) -> tuple:
        return self.g.values[name].shape

    def dtype(self, name: str) -> str:
        return self.g.values[name].dtype

    def new_value(self, shape, dtype: str, hint: str | None = None) -> str:
        base = hint or self.hint
        name, i = base, 1
        while name in self.g.values:
            name, i = f"{base}_{i}", i + 1
        return self.g.add_value(name, _ir_shape(shape), dtype)

    def emit(self, op: str, inputs: list[str], shape, dtype: str, /, **attrs) -> str:
        """One IR node with one output, named ``<fx node>.<op>`` until ``_adopt_name``."""
        out = self.new_value(shape, dtype, f"{self.hint}.{op}")
        self.g.add_node(op, inputs, [out], attrs, self.loc, name=out)
        return out

    def _adopt_name(self, result, first_new: int):
        """Give the FX node's own name to the value its lowering returns (if made by it)."""
        name = self.hint
        if isinstance(result, tuple) and sum(r is not None for r in result) == 1:
            # one real result among placeholders for what the IR does not produce (batch norm)
            return tuple(self._adopt_name(r, first_new) if r is not None else None for r in result)
        if not isinstance(result, str) or name in self.g.values:
            return result
        new_nodes = self.g.nodes[first_new:]
        producer = next((n for n in new_nodes if result in n.outputs), None)
        if producer is None or any(result in n.inputs for n in new_nodes):
            return result
        value = self.g.values.pop(result)
        value.name = name
        self.g.values[name] = value
        producer.outputs = [name if o == result else o for o in producer.outputs]
        producer.name = name
        return name

    def constant(self, value, dtype: str, hint: str) -> str:
        # a dtype the IR lacks (complex64, uint8, ...) keeps its own storage: validation names it
        array = np.asarray(value, dtype=NUMPY_STORAGE.get(dtype))
        name = self.new_value(array.shape, dtype, hint)
        self.g.constants[name] = array
        return name

    def scalar(self, value, dtype: str) -> str:
        key = (value, dtype)
        if key not in self.scalars:
            self.scalars[key] = self.constant(value, dtype, "const")
        return self.scalars[key]

    def tensor(self, arg, dtype: str | None = None) -> str:
        """The IR value of an FX argument (node, capture-time value or Python scalar), cast to dtype."""
        if isinstance(arg, torch.fx.Node) and arg in self.env:
            name = self.env[arg]
        elif isinstance(arg, torch.fx.Node) and arg in self.missing:
            name = self.env[arg] = self._missing_output(arg)
        elif isinstance(arg, torch.fx.Node):
            value = self.known[arg]
            if isinstance(value, torch.Tensor):
                array = (value.float() if value.dtype == torch.bfloat16 else value).detach().cpu().numpy()
                name = self.constant(array, _ir_dtype(value.dtype), arg.name)
            else:
                name = self.scalar(value, dtype or _scalar_dtype(value))
            self.env[arg] = name
        else:
            return self.scalar(arg, dtype or _scalar_dtype(arg))
        return self.cast(name, dtype) if dtype else name

    def _missing_output(self, getitem: torch.fx.Node) -> str:
        """A result the lowering of its op does not produce, now used: an unsupported node."""
        source = self.missing[getitem]
        current = self.loc, self.hint, self.reason
        self.loc, self.hint = _source_loc(source), getitem.name
        self.reason = f"output {getitem.args[1]} is not supported"
        name = self._unsupported(getitem, op=str(source.target), inputs=self._tensor_args(source))
        self.loc, self.hint, self.reason = current
        return name

    def cast(self, name: str, dtype: str) -> str:
        if self.dtype(name) == dtype:
            return name
        return self.emit("cast", [name], self.shape(name), dtype, dtype=dtype)

    def out(self, node: torch.fx.Node, index: int | None = None) -> tuple[tuple, str]:
        """(shape, dtype) of the node's result from the export metadata."""
        val = node.meta["val"] if index is None else node.meta["val"][index]
        return _ir_shape(val.shape), _ir_dtype(val.dtype)

    def decline(self, reason: str) -> None:
        """A handler's answer for a variant the IR cannot express: the node becomes unsupported."""
        self.reason = reason
        return None

    def _tensor_args(self, node: torch.fx.Node) -> list[str]:
        """The IR values of a node's arguments; an argument that is no value (the branch
        graphs of torch.cond, a result the lowering did not produce) is left out."""
        args: list[str] = []

        def add(arg):
            if arg in self.env or arg in self.missing or arg in self.known:
                name = self.tensor(arg)
                if isinstance(name, str):
                    args.append(name)
        torch.fx.node.map_arg((node.args, node.kwargs), add)
        return args

    def _unsupported(self, node: torch.fx.Node, op: str | None = None, inputs: list[str] | None = None):
        """An IR node named after the aten op, with its real output values, for validation to report."""
        op = op or str(node.target)
        inputs = self._tensor_args(node) if inputs is None else inputs
        val = node.meta.get("val")
        many = isinstance(val, (tuple, list))
        outputs = []
        for v in (val if many else [val]):
            if isinstance(v, torch.Tensor):
                outputs.append(self.new_value(_ir_shape(v.shape), _ir_dtype(v.dtype)))
            elif isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):  # a number read from the data
                outputs.append(self.new_value((), {torch.SymInt: "int64", torch.SymFloat: "float32"}.get(type(v),
                                                                                                          "bool")))
            else:
                outputs.append(None)
        attrs = {"reason": self.reason} if self.reason else {}
        self.g.add_node(op, inputs, [o for o in outputs if o is not None], attrs, self.loc,
                        name=next((o for o in outputs if o), None))
        return tuple(outputs) if many else outputs[0]

    # ---- shared lowerings ----

    def reshape(self, name: str, shape) -> str:
        shape = _ir_shape(shape)
        if tuple(shape) == self.shape(name):
            return name
        return self.emit("reshape", [name], shape, self.dtype(name), shape=list(shape))

    def transpose(self, name: str, perm) -> str:
        rank = len(self.shape(name))
        perm = [_axis(p, rank) for p in perm]
        if perm == list(range(rank)):
            return name
        return self.emit("transpose", [name], [self.shape(name)[p] for p in perm], self.dtype(name), perm=perm)

    def swap_last(self, name: str) -> str:
        rank = len(self.shape(name))
        return self.transpose(name, list(range(rank - 2)) + [rank - 1, rank - 2])

    def binary(self, op: str, a: str, b: str) -> str:
        return self.emit(op, [a, b], _broadcast(self.shape(a), self.shape(b)), self.dtype(a))

    def reduce(self, op: str, name: str, axes: list[int], keepdims: bool) -> str:
        shape = self.shape(name)
        out = [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
            [d for i, d in enumerate(shape) if i not in axes]
        return self.emit(op, [name], out, self.dtype(name), axes=axes, keepdims=keepdims)

    def slice(self, name: str, dim: int, start: int, end: int, step: int = 1) -> str:
        shape = self.shape(name)
        begin = [0] * len(shape)
        stop = list(shape)
        steps = [1] * len(shape)
        begin[dim], stop[dim], steps[dim] = start, end, step
        out = list(shape)
        out[dim] = max(0, -(-(end - start) // step))
        if out == list(shape):
            return name
        return self.emit("slice", [name], out, self.dtype(name), begin=begin, end=stop, step=steps)

    def _attend(self, probs: str, v: str, dropout_p: float, shape, dtype: str) -> str:
        """Attention's last step: dropout on the probabilities, then probs @ v."""
        if dropout_p > 0:
            probs = self.emit("dropout", [probs], self.shape(probs), dtype, rate=float(dropout_p))
        return self.emit("matmul", [probs, v], shape, dtype)


def _scalar_dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, complex):
        return "complex64"  # torch's default complex dtype; validation rejects it
    return "int64" if isinstance(value, int) else "float32"


# ---- handlers: one per aten op (or family); each returns IR value name(s) or None (declined) ----

def _elementwise(op: str, swap: bool = False):
    """add/sub/mul/div and friends: operands cast to the result dtype, alpha folded in.

    self op alpha * other; swapped (rsub): other op alpha * self.
    """
    def lower(self: _Lowering, node, self_, other, alpha=1, **_):
        shape, dtype = self.out(node)
        a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
        if swap:
            a, b = b, a
        if alpha != 1:
            b = self.binary("mul", b, self.scalar(alpha, dtype))
        return self.emit(op, [a, b], shape, dtype)
    return lower


def _div(self: _Lowering, node, self_, other, rounding_mode=None, **_):
    if rounding_mode == "floor":
        return _floor_divide(self, node, self_, other)
    if rounding_mode == "trunc" and self.out(node)[1] in ("int32", "int64"):
        return _truncated(self, node, self_, other, "quotient")
    if rounding_mode is not None:
        return self.decline(f"rounding_mode={rounding_mode!r} (only None and 'floor')")
    return _elementwise("div")(self, node, self_, other)


def _unary(op: str, **attrs):
    def lower(self: _Lowering, node, self_, **_):
        shape, dtype = self.out(node)
        return self.emit(op, [self.tensor(self_, dtype)], shape, dtype, **attrs)
    return lower


def _identity(self: _Lowering, node, **args):
    return self.tensor(next(iter(args.values())))


def _to_copy(self: _Lowering, node, self_, dtype=None, **_):
    return self.cast(self.tensor(self_), self.out(node)[1])


def _gelu(self: _Lowering, node, self_, approximate="none"):
    shape, dtype = self.out(node)
    return self.emit("gelu", [self.tensor(self_)], shape, dtype, approximate=approximate)


def _softplus(self: _Lowering, node, self_, beta=1, threshold=20):
    shape, dtype = self.out(node)
    return self.emit("softplus", [self.tensor(self_)], shape, dtype, beta=float(beta), threshold=float(threshold))


def _elu(self: _Lowering, node, self_, alpha=1, scale=1, input_scale=1):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    if input_scale != 1:
        return self.decline(f"input_scale={input_scale}")
    if math.isclose(alpha, _SELU_ALPHA) and math.isclose(scale, _SELU_SCALE):
        return self.emit("selu", [x], shape, dtype)
    y = self.emit("elu", [x], shape, dtype, alpha=float(alpha))
    return y if scale == 1 else self.binary("mul", y, self.scalar(scale, dtype))


def _leaky_relu(self: _Lowering, node, self_, negative_slope=0.01):
    if not 0 <= negative_slope <= 1:
        return self.decline(f"negative_slope={negative_slope}")
    x = self.tensor(self_)
    # max(x, a*x) == leaky_relu(x) for 0 <= a <= 1
    return self.binary("maximum", x, self.binary("mul", x, self.scalar(negative_slope, self.dtype(x))))


def _clamp(self: _Lowering, node, self_, min=None, max=None, **_):
    dtype = self.out(node)[1]
    x = self.tensor(self_, dtype)
    bounds = [b for b in (min, max) if b is not None]
    if bounds and all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
        # one clamp node: its gradient is torch's on the bounds too (maximum's would split a tie);
        # integer values (a QA head's start and end positions) keep integer bounds: exact, no float
        number = int if dtype in ("int32", "int64") else float
        attrs = {k: number(v) for k, v in (("min", min), ("max", max)) if v is not None}
        return self.emit("clamp", [x], self.shape(x), dtype, **attrs)
    # tensor bounds (aten.clamp.Tensor): maximum, then minimum, whose ties split the gradient in
    # halves between x and the bound, as torch's clamp.Tensor backward does; exact on integers
    if min is not None:
        x = self.binary("maximum", x, self.tensor(min, dtype))
    if max is not None:
        x = self.binary("minimum", x, self.tensor(max, dtype))
    return x


def _hardtanh(self: _Lowering, node, self_, min_val=-1, max_val=1):
    return _clamp(self, node, self_, min=min_val, max=max_val)


def _minimum(self: _Lowering, node, self_, other):
    # its own record (not -max(-a, -b), which overflows at an integer dtype's smallest value)
    shape, dtype = self.out(node)
    return self.emit("minimum", [self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


def _pow(self: _Lowering, node, self_, exponent):
    shape, dtype = self.out(node)
    x = self.tensor(self_, dtype)
    if exponent == 1:
        return x
    if exponent == 2:
        return self.emit("square", [x], shape, dtype)
    if exponent == 3:
        return self.binary("mul", self.emit("square", [x], shape, dtype), x)
    if exponent == 0.5:
        return self.emit("sqrt", [x], shape, dtype)
    if exponent == -0.5:
        return self.emit("rsqrt", [x], shape, dtype)
    if exponent == -1:
        return self.emit("div", [self.scalar(1.0, dtype), x], shape, dtype)
    return self.decline(f"exponent={exponent}")


def _reciprocal(self: _Lowering, node, self_):
    shape, dtype = self.out(node)
    return self.emit("div", [self.scalar(1.0, dtype), self.tensor(self_, dtype)], shape, dtype)


def _eq(self: _Lowering, node, self_, other):
    # compare in the promoted dtype, as torch does
    left = self_.meta["val"].dtype
    if isinstance(other, torch.fx.Node):
        compare = torch.promote_types(left, other.meta["val"].dtype)
    elif isinstance(other, float) and not left.is_floating_point:
        compare = torch.get_default_dtype()
    else:
        compare = left
    shape, dtype = self.out(node)
    compare = _ir_dtype(compare)
    return self.emit("equal", [self.tensor(self_, compare), self.tensor(other, compare)], shape, dtype)


def _where(self: _Lowering, node, condition, self_, other):
    """where(c, a, b) with c known at capture time (masked_fill with a mask buffer).

    With one computed branch and an infinite fill (a causal mask), it is x + (-inf where
    masked, 0 elsewhere): exact for finite x, and the additive mask that kernel matching
    recognises in attention. Otherwise the IR's where with the condition a constant, exact
    whatever the unchosen values are (an inf or NaN there never leaks, as it would through
    a multiply by a 0/1 mask).
    """
    if condition not in self.known:
        return _where_computed(self, node, condition, self_, other)
    shape, dtype = self.out(node)
    cond = self.known[condition].to(torch.bool)
    computed = [isinstance(b, torch.fx.Node) and b not in self.known for b in (self_, other)]
    if sum(computed) == 1:
        branch, fill, chosen = (other, self_, cond) if computed[1] else (self_, other, ~cond)
        value = torch.as_tensor(self.known[fill] if isinstance(fill, torch.fx.Node) else fill, dtype=torch.float64)
        filled = torch.where(chosen, value, torch.zeros((), dtype=torch.float64))
        if bool(torch.isinf(filled[chosen.expand_as(filled)]).all()):
            return self.emit("add", [self.tensor(branch, dtype), self.constant(filled.numpy(), dtype,
                                                                              f"{node.name}.fill")], shape, dtype)
    mask = self.constant(cond.numpy(), "bool", f"{node.name}.mask")
    return self.emit("where", [mask, self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


# linear algebra

def _matmul(self: _Lowering, node, self_, other=None, mat2=None, **_):
    shape, dtype = self.out(node)
    return self.emit("matmul", [self.tensor(self_), self.tensor(other if other is not None else mat2)], shape, dtype)


def _linear(self: _Lowering, node, input, weight, bias=None):
    shape, dtype = self.out(node)
    y = self.emit("matmul", [self.tensor(input), self.transpose(self.tensor(weight), [1, 0])], shape, dtype)
    return y if bias is None else self.emit("add", [y, self.tensor(bias)], shape, dtype)


def _addmm(self: _Lowering, node, self_, mat1=None, mat2=None, batch1=None, batch2=None, beta=1, alpha=1):
    shape, dtype = self.out(node)
    a, b = (mat1, mat2) if mat1 is not None else (batch1, batch2)
    y = self.emit("matmul", [self.tensor(a), self.tensor(b)], shape, dtype)
    if alpha != 1:
        y = self.binary("mul", y, self.scalar(alpha, dtype))
    if beta == 0:
        return y
    bias = self.tensor(self_)
    if beta != 1:
        bias = self.binary("mul", bias, self.scalar(beta, dtype))
    return self.emit("add", [y, bias], shape, dtype)


def _einsum(self: _Lowering, node, equation, tensors, path=None):
    shape, dtype = self.out(node)
    return self.emit("einsum", [self.tensor(t) for t in tensors], shape, dtype, equation=equation)


# shape

def _view(self: _Lowering, node, self_, **_):
    return self.reshape(self.tensor(self_), self.out(node)[0])


def _contiguous_strides(shape) -> list[int]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return strides[::-1]


def _in_order(shape, strides) -> bool:
    """Do these strides lay the elements out in row-major order (a size-1 axis's stride is free)?"""
    return all(d == 1 or s == c for d, s, c in zip(shape, strides, _contiguous_strides(shape)))


def _as_strided(self: _Lowering, node, self_, size, stride, storage_offset=None):
    """torch.as_strided that reads the input's elements in their order (what F.adaptive_avg_pool2d's
    1x1 output gets to restore its memory format): a reshape. Any other window is declined."""
    val = self_.meta["val"]
    size, stride = [int(d) for d in size], [int(s) for s in stride]
    if (not storage_offset and not val.storage_offset() and _in_order(val.shape, val.stride())
            and math.prod(size) == val.numel() and _in_order(size, stride)):
        return self.reshape(self.tensor(self_), size)
    return self.decline(f"a strided window (size {size}, stride {stride}, offset {storage_offset or 0}) over a "
                        f"tensor of shape {list(val.shape)}: only a view that keeps the elements in order runs "
                        "on the device; write it with reshape, permute, slicing or Tensor.unfold")


def _expand(self: _Lowering, node, self_, **_):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    if self.shape(x) == shape:
        return x
    return self.emit("broadcast_to", [x], shape, dtype, shape=list(shape))


def _permute(self: _Lowering, node, self_, dims):
    return self.transpose(self.tensor(self_), dims)


def _transpose(self: _Lowering, node, self_, dim0, dim1):
    x = self.tensor(self_)
    rank = len(self.shape(x))
    perm = list(range(rank))
    d0, d1 = _axis(dim0, rank), _axis(dim1, rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return self.transpose(x, perm)


def _t(self: _Lowering, node, self_):
    x = self.tensor(self_)
    return self.transpose(x, [1, 0]) if len(self.shape(x)) == 2 else x


def _slice(self: _Lowering, node, self_, dim=0, start=None, end=None, step=1):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    size = shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else end)
    return self.slice(x, dim, min(max(start, 0), size), min(max(end, 0), size), step)


def _select(self: _Lowering, node, self_, dim, index):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    index = index + shape[dim] if index < 0 else index
    return self.reshape(self.slice(x, dim, index, index + 1), self.out(node)[0])


def _split(self: _Lowering, node, self_, split_size=None, split_sizes=None, dim=0):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    if split_sizes is None:
        split_sizes = [min(split_size, shape[dim] - s) for s in range(0, shape[dim], split_size)]
    parts, start = [], 0
    for size in split_sizes:
        parts.append(self.slice(x, dim, start, start + size))
        start += size
    return tuple(parts)


def _unbind(self: _Lowering, node, self_, dim=0):
    x = self.tensor(self_)
    shape = self.shape(x)
    dim = _axis(dim, len(shape))
    out_shape = shape[:dim] + shape[dim + 1:]
    return tuple(self.reshape(self.slice(x, dim, i, i + 1), out_shape) for i in range(shape[dim]))


def _cat(self: _Lowering, node, tensors, dim=0):
    shape, dtype = self.out(node)
    names = [self.tensor(t, dtype) for t in tensors]
    names = [n for n in names if self.shape(n) != (0,)]  # torch.cat skips legacy empty 1-D tensors
    return self.emit("concat", names, shape, dtype, axis=_axis(dim, len(shape)))


def _stack(self: _Lowering, node, tensors, dim=0):
    shape, dtype = self.out(node)
    axis = _axis(dim, len(shape))
    names = [self.tensor(t, dtype) for t in tensors]
    expanded = [self.reshape(n, self.shape(n)[:axis] + (1,) + self.shape(n)[axis:]) for n in names]
    return self.emit("concat", expanded, shape, dtype, axis=axis)


# reductions

def _reduction(op: str):
    def lower(self: _Lowering, node, self_, dim=None, keepdim=False, dtype=None):
        out_dtype = self.out(node)[1]
        x = self.tensor(self_, out_dtype)
        return self.reduce(op, x, _axes(dim, len(self.shape(x))), bool(keepdim))
    return lower


def _max_dim(self: _Lowering, node, self_, dim, keepdim=False):
    x = self.tensor(self_)
    axis = _axis(dim, len(self.shape(x)))
    values = self.reduce("reduce_max", x, [axis], bool(keepdim))
    indices = _argmax(self, node, self_, dim, keepdim, index=1)
    return values, indices


def _argmax(self: _Lowering, node, self_, dim=None, keepdim=False, index=None):
    shape, dtype = self.out(node, index)
    x = self.tensor(self_)
    if dim is None:
        x = self.reshape(x, (int(np.prod(self.shape(x))),))
        dim = 0
    axis = _axis(dim, len(self.shape(x)))
    reduced = [d for i, d in enumerate(self.shape(x)) if i != axis]
    y = self.emit("argmax", [x], reduced, dtype, axis=axis)
    return self.reshape(y, shape)


def _var(self: _Lowering, node, self_, dim=None, correction=None, keepdim=False, index=None):
    """var = sum((x - mean)^2) / (n - correction), correction 1 by default (Bessel)."""
    shape, dtype = self.out(node, index)
    x = self.tensor(self_, dtype)
    axes = _axes(dim, len(self.shape(x)))
    mean = self.reduce("reduce_mean", x, axes, True)
    centred = self.binary("sub", x, mean)
    squared = self.emit("square", [centred], self.shape(centred), dtype)
    total = self.reduce("reduce_sum", squared, axes, bool(keepdim))
    count = int(np.prod([self.shape(x)[a] for a in axes]))
    correction = 1 if correction is None else correction
    return self.binary("div", total, self.scalar(float(max(count - correction, 0)), dtype)), mean


def _var_only(self: _Lowering, node, **args):
    return _var(self, node, **args)[0]


def _var_mean(self: _Lowering, node, self_, dim=None, correction=None, keepdim=False):
    var, mean = _var(self, node, self_, dim, correction, keepdim, index=0)
    return var, self.reshape(mean, self.out(node, 1)[0])


def _softmax(op: str):
    def lower(self: _Lowering, node, self_, dim, half_to_float=False, dtype=None):
        shape, out_dtype = self.out(node)
        x = self.tensor(self_, out_dtype)
        return self.emit(op, [x], shape, out_dtype, axis=_axis(dim, len(shape)))
    return lower


# normalisation, vision, language, losses

def _ones_or(self: _Lowering, arg, shape, fill: float, dtype: str, hint: str) -> str:
    """An optional affine parameter: the tensor, or a constant of ones/zeros when absent."""
    return self.tensor(arg) if arg is not None else self.constant(np.full(shape, fill), dtype, hint)


def _layer_norm(self: _Lowering, node, input, normalized_shape, weight, bias, eps):
    shape, dtype = self.out(node, 0)
    x = self.tensor(input)
    rank = len(shape)
    gamma = _ones_or(self, weight, normalized_shape, 1.0, dtype, f"{node.name}.gamma")
    beta = _ones_or(self, bias, normalized_shape, 0.0, dtype, f"{node.name}.beta")
    y = self.emit("layer_norm", [x, gamma, beta], shape, dtype,
                  axes=list(range(rank - len(normalized_shape), rank)), eps=float(eps))
    return y, None, None


def _batch_norm(self: _Lowering, node, input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training form: outputs (y, new running mean, new running var).

    The runtime writes the two new statistics back into the state inputs (kernels.py
    state_updates). momentum is torch's: new = (1 - momentum) * running + momentum * batch.
    """
    if not training:
        return self.decline("batch norm in eval form inside a training step")
    shape, dtype = self.out(node, 0)
    channels = (shape[1],)
    gamma = _ones_or(self, weight, channels, 1.0, dtype, f"{node.name}.gamma")
    beta = _ones_or(self, bias, channels, 0.0, dtype, f"{node.name}.beta")
    mean, var = self.tensor(running_mean), self.tensor(running_var)
    outputs = [self.new_value(shape, dtype),
               self.new_value(self.shape(mean), self.dtype(mean), f"{node.name}.running_mean"),
               self.new_value(self.shape(var), self.dtype(var), f"{node.name}.running_var")]
    self.g.add_node("batch_norm", [self.tensor(input), gamma, beta, mean, var], outputs,
                    {"axis": 1, "eps": float(eps), "momentum": float(momentum)}, self.loc, name=outputs[0])
    return outputs[0], None, None, outputs[1], outputs[2]


def _convolution(self: _Lowering, node, input, weight, bias, stride, padding, dilation, transposed,
                 output_padding, groups):
    if len(stride) == 1:  # audio: the 2-d convolution over a height of 1
        return _conv1d(self, node, input, weight, bias, stride, padding, dilation, transposed, groups)
    if len(stride) != 2:
        return self.decline(f"{len(stride)}-d convolution (only 2-d)")
    if transposed:
        return _conv_transpose(self, node, input, weight, bias, stride, padding, dilation, output_padding, groups)
    shape, dtype = self.out(node)
    pad = _pair(padding)
    grouped = {"groups": int(groups)} if groups != 1 else {}  # depthwise: groups = input channels
    y = self.emit("conv2d", [self.tensor(input), self.tensor(weight)], shape, dtype, strides=_pair(stride),
                  padding=[[pad[0], pad[0]], [pad[1], pad[1]]], dilations=_pair(dilation),
                  layout="NCHW", weight_layout="OIHW", **grouped)
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1, 1))], shape, dtype)


def _max_pool(self: _Lowering, node, self_, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _pair(dilation) != [1, 1]:
        return self.decline(f"dilation={dilation}")
    shape, dtype = self.out(node, 0)
    pad = _pair(padding)
    ceil = {"ceil_mode": True} if ceil_mode else {}  # GoogLeNet's pools: the output size rounds up
    y = self.emit("max_pool2d", [self.tensor(self_)], shape, dtype, kernel=_pair(kernel_size),
                  strides=_pair(stride, kernel_size), padding=[[pad[0], pad[0]], [pad[1], pad[1]]], layout="NCHW",
                  **ceil)
    return y, None


def _avg_pool(self: _Lowering, node, self_, kernel_size, stride=(), padding=0, ceil_mode=False,
              count_include_pad=True, divisor_override=None):
    pad = _pair(padding)
    if divisor_override is not None:
        return self.decline("divisor_override")
    shape, dtype = self.out(node)
    # explicit padding: the kernel divides by the whole window, zeros included (torch's default), or
    # with count_include_pad=False by its input pixels; in ceil_mode never by what runs past the padding
    count = {} if count_include_pad or pad == [0, 0] else {"count_include_pad": False}
    ceil = {"ceil_mode": True} if ceil_mode else {}
    return self.emit("avg_pool2d", [self.tensor(self_)], shape, dtype, kernel=_pair(kernel_size),
                     strides=_pair(stride, kernel_size), padding=[[pad[0], pad[0]], [pad[1], pad[1]]], layout="NCHW",
                     **count, **ceil)


def _embedding(self: _Lowering, node, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        return self.decline("scale_grad_by_freq=True")
    shape, dtype = self.out(node)
    table = self.tensor(weight)
    if padding_idx is not None and padding_idx >= 0:
        # the padding row is read as it is (zero unless the user set it) and gets no gradient
        return self.emit("embedding", [table, self.tensor(indices)], shape, dtype, padding_idx=int(padding_idx))
    return self.emit("embedding", [table, self.tensor(indices)], shape, dtype)


def _nll_loss(self: _Lowering, node, self_, target, weight, reduction, ignore_index):
    """log_softmax(logits) followed by nll_loss (or nll_loss2d) is the IR's cross_entropy_loss."""
    source = self_
    if not (isinstance(source, torch.fx.Node) and str(source.target) in ("aten._log_softmax.default",
                                                                          "aten.log_softmax.int")):
        return self.decline("nll_loss on something other than log_softmax")
    rank = len(source.meta["val"].shape)
    if _axis(source.args[1], rank) != min(1, rank - 1):
        return self.decline("log_softmax over an axis other than the classes (axis 1)")
    loss = _cross_entropy(self, node, source.args[0], target, weight, reduction, ignore_index, 0.0)
    return loss if loss is None else (loss, None)


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


def _bernoulli(self: _Lowering, node, self_, p=0.5, generator=None):
    """``torch.empty(...).bernoulli_(p)``: a 0/1 mask, 1 with probability p, of the input's shape (its values
    are never read). In-place dropout (``nn.Dropout(inplace=True)``) and torchvision's stochastic depth draw
    their masks so; the emulator draws it as dropout of ones at rate 1 - p (the values 1 / p), times p."""
    if generator is not None:
        return self.decline("a generator argument (the device draws from its own)")
    shape, dtype = self.out(node)
    ones = self.emit("broadcast_to", [self.scalar(1.0, dtype)], shape, dtype, shape=list(shape))
    kept = self.emit("dropout", [ones], shape, dtype, rate=1.0 - float(p))
    return self.binary("mul", kept, self.scalar(float(p), dtype))


def _dropout(self: _Lowering, node, input, p, train):
    x = self.tensor(input)
    if train is False or p == 0:
        y = x
    else:
        y = self.emit("dropout", [x], self.shape(x), self.dtype(x), rate=float(p))
    return (y, None) if str(node.target) == "aten.native_dropout.default" else y


# ---- vision and losses ----

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _cross_entropy(self: _Lowering, node, logits, target, weight, reduction, ignore_index, label_smoothing):
    """cross_entropy_loss over the classes at axis 1 ((N, C), (N, C, H, W), ...; (C,) unbatched)."""
    if weight is not None and weight not in self.known:
        return self.decline("weight (class weights) computed in the step (only a constant vector)")
    if not isinstance(target, torch.fx.Node) or target.meta["val"].dtype.is_floating_point:
        return self.decline("class probabilities as the target (only class ids)")
    shape, dtype = self.out(node) if not isinstance(node.meta["val"], (tuple, list)) else self.out(node, 0)
    z = self.tensor(logits)
    axis = min(1, len(self.shape(z)) - 1)
    attrs = {"axis": axis, "reduction": _REDUCTIONS[reduction], "ignore_index": int(ignore_index)}
    if label_smoothing:
        attrs["label_smoothing"] = float(label_smoothing)
    if weight is not None:
        attrs["weight"] = self.known[weight].double().flatten().tolist()
    return self.emit("cross_entropy_loss", [z, self.tensor(target)], shape, dtype, **attrs)


def _cross_entropy_loss(self: _Lowering, node, self_, target, weight=None, reduction=1, ignore_index=-100,
                        label_smoothing=0.0):
    return _cross_entropy(self, node, self_, target, weight, reduction, ignore_index, label_smoothing)


def _bce_with_logits(self: _Lowering, node, self_, target, weight=None, pos_weight=None, reduction=1):
    """One sigmoid_cross_entropy node; pos_weight (known at capture time) is its attribute, weight a
    multiply of the per-element loss, as torch applies them."""
    attrs = {}
    if pos_weight is not None:
        if pos_weight not in self.known or self.known[pos_weight].dim() > 1:
            return self.decline("pos_weight computed in the step (only a constant vector)")
        attrs["pos_weight"] = self.known[pos_weight].double().flatten().tolist()
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    z = self.tensor(target, self.dtype(x))
    if self.shape(z) != self.shape(x):
        return self.decline(f"a target of shape {self.shape(z)} for logits of shape {self.shape(x)}")
    per_element = self.emit("sigmoid_cross_entropy", [x, z], self.shape(x), dtype, **attrs)
    if weight is not None:
        per_element = self.binary("mul", per_element, self.tensor(weight, dtype))
    if _REDUCTIONS[reduction] == "none":
        return per_element
    op = "reduce_mean" if _REDUCTIONS[reduction] == "mean" else "reduce_sum"
    return self.reduce(op, per_element, list(range(len(self.shape(x)))), False)


def _conv_transpose(self: _Lowering, node, input, weight, bias, stride, padding, dilation, output_padding, groups):
    """ConvTranspose2d: the output size (from the export metadata) fixes output_padding."""
    if groups != 1:
        return self.decline(f"groups={groups} (only 1)")
    if any(p >= s for p, s in zip(_pair(output_padding), _pair(stride))):
        return self.decline(f"output_padding={list(output_padding)} not below the stride {list(stride)}")
    shape, dtype = self.out(node)
    pad = _pair(padding)
    y = self.emit("conv_transpose2d", [self.tensor(input), self.tensor(weight)], shape, dtype,
                  output_size=list(shape[2:]), strides=_pair(stride), padding=[[pad[0], pad[0]], [pad[1], pad[1]]],
                  dilations=_pair(dilation), layout="NCHW", weight_layout="IOHW")
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1, 1))], shape, dtype)


def _upsample(method: str):
    """upsample_nearest2d / upsample_bilinear2d (nn.Upsample, F.interpolate), .vec and .default."""
    def lower(self: _Lowering, node, input, output_size=None, align_corners=False, scale_factors=None,
              scales_h=None, scales_w=None):
        if align_corners:
            return self.decline("align_corners=True (only False)")
        shape, dtype = self.out(node)
        x = self.tensor(input)
        (h, w), (out_h, out_w) = self.shape(x)[2:], shape[2:]
        scales = scale_factors if scale_factors is not None else [s for s in (scales_h, scales_w) if s is not None]
        # torch maps an output pixel back by 1 / scale_factor when one is given, by in / out otherwise
        if scales and any(float(s) * n != o for s, n, o in zip(_pair(list(scales)), (h, w), (out_h, out_w))):
            return self.decline(f"scale_factor={list(scales)} that does not give a whole output size")
        if method == "nearest" and (out_h % h or out_w % w):
            given = f"scale_factor={list(scales)}" if scales else f"size={[out_h, out_w]}"
            return self.decline(f"{given}: nearest resizing from {h}x{w} to {out_h}x{out_w} "
                                "(only by whole-number factors)")
        return self.emit("resize2d", [x], shape, dtype, size=[out_h, out_w], method=method, layout="NCHW")
    return lower


def _adaptive_windows(size: int, out: int) -> np.ndarray:
    """(out, size): row i averages torch's window floor(i * size / out) .. ceil((i + 1) * size / out)."""
    matrix = np.zeros((out, size), dtype=np.float64)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _adaptive_avg_pool(self: _Lowering, node, self_, output_size):
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    (h, w), (out_h, out_w) = self.shape(x)[2:], shape[2:]
    if len(shape) != 4:
        return self.decline(f"a {len(shape)}-d input (only (N, C, H, W))")
    if h % out_h == 0 and w % out_w == 0:
        kernel = [h // out_h, w // out_w]
        return self.emit("avg_pool2d", [x], shape, dtype, kernel=kernel, strides=kernel,
                         padding=[[0, 0], [0, 0]], layout="NCHW")
    # windows that overlap or repeat: y = A_h x A_w^T with torch's windows, a linear map per axis
    rows = self.constant(_adaptive_windows(h, out_h).astype(np.float32), dtype, f"{self.hint}.rows")
    cols = self.constant(_adaptive_windows(w, out_w).astype(np.float32), dtype, f"{self.hint}.cols")
    return self.emit("einsum", [x, rows, cols], shape, dtype, equation="nchw,ih,jw->ncij")


def _mode_pad(mode: str) -> Callable:
    """reflection_pad{1,2,3}d (mode reflect) and replication_pad{1,2,3}d (mode edge): pad pairs run from the
    last axis backwards."""
    def lower(self: _Lowering, node, self_, padding):
        shape, dtype = self.out(node)
        x = self.tensor(self_)
        pairs = [[0, 0] for _ in shape]
        for i in range(len(padding) // 2):
            pairs[len(shape) - 1 - i] = [int(padding[2 * i]), int(padding[2 * i + 1])]
        if any(p < 0 for pair in pairs for p in pair):
            return self.decline(f"padding={list(padding)} with negative entries (cropping): slice instead")
        return self.emit("pad", [x], shape, dtype, pads=pairs, mode=mode)
    return lower


def _constant_pad(self: _Lowering, node, self_, pad, value=0):
    """F.pad(x, pad, value=...): pad pairs run from the last axis backwards."""
    if any(p < 0 for p in pad):
        return self.decline(f"pad={list(pad)} with negative entries (cropping): slice instead")
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    pairs = [[0, 0] for _ in shape]
    for i in range(len(pad) // 2):
        pairs[len(shape) - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    return self.emit("pad", [x], shape, dtype, pads=pairs, value=float(value))


def _repeat(self: _Lowering, node, self_, repeats):
    shape, dtype = self.out(node)
    return self.emit("tile", [self.tensor(self_)], shape, dtype, multiples=[int(r) for r in repeats])


_LOWERINGS: dict[str, Callable] = {
    # elementwise arithmetic (scalar operands become constants of the result dtype)
    "aten.add.Tensor": _elementwise("add"),
    "aten.add.Scalar": _elementwise("add"),
    "aten.sub.Tensor": _elementwise("sub"),
    "aten.sub.Scalar": _elementwise("sub"),
    "aten.rsub.Scalar": _elementwise("sub", swap=True),
    "aten.rsub.Tensor": _elementwise("sub", swap=True),
    "aten.mul.Tensor": _elementwise("mul"),
    "aten.mul.Scalar": _elementwise("mul"),
    "aten.div.Tensor": _elementwise("div"),
    "aten.div.Scalar": _elementwise("div"),
    "aten.div.Tensor_mode": _div,
    "aten.maximum.default": _elementwise("maximum"),
    "aten.minimum.default": _minimum,
    "aten.pow.Tensor_Scalar": _pow,
    "aten.reciprocal.default": _reciprocal,
    "aten.neg.default": _unary("neg"),
    "aten.exp.default": _unary("exp"),
    "aten.erf.default": _unary("erf"),
    "aten.log.default": _unary("log"),
    "aten.sqrt.default": _unary("sqrt"),
    "aten.rsqrt.default": _unary("rsqrt"),
    "aten.eq.Tensor": _eq,
    "aten.eq.Scalar": _eq,
    "aten.where.self": _where,
    # activations
    "aten.relu.default": _unary("relu"),
    "aten.tanh.default": _unary("tanh"),
    "aten.sigmoid.default": _unary("sigmoid"),
    "aten.elu.default": _elu,
    "aten.gelu.default": _gelu,
    "aten.softplus.default": _softplus,
    "aten.leaky_relu.default": _leaky_relu,
    "aten.clamp.default": _clamp,
    "aten.clamp_min.default": _clamp,
    "aten.clamp_max.default": _clamp,
    "aten.clamp.Tensor": _clamp,
    "aten.clamp_min.Tensor": _clamp,
    "aten.clamp_max.Tensor": _clamp,
    "aten.hardtanh.default": _hardtanh,
    "aten.dropout.default": _dropout,
    "aten.native_dropout.default": _dropout,
    "aten.bernoulli.p": _bernoulli,
    # identity and casts
    "aten.clone.default": _identity,
    "aten.alias.default": _identity,
    "aten.detach.default": _identity,
    "aten.lift_fresh_copy.default": _identity,
    "aten.contiguous.default": _identity,
    "aten._to_copy.default": _to_copy,
    "aten.to.dtype": _to_copy,
    # linear algebra
    "aten.linear.default": _linear,
    "aten.matmul.default": _matmul,
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.addmm.default": _addmm,
    "aten.baddbmm.default": _addmm,
    "aten.einsum.default": _einsum,
    # shape
    "aten.view.default": _view,
    "aten.as_strided.default": _as_strided,
    "aten._unsafe_view.default": _view,
    "aten.reshape.default": _view,
    "aten.squeeze.default": _view,
    "aten.squeeze.dim": _view,
    "aten.squeeze.dims": _view,
    "aten.unsqueeze.default": _view,
    "aten.flatten.using_ints": _view,
    "aten.unflatten.int": _view,
    "aten.expand.default": _expand,
    "aten.permute.default": _permute,
    "aten.transpose.int": _transpose,
    "aten.t.default": _t,
    "aten.slice.Tensor": _slice,
    "aten.select.int": _select,
    "aten.split.Tensor": _split,
    "aten.split_with_sizes.default": _split,
    "aten.unbind.int": _unbind,
    "aten.cat.default": _cat,
    "aten.stack.default": _stack,
    # reductions
    "aten.sum.default": _reduction("reduce_sum"),
    "aten.sum.dim_IntList": _reduction("reduce_sum"),
    "aten.mean.default": _reduction("reduce_mean"),
    "aten.mean.dim": _reduction("reduce_mean"),
    "aten.amax.default": _reduction("reduce_max"),
    "aten.max.default": _reduction("reduce_max"),
    "aten.max.dim": _max_dim,
    "aten.argmax.default": _argmax,
    "aten.var.correction": _var_only,
    "aten.var_mean.correction": _var_mean,
    # softmax and normalisation
    "aten._softmax.default": _softmax("softmax"),
    "aten.softmax.int": _softmax("softmax"),
    "aten._log_softmax.default": _softmax("log_softmax"),
    "aten.log_softmax.int": _softmax("log_softmax"),
    "aten.native_layer_norm.default": _layer_norm,
    "aten._native_batch_norm_legit_functional.default": _batch_norm,
    # vision
    "aten.convolution.default": _convolution,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    # language and attention
    "aten.embedding.default": _embedding,
    "aten.scaled_dot_product_attention.default": _sdpa,
    # losses
    "aten.nll_loss_forward.default": _nll_loss,
    # vision and losses
    "aten.nll_loss2d_forward.default": _nll_loss,
    "aten.cross_entropy_loss.default": _cross_entropy_loss,
    "aten.binary_cross_entropy_with_logits.default": _bce_with_logits,
    "aten.upsample_nearest2d.vec": _upsample("nearest"),
    "aten.upsample_nearest2d.default": _upsample("nearest"),
    "aten.upsample_bilinear2d.vec": _upsample("bilinear"),
    "aten.upsample_bilinear2d.default": _upsample("bilinear"),
    "aten._adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.adaptive_avg_pool2d.default": _adaptive_avg_pool,
    "aten.repeat.default": _repeat,
    "aten.constant_pad_nd.default": _constant_pad,
    **{f"aten.reflection_pad{d}d.default": _mode_pad("reflect") for d in (1, 2, 3)},
    **{f"aten.replication_pad{d}d.default": _mode_pad("edge") for d in (1, 2, 3)},
}


# ---- language ops: masks, position buckets, gathers ----

def _where_computed(self: _Lowering, node, condition, self_, other):
    """where(c, a, b) with c computed from the batch (a padding mask): the IR's where."""
    shape, dtype = self.out(node)
    cond = self.tensor(condition)
    if self.dtype(cond) != "bool":
        return self.decline(f"a {self.dtype(cond)} condition (only bool)")
    return self.emit("where", [cond, self.tensor(self_, dtype), self.tensor(other, dtype)], shape, dtype)


def _comparison(op: str):
    def lower(self: _Lowering, node, self_, other):
        return _compare(self, node, op, self_, other)
    return lower


def _logical_op(op: str, bitwise: bool = False):
    def lower(self: _Lowering, node, self_, other=None):
        return (_bitwise if bitwise else _logical)(self, node, op, self_, other)
    return lower


def _compare(self: _Lowering, node, op: str, self_, other):
    """A comparison in the promoted dtype, as torch compares (the result is bool)."""
    left = self_.meta["val"].dtype
    if isinstance(other, torch.fx.Node):
        compare = torch.promote_types(left, other.meta["val"].dtype)
    elif isinstance(other, float) and not left.is_floating_point:
        compare = torch.get_default_dtype()
    else:
        compare = left
    shape, dtype = self.out(node)
    compare = _ir_dtype(compare)
    if compare == "bool" and op != "not_equal":  # an ordering of bools: False < True, as 0 < 1
        compare = "int64"
    return self.emit(op, [self.tensor(self_, compare), self.tensor(other, compare)], shape, dtype)


def _logical(self: _Lowering, node, op: str, self_, other=None):
    """logical_and/or/not: any dtype, nonzero is true (cast to bool first)."""
    shape, dtype = self.out(node)
    operands = [self.tensor(self_, "bool")] + ([] if other is None else [self.tensor(other, "bool")])
    return self.emit(op, operands, shape, dtype)


def _bitwise(self: _Lowering, node, op: str, self_, other=None):
    """~mask, mask & mask, mask | mask: logical ops on bool; on integers they are bit operations."""
    operands = [self_] + ([] if other is None else [other])
    kinds = {a.meta["val"].dtype for a in operands if isinstance(a, torch.fx.Node)}
    if kinds != {torch.bool}:
        return self.decline(f"bitwise operation on {', '.join(sorted(_ir_dtype(k) for k in kinds))} (only bool)")
    return _logical(self, node, op, self_, other)


def _xor(bitwise: bool):
    """logical_xor, and ``a ^ b`` on masks: not_equal of the two as bools (nonzero is true)."""
    def lower(self: _Lowering, node, self_, other):
        kinds = {a.meta["val"].dtype for a in (self_, other) if isinstance(a, torch.fx.Node)}
        if bitwise and kinds != {torch.bool}:
            return self.decline(f"bitwise operation on {', '.join(sorted(_ir_dtype(k) for k in kinds))} (only bool)")
        shape, dtype = self.out(node)
        return self.emit("not_equal", [self.tensor(self_, "bool"), self.tensor(other, "bool")], shape, dtype)
    return lower


def _floor(self: _Lowering, node, self_):
    shape, dtype = self.out(node)
    x = self.tensor(self_, dtype)
    return x if dtype not in ("float32", "float16", "bfloat16") else self.emit("floor", [x], shape, dtype)


def _floor_divide(self: _Lowering, node, self_, other):
    shape, dtype = self.out(node)
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    if dtype in ("int32", "int64"):
        return self.emit("floor_div", [a, b], shape, dtype)
    return self.emit("floor", [self.binary("div", a, b)], shape, dtype)



def _remainder(self: _Lowering, node, self_, other):
    """a % b with the divisor's sign, as torch and python: a - floor(a / b) * b."""
    shape, dtype = self.out(node)
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    if dtype in ("int32", "int64"):
        quotient = self.emit("floor_div", [a, b], shape, dtype)
    else:
        quotient = self.emit("floor", [self.binary("div", a, b)], shape, dtype)
    return self.emit("sub", [a, self.binary("mul", quotient, b)], shape, dtype)


# ---- integer arithmetic: truncating division and its remainder, exact on int32 / int64 ----

def _truncated(self: _Lowering, node, self_, other, result: str):
    """Integers: a / b rounded toward zero ("quotient", torch.div(rounding_mode="trunc")) or the
    remainder with the dividend's sign ("remainder", torch.fmod), from floor_div, never a float.

    q = a // b and r = a - q * b (r has b's sign); where r != 0 and r's sign is not a's (a and b
    have opposite signs), the truncated quotient is q + 1 and the remainder r - b.
    """
    shape, dtype = self.out(node)
    if dtype not in ("int32", "int64"):
        return self.decline(f"{str(node.target)} of {dtype} values (integers only: exact there)")
    a, b = self.tensor(self_, dtype), self.tensor(other, dtype)
    quotient = self.emit("floor_div", [a, b], shape, dtype)
    remainder = self.emit("sub", [a, self.binary("mul", quotient, b)], shape, dtype)
    zero = self.scalar(0, dtype)
    signs_differ = self.emit("not_equal", [self.emit("less", [remainder, zero], shape, "bool"),
                                           self.emit("less", [a, zero], self.shape(a), "bool")], shape, "bool")
    off = self.emit("logical_and", [self.emit("not_equal", [remainder, zero], shape, "bool"), signs_differ], shape,
                    "bool")
    if result == "quotient":
        return self.emit("add", [quotient, self.emit("where", [off, self.scalar(1, dtype), zero], shape, dtype)],
                         shape, dtype)
    return self.emit("sub", [remainder, self.emit("where", [off, b, zero], shape, dtype)], shape, dtype)


def _fmod(self: _Lowering, node, self_, other):
    return _truncated(self, node, self_, other, "remainder")


def _cumsum(self: _Lowering, node, self_, dim, dtype=None):
    shape, dtype = self.out(node)  # the dtype argument is the output's (bool and ints sum as int64)
    return self.emit("cumsum", [self.tensor(self_, dtype)], shape, dtype, axis=_axis(dim, len(shape)))


def _gather(self: _Lowering, node, self_, dim, index, sparse_grad=False):
    # sparse_grad only picks the layout of torch's gradient, never its values
    shape, dtype = self.out(node)
    return self.emit("take_along_axis", [self.tensor(self_), self.tensor(index)], shape, dtype,
                     axis=_axis(dim, len(self_.meta["val"].shape)))


def _index_select(self: _Lowering, node, self_, dim, index):
    shape, dtype = self.out(node)
    return self.emit("gather", [self.tensor(self_), self.tensor(index)], shape, dtype,
                     axis=_axis(dim, len(self_.meta["val"].shape)))



def _copy(self: _Lowering, node, self_, src, non_blocking=False):
    """The functional ``self.copy_(src)``: src in self's dtype and shape (``x[:, 1:] = y`` traces to it)."""
    shape, dtype = self.out(node)
    x = self.tensor(src, dtype)
    if self.shape(x) != shape:
        x = self.emit("broadcast_to", [x], shape, dtype, shape=list(shape))
    return x


def _slice_scatter(self: _Lowering, node, self_, src, dim=0, start=None, end=None, step=1):
    """``self`` with ``self[start:end:step]`` along ``dim`` replaced by ``src`` (a slice assignment):
    the two side by side, then a gather with constant indices picking each position's source."""
    shape, dtype = self.out(node)
    x, y = self.tensor(self_, dtype), self.tensor(src, dtype)
    dim = _axis(dim, len(shape))
    size = shape[dim]
    taken = list(range(size))
    for k, i in enumerate(range(*slice(start, end, step).indices(size))):
        taken[i] = size + k
    both = list(shape)
    both[dim] += self.shape(y)[dim]
    joined = self.emit("concat", [x, y], both, dtype, axis=dim)
    index = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, index], shape, dtype, axis=dim)


def _select_scatter(self: _Lowering, node, self_, src, dim, index):
    """``self`` with ``self.select(dim, index)`` replaced by ``src`` (``x[:, 0] = y``)."""
    shape, dtype = self.out(node)
    dim = _axis(dim, len(shape))
    index = index + shape[dim] if index < 0 else index
    row = list(shape)
    row[dim] = 1
    y = self.reshape(self.tensor(src, dtype), row)
    x = self.tensor(self_, dtype)
    both = list(shape)
    both[dim] += 1
    joined = self.emit("concat", [x, y], both, dtype, axis=dim)
    taken = [shape[dim] if i == index else i for i in range(shape[dim])]
    indices = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, indices], shape, dtype, axis=dim)


def _flip(self: _Lowering, node, self_, dims):
    """x.flip(dims): a gather with the indices reversed, per axis."""
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    for dim in _axes(dims, len(shape)) if dims else []:  # flip([]) changes nothing
        index = self.constant(np.arange(shape[dim] - 1, -1, -1, dtype=np.int64), "int64", f"{node.name}.index")
        x = self.emit("gather", [x, index], shape, dtype, axis=dim)
    return x

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



def _index_put(self: _Lowering, node, self_, indices, values, accumulate=False):
    """``x[mask] = v`` (one boolean index over x's leading axes, one value) as where(mask, v, x), and
    ``x[:, [0, 2]] = v`` (constant positions on one axis) as a slice assignment; an accumulating
    write, positions read from the data, or a mask with as many values as it holds are refused."""
    shape, dtype = self.out(node)
    used = [i for i, t in enumerate(indices) if t is not None]
    if accumulate:
        return self.decline("accumulate=True (index_put_ with sums: a scatter)")
    if len(used) != 1:
        return self.decline("indices on more than one axis")
    index = indices[used[0]]
    value = values.meta["val"] if isinstance(values, torch.fx.Node) else torch.tensor(values)
    if index.meta["val"].dtype == torch.bool:
        mask_shape = tuple(index.meta["val"].shape)
        if used[0] != 0 or mask_shape != shape[:len(mask_shape)] or value.numel() != 1:
            return self.decline("a boolean index with a value per selected element (a count read from the data)")
        mask = self.reshape(self.tensor(index), mask_shape + (1,) * (len(shape) - len(mask_shape)))
        fill = self.reshape(self.tensor(values, dtype), ())
        return self.emit("where", [mask, fill, self.tensor(self_, dtype)], shape, dtype)
    if index not in self.known:
        return self.decline("positions read from the data")
    if self.known[index].dim() != 1:
        return self.decline("positions in a tensor of more than one dimension")
    dim, size = used[0], shape[used[0]]
    positions = [int(i) % size for i in self.known[index].tolist()]
    part = list(shape)
    part[dim] = len(positions)
    y = self.tensor(values, dtype)
    if self.shape(y) != tuple(part):
        y = self.emit("broadcast_to", [self.reshape(y, (1,) * (len(part) - len(self.shape(y))) + self.shape(y))],
                      part, dtype, shape=part)
    taken = list(range(size))
    for k, i in enumerate(positions):
        taken[i] = size + k
    both = list(shape)
    both[dim] += len(positions)
    joined = self.emit("concat", [self.tensor(self_, dtype), y], both, dtype, axis=dim)
    picked = self.constant(np.array(taken, dtype=np.int64), "int64", f"{node.name}.index")
    return self.emit("gather", [joined, picked], shape, dtype, axis=dim)

def _fuse_erf_gelu(graph: Graph) -> None:
    """A GELU written out with erf, x * 0.5 * (1 + erf(x / sqrt(2))) in any order of its
    factors (BERT's own ``gelu``), becomes the one ``gelu`` node nn.GELU gives: the
    activation step of its dense kernel, as TensorFlow's pattern makes it."""
    consumers = graph.consumers()
    producers = graph.producers()

    def scalar(value: str, expected: float) -> bool:
        c = graph.constants.get(value)
        return c is not None and np.size(c) == 1 and math.isclose(float(np.asarray(c).reshape(())), expected,
                                                                  rel_tol=1e-6)

    def only_use(value: str):
        users = consumers.get(value, [])
        return users[0] if len(users) == 1 and value not in graph.outputs.values() and value != graph.loss else None

    def other(node, value):
        rest = [v for v in node.inputs if v != value]
        return rest[0] if len(node.inputs) == 2 and len(rest) == 1 else None

    removed: set[str] = set()
    for erf in [n for n in graph.nodes if n.op == "erf"]:
        scaled = producers.get(erf.inputs[0])  # x / sqrt(2) or x * (1 / sqrt(2))
        if scaled is None or only_use(scaled.outputs[0]) is not erf or len(scaled.inputs) != 2:
            continue
        x, c = scaled.inputs
        if not ((scaled.op == "div" and scalar(c, math.sqrt(2.0)))
                or (scaled.op == "mul" and (scalar(c, 1 / math.sqrt(2.0)) or scalar(x, 1 / math.sqrt(2.0))))):
            continue
        if scaled.op == "mul" and scalar(x, 1 / math.sqrt(2.0)):
            x = c
        one = only_use(erf.outputs[0])  # 1 + erf(...)
        if one is None or one.op != "add" or not scalar(other(one, erf.outputs[0]) or "", 1.0):
            continue
        chain = [scaled, erf, one]
        outer = only_use(one.outputs[0])
        if outer is None or outer.op != "mul":
            continue
        factor = other(outer, one.outputs[0])
        half = producers.get(factor) if factor else None
        if factor == x:  # x * (1 + erf) then * 0.5
            last = only_use(outer.outputs[0])
            if last is None or last.op != "mul" or not scalar(other(last, outer.outputs[0]) or "", 0.5):
                continue
            chain += [outer, last]
        elif scalar(factor or "", 0.5):  # 0.5 * (1 + erf) then * x
            last = only_use(outer.outputs[0])
            if last is None or last.op != "mul" or other(last, outer.outputs[0]) != x:
                continue
            chain += [outer, last]
        elif (half is not None and half.op == "mul" and only_use(factor) is outer and x in half.inputs
              and scalar(other(half, x) or "", 0.5)):  # (0.5 * x) * (1 + erf)
            chain += [half, outer]
        else:
            continue
        last = chain[-1]
        last.op, last.inputs, last.attrs = "gelu", [x], {"approximate": "none"}
        removed |= {n.name for n in chain[:-1]}
    if removed:
        graph.nodes = [n for n in graph.nodes if n.name not in removed]
        _prune(graph)


_LOWERINGS.update({
    # language ops: masks, position buckets, gathers
    "aten.ne.Tensor": _comparison("not_equal"),
    "aten.ne.Scalar": _comparison("not_equal"),
    "aten.lt.Tensor": _comparison("less"),
    "aten.lt.Scalar": _comparison("less"),
    "aten.le.Tensor": _comparison("less_equal"),
    "aten.le.Scalar": _comparison("less_equal"),
    "aten.gt.Tensor": _comparison("greater"),
    "aten.gt.Scalar": _comparison("greater"),
    "aten.ge.Tensor": _comparison("greater_equal"),
    "aten.ge.Scalar": _comparison("greater_equal"),
    "aten.logical_not.default": _logical_op("logical_not"),
    "aten.logical_and.default": _logical_op("logical_and"),
    "aten.logical_or.default": _logical_op("logical_or"),
    "aten.bitwise_not.default": _logical_op("logical_not", bitwise=True),  # ~mask
    "aten.bitwise_and.Tensor": _logical_op("logical_and", bitwise=True),
    "aten.bitwise_or.Tensor": _logical_op("logical_or", bitwise=True),
    "aten.logical_xor.default": _xor(bitwise=False),
    "aten.bitwise_xor.Tensor": _xor(bitwise=True),  # mask ^ mask
    "aten.abs.default": _unary("abs"),
    "aten.log1p.default": _unary("log1p"),
    "aten.floor.default": _floor,
    "aten.floor_divide.default": _floor_divide,
    "aten.remainder.Scalar": _remainder,
    "aten.remainder.Tensor": _remainder,
    "aten.fmod.Tensor": _fmod,
    "aten.fmod.Scalar": _fmod,
    "aten.cumsum.default": _cumsum,
    "aten.gather.default": _gather,
    "aten.index_select.default": _index_select,
    "aten.index.Tensor": _index,
    # slice and element assignment (``shifted[:, 1:] = ids[:, :-1]``: BART's and T5's shifted labels)
    "aten.copy.default": _copy,
    "aten.slice_scatter.default": _slice_scatter,
    "aten.select_scatter.default": _select_scatter,
    "aten.flip.default": _flip,
    "aten.index_put.default": _index_put,
})
_LOWERINGS.update(_RECURRENT_LOWERINGS)  # nn.LSTM, nn.GRU, nn.RNN


# ---- audio: conv1d, group norm, CTC; any and all for the host's checks ----

def _conv1d(self: _Lowering, node, input, weight, bias, stride, padding, dilation, transposed, groups):
    """(N, C, L) convolved as (N, C, 1, L) by the 2-d kernel over a height of 1: the same sums."""
    if transposed:
        return self.decline("transposed 1-d convolution")
    shape, dtype = self.out(node)  # (N, O, L')
    x, w = self.tensor(input), self.tensor(weight)
    x = self.reshape(x, self.shape(x)[:2] + (1,) + self.shape(x)[2:])
    w = self.reshape(w, self.shape(w)[:2] + (1,) + self.shape(w)[2:])
    pad = int(padding[0]) if isinstance(padding, (list, tuple)) else int(padding)
    grouped = {"groups": int(groups)} if groups != 1 else {}
    y = self.emit("conv2d", [x, w], shape[:2] + (1,) + shape[2:], dtype, strides=[1, int(stride[0])],
                  padding=[[0, 0], [pad, pad]], dilations=[1, int(_pair(dilation)[0])], layout="NCHW",
                  weight_layout="OIHW", **grouped)
    y = self.reshape(y, shape)
    if bias is None:
        return y
    b = self.tensor(bias)
    return self.emit("add", [y, self.reshape(b, self.shape(b) + (1,))], shape, dtype)


def _group_norm(self: _Lowering, node, input, weight, bias, N, C, HxW, group, eps):
    """Each example's channels in ``group`` groups, each normalised over its channels and positions:
    the layer norm of (N, group, C / group * HxW), then the per-channel scale and shift."""
    shape, dtype = self.out(node, 0)
    per_group = int(C) // int(group) * int(HxW)
    x = self.reshape(self.tensor(input), (shape[0], int(group), per_group))
    gamma = self.constant(np.ones(per_group), dtype, f"{node.name}.gamma")
    beta = self.constant(np.zeros(per_group), dtype, f"{node.name}.beta")
    y = self.emit("layer_norm", [x, gamma, beta], self.shape(x), dtype, axes=[2], eps=float(eps))
    y = self.reshape(y, shape)
    channels = (int(C),) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = self.emit("mul", [y, self.reshape(self.tensor(weight), channels)], shape, dtype)
    if bias is not None:
        y = self.emit("add", [y, self.reshape(self.tensor(bias), channels)], shape, dtype)
    return y, None, None


def _ctc_loss(self: _Lowering, node, log_probs, targets, input_lengths, target_lengths, blank, reduction,
              zero_infinity):
    """The ctc_loss record reads its targets as targets[targets_mask]: labels.masked_select(mask) (the
    targets transformers' Wav2Vec2 passes, whose size is the data's) is its labels and mask; padded (N, S)
    targets are masked below each target length; concatenated ones whole."""
    shape, dtype = self.out(node)
    lengths = self.tensor(target_lengths)
    if isinstance(targets, torch.fx.Node) and str(targets.target) == "aten.masked_select.default":
        labels, mask = (self.tensor(arg) for arg in targets.args)
        both = _broadcast(self.shape(labels), self.shape(mask))  # masked_select broadcasts its two
        labels, mask = (v if self.shape(v) == both else self.emit("broadcast_to", [v], both, self.dtype(v),
                                                                  shape=list(both)) for v in (labels, mask))
    else:
        labels = self.tensor(targets)
        if len(self.shape(labels)) == 2:
            positions = self.constant(np.arange(self.shape(labels)[1])[None], "int64", f"{node.name}.positions")
            column = self.reshape(lengths, self.shape(lengths) + (1,))
            mask = self.emit("less", [positions, column], self.shape(labels), "bool")
        else:
            mask = self.constant(np.ones(self.shape(labels), dtype=bool), "bool", f"{node.name}.mask")
    return self.emit("ctc_loss", [self.tensor(log_probs), labels, self.tensor(input_lengths), lengths, mask],
                     shape, dtype, blank=int(blank), reduction=reduction, zero_infinity=bool(zero_infinity))


def _all_or_any(kind: str):
    """all(x) and any(x) of a bool (or number) tensor, over dims or all: the count of true values
    against the count of values (all) or 0 (any), in int64: exact."""
    def lower(self: _Lowering, node, self_, dim=None, keepdim=False):
        shape, _ = self.out(node)
        x = self.tensor(self_)
        rank = len(self.shape(x))
        dims = [dim] if isinstance(dim, int) else dim
        axes = _axes(dims, rank)
        if self.dtype(x) != "bool":
            x = self.emit("not_equal", [x, self.scalar(0, self.dtype(x))], self.shape(x), "bool")
        count = self.reduce("reduce_sum", self.cast(x, "int64"), axes, bool(keepdim))
        if kind == "all":
            size = math.prod(self.shape(x)[a] for a in axes)
            return self.emit("equal", [count, self.scalar(size, "int64")], shape, "bool")
        return self.emit("greater", [count, self.scalar(0, "int64")], shape, "bool")
    return lower


_LOWERINGS.update({
    "aten.native_group_norm.default": _group_norm,
    "zoo_device.ctc_loss.default": _ctc_loss,
    "aten.all.default": _all_or_any("all"),
    "aten.all.dim": _all_or_any("all"),
    "aten.all.dims": _all_or_any("all"),
    "aten.any.default": _all_or_any("any"),
    "aten.any.dim": _all_or_any("any"),
    "aten.any.dims": _all_or_any("any"),
})


def _first_names(module: torch.nn.Module) -> dict[int, str]:
    """id(tensor) -> its first state_dict key: a tied parameter or buffer is one tensor with many keys."""
    names: dict[int, str] = {}
    for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), name)
    return names


def _check_names(graph: Graph, module: torch.nn.Module) -> None:
    """Every weight and state name of the graph is one the module has: a validation finding if not."""
    tensors = dict(_named_tensors(module))
    for what, names in (("parameter", graph.params.values()), ("state", graph.state.values())):
        for name in names:
            if name not in tensors:
                graph.issues.append({"kind": "weights", "loc": SourceLoc(name),
                                     "message": f"{what} {name!r} is not a parameter or buffer of "
                                                f"{type(module).__name__}: its value cannot be read or saved"})


def _named_tensors(module: torch.nn.Module):
    """Every parameter and buffer by state_dict key, tied ones under each of their keys, non-persistent
    buffers included."""
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _prune(graph: Graph) -> None:
    """Drop nodes that reach neither the loss nor an output, then unused params/state/constants."""
    live = {graph.loss, *graph.outputs.values(), *(n.outputs[0] for n in graph.nodes if n.op == "host_check")}
    kept = []
    for node in reversed(graph.nodes):
        if any(out in live for out in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    graph.nodes = kept[::-1]
    used = live | set(graph.inputs) | {out for node in graph.nodes for out in node.outputs}
    graph.params = {k: v for k, v in graph.params.items() if k in used}
    graph.state = {k: v for k, v in graph.state.items() if k in used}
    graph.constants = {k: v for k, v in graph.constants.items() if k in used}
    graph.values = {k: v for k, v in graph.values.items() if k in used}


# ---- optimizer ----

@dataclass
class _Group:
    """The hyper-parameters every param group must share (weight decay may differ by exclusion)."""

    kind: str
    hyper: dict


def optimizer_spec(optimizer: torch.optim.Optimizer, module: torch.nn.Module, *, max_gradient_norm=None,
                   max_gradient_value=None, loss_scale=None, initial_loss_scale=DEFAULT_INITIAL_LOSS_SCALE,
                   steps_per_increase=DEFAULT_STEPS_PER_INCREASE) -> OptimizerSpec:
    """The update rule of a torch.optim optimizer, with torch's semantics.

    Param groups may differ only in weight decay, and only as "some groups have none":
    their params are listed in ``weight_decay_exclude`` (by state_dict key).
    """
    names = {id(p): name for name, p in module.named_parameters()}
    groups = [_group_hyper(optimizer, g) for g in optimizer.param_groups]
    first = groups[0]
    for g in groups[1:]:
        for key in ("lr", "beta1", "beta2", "eps", "momentum", "nesterov"):
            if g.hyper[key] != first.hyper[key]:
                raise UserError(f"optimizer param groups with different {key} ({first.hyper[key]} vs "
                                f"{g.hyper[key]}) are not supported")
    decays = {g.hyper["weight_decay"] for g in groups} - {0.0}
    if len(decays) > 1:
        raise UserError(f"optimizer param groups with different weight_decay {sorted(decays)} are not supported")
    exclude = []
    for param_group, g in zip(optimizer.param_groups, groups):
        for p in param_group["params"]:
            if id(p) not in names:
                raise UserError(f"the optimizer holds a parameter of shape {tuple(p.shape)} that is not in the module")
            if decays and g.hyper["weight_decay"] == 0.0 and p.requires_grad:
                exclude.append(names[id(p)])
    hyper = dict(first.hyper, weight_decay=decays.pop() if decays else 0.0)
    spec = OptimizerSpec(kind=first.kind, semantics="torch", hyper=hyper, weight_decay_exclude=tuple(exclude),
                         max_gradient_norm=max_gradient_norm, max_gradient_value=max_gradient_value,
                         loss_scale=loss_scale, initial_loss_scale=float(initial_loss_scale),
                         steps_per_increase=int(steps_per_increase))
    spec.check()
    return spec


def _group_hyper(optimizer: torch.optim.Optimizer, group: dict) -> _Group:
    name = type(optimizer).__name__
    if group.get("maximize"):
        raise UserError(f"{name}(maximize=True) is not supported")
    lr = float(group["lr"])
    if isinstance(optimizer, torch.optim.SGD):
        if group.get("dampening", 0):
            raise UserError(f"SGD(dampening={group['dampening']}) is not supported (only 0)")
        momentum = float(group.get("momentum", 0.0))
        return _Group("momentum" if momentum else "sgd",
                      dict(lr=lr, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=float(group.get("weight_decay", 0.0)),
                           momentum=momentum, nesterov=bool(group.get("nesterov", False))))
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if group.get("amsgrad"):
            raise UserError(f"{name}(amsgrad=True) is not supported")
        decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
        beta1, beta2 = (float(b) for b in group["betas"])
        return _Group("adamw" if decoupled else "adam",
                      dict(lr=lr, beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                           weight_decay=float(group["weight_decay"]), momentum=0.0, nesterov=False))
    raise UserError(f"optimizer {name} is not supported on the device; supported: {', '.join(SUPPORTED_OPTIMIZERS)}")


# ---- weights and state between the module and the emulator (state_dict keys) ----

def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()


def weights_of(module: torch.nn.Module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """The trainable parameters by state_dict key (only those of ``graph.params`` when given).

    A tied parameter (one tensor under two keys) is one weight, under its first key.
    """
    wanted = set(graph.params.values()) if graph is not None else None
    return {name: _to_numpy(p) for name, p in module.named_parameters()
            if p.requires_grad and (wanted is None or name in wanted)}


def state_of(module: torch.nn.Module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """Buffers and frozen parameters by state_dict key (only those of ``graph.state`` when given,
    non-persistent buffers the step writes included)."""
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    if graph is None:
        return {name: _to_numpy(t) for name, t in module.state_dict(keep_vars=True).items() if id(t) not in trainable}
    tensors = dict(_named_tensors(module))
    return {name: _to_numpy(tensors[name]) for name in graph.state.values() if name in tensors}


def load_weights(module: torch.nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Copy arrays into the module's parameters or buffers, by state_dict key (a tied parameter
    under any of its keys: it is one tensor)."""
    targets = {**dict(_named_tensors(module)), **module.state_dict(keep_vars=True)}
    with torch.no_grad():
        for name, array in weights.items():
            if name not in targets:
                raise UserError(f"load_weights: {name!r} is not a parameter or buffer of {type(module).__name__}")
            target = targets[name]
            array = np.asarray(array)
            if tuple(array.shape) != tuple(target.shape):
                raise UserError(f"load_weights: {name!r} has shape {tuple(array.shape)}, "
                                f"the module expects {tuple(target.shape)}")
            target.copy_(torch.tensor(array, dtype=target.dtype))


def load_state(module: torch.nn.Module, state: dict[str, np.ndarray]) -> None:
    """Copy state (batch norm statistics, ...) into the module's buffers, by state_dict key."""
    load_weights(module, state)
