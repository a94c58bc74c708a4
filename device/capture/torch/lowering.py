"""The lowering machinery: ``_Lowering`` walks the exported FX graph and emits the IR.

``_Lowering.run`` names the sources (batch inputs, parameters, state, constants), then
lowers each FX node in order: a node whose inputs are all known at capture time is
evaluated with torch (a constant); any other by its handler in the table it is given
(table.py); a node without a handler, or one its handler declines, becomes an IR node
named after the aten op, for validation to report. The handlers build on the shared
lowerings here (``emit``, ``tensor``, ``cast``, ``reshape``, ``transpose``, ``slice``, ...)
and the helpers that read an FX node's arguments (``_bind``, ``_axis``, ``_pair``, ...).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np
import torch
import torch.fx
from torch.export.graph_signature import InputKind, OutputKind

from device.capture import refused_torch
from device.capture.torch.source import _source_loc
from device.capture.torch.step import _CHECK_KEY, _Step
from device.capture.torch.variables import _first_names, _named_tensors
from device.dtypes import NUMPY_STORAGE
from device.ir import Graph, SourceLoc
from zoo_base.errors import UserError


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


def _ir_dtype(dtype: torch.dtype) -> str:
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def _ir_shape(shape) -> tuple[int | None, ...]:
    # a symbolic (data-dependent or dynamic) size is unknown: None, which validation rejects
    return tuple(d if type(d) is int else None for d in shape)


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

    def __init__(self, graph: Graph, exported: torch.export.ExportedProgram, wrapper: _Step,
                 lowerings: dict[str, Callable]):
        self.g = graph
        self.ep = exported
        self.wrapper = wrapper
        self.lowerings = lowerings  # aten op -> handler (table.py)
        self.env: dict[torch.fx.Node, Any] = {}  # FX node -> IR value name, or a tuple of them (None: not produced)
        self.known: dict[torch.fx.Node, Any] = {}  # FX node -> its value computed at capture time
        # getitem nodes that pick a result the lowering does not produce (max-pool indices):
        # reported as unsupported only if something uses them
        self.missing: dict[torch.fx.Node, torch.fx.Node] = {}
        self.scalars: dict[tuple, str] = {}  # (value, dtype) -> IR constant, so each scalar is stored once
        self.loc = SourceLoc("<unknown>")
        self.hint = ""
        self.reason = ""
        self.form = ""  # the declined form, the key of its suggestion (refused_torch.FORMS)

    # ---- the walk ----

    def run(self, output_keys: list[str]) -> None:
        self._placeholders()
        checks = self._checks(output_keys)
        for node in list(self.env):
            self._check(node, checks)
        for node in self.ep.graph.nodes:
            if node.op != "call_function" or str(node.target) in _IGNORED:
                continue
            self.loc, self.hint, self.reason, self.form = _source_loc(node), node.name, "", ""
            if node.target is operator.getitem:
                self._getitem(node)
            elif self._fold(node):
                continue
            else:
                handler = self.lowerings.get(str(node.target))
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
        first_names = _first_names(self.wrapper.module)  # once: a walk of every tensor of the model
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
                key = first_names.get(id(param), key)
                if key in self.g.values:  # export may give each key of a tied parameter its own input
                    self.env[node] = key
                    continue
                self.env[node] = self.g.add_value(key, _ir_shape(param.shape), _ir_dtype(param.dtype))
                (self.g.params if param.requires_grad else self.g.state)[key] = key
            elif spec.kind == InputKind.BUFFER and spec.target in mutated:
                buffer = self.wrapper.get_buffer(spec.target)
                key = first_names.get(id(buffer), key)
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
        current = self.loc, self.hint, self.reason, self.form
        self.loc, self.hint, self.form = _source_loc(source), getitem.name, ""
        self.reason = f"output {getitem.args[1]} is not supported"
        name = self._unsupported(getitem, op=str(source.target), inputs=self._tensor_args(source))
        self.loc, self.hint, self.reason, self.form = current
        return name

    def cast(self, name: str, dtype: str) -> str:
        if self.dtype(name) == dtype:
            return name
        return self.emit("cast", [name], self.shape(name), dtype, dtype=dtype)

    def out(self, node: torch.fx.Node, index: int | None = None) -> tuple[tuple, str]:
        """(shape, dtype) of the node's result from the export metadata."""
        val = node.meta["val"] if index is None else node.meta["val"][index]
        return _ir_shape(val.shape), _ir_dtype(val.dtype)

    def decline(self, reason: str, form: str = "") -> None:
        """A handler's answer for a variant the IR cannot express: the node becomes unsupported,
        with the suggestion refused_torch.FORMS keeps for (its aten op, ``form``)."""
        self.reason, self.form = reason, form
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
        suggestion = refused_torch.suggestion(op, self.form)
        if suggestion:
            attrs["suggestion"] = suggestion  # what validation tells the user to use instead
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
