"""Walking a TF graph back from the loss and outputs, and emitting the IR: the frontend's driver.

``Lowering.run`` walks post-order from the targets (the loss, the outputs) to the batch
inputs, the variables and the constants, and lowers each tensor on the way by the rules it
is handed (``Rules``): a loop or TensorList op (loops.py), else a pattern of several TF ops
(patterns.py), else the op type's mapping (table.py); an op in none becomes an IR node named
after the TF op type, with its outputs' static shapes, so that validation reports every
unsupported op at once with its source line. The package's ``capture`` gathers the rules, so
that their modules import this one and it none of them.

Sources: a tensor in ``inputs`` is a graph input; ReadVariableOp(VarHandleOp) and
VariableV2 are params (trainable and updated by train_op) or state; a constant, or any
stateless subgraph of constants, is folded once (constants.py) into graph.constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import tensorflow as tf

from device import ir
from device.capture import refused_tf
from device.capture.tf.constants import ConstantFolder
from device.capture.tf.plan import CannotMap, Plan, TensorList
from device.capture.tf.tensors import ir_dtype, reachable, source_loc, static_shape, variable_name

_KEYS = tf.compat.v1.GraphKeys

# a mapping answers the Plan of one tensor of its op type (CannotMap: refused); a pattern, or
# the loops' rule, a Plan or None where the tensor is not what it looks for
OpMapping = Callable[["Lowering", tf.Tensor], Plan]
Pattern = Callable[["Lowering", tf.Tensor], "Plan | None"]


@dataclass(frozen=True)
class Rules:
    """What the lowering tries on a tensor, in this order."""

    loop: Pattern  # loops.plan: a while loop, unrolled; its TensorLists
    patterns: dict[str, list[Pattern]]  # patterns.PATTERNS: several TF ops, by the op type that ends them
    mappings: dict[str, OpMapping]  # table.MAPPINGS: one TF op type -> one or a few IR ops


class Lowering:
    """One capture: the IR graph being built, and what the mappings and patterns ask of it."""

    def __init__(self, tf_graph: tf.Graph, inputs: list[tf.Tensor], train_op: tf.Operation | None,
                 updated: set[str] | None, rules: Rules):
        self.tf_graph = tf_graph
        self.rules = rules
        self.graph = ir.Graph(frontend="tf")
        self.inputs = {t.name: t for t in inputs}
        self.value_of: dict[str, str] = {}  # TF tensor name -> IR value name
        self.plans: dict[str, Plan] = {}
        self.train_op = train_op
        self.trainable = {variable_name(v) for v in tf_graph.get_collection(_KEYS.TRAINABLE_VARIABLES)}
        self.updated = updated  # variables train_op writes; None: every trainable one
        self.constants = ConstantFolder(tf_graph, inputs)
        # batch statistic tensor name -> (variable, share): found once, by patterns.py
        self.moving_averages: dict[str, tuple[tf.Operation, float]] | None = None
        self._fresh = 0
        self.locs: dict[str, ir.SourceLoc] = {}
        self.lists: dict[str, TensorList] = {}  # TF variant tensor name -> the TensorList it holds
        self.unrolled: set[str] = set()  # IR nodes and values of unrolled loops (loops.py)
        self.trips: dict[str, list] = {}  # While op name -> its iterations (loops.py)

    def close(self):
        self.constants.close()

    # -- driver ---------------------------------------------------------------

    def run(self, loss, outputs: dict[str, tf.Tensor], training: bool) -> ir.Graph:
        for tensor in self.inputs.values():
            self.graph.add_value(tensor.name, static_shape(tensor), ir_dtype(tensor.dtype))
            self.graph.inputs.append(tensor.name)
            self.value_of[tensor.name] = tensor.name
        targets = ([loss] if loss is not None else []) + list(outputs.values())
        self._lower(targets)
        if loss is not None:
            self.graph.loss = self.value_of[loss.name]
        self.graph.outputs = {key: self.value_of[t.name] for key, t in outputs.items()}
        if training:
            self._report_metrics(targets + [self.train_op])
        _drop_unused(self.graph, self.unrolled)
        return self.graph

    def _lower(self, targets: list[tf.Tensor]):
        """Post-order walk from the targets: a tensor's node is emitted after its deps'."""
        stack = [(t, False) for t in reversed(targets)]
        while stack:
            tensor, ready = stack.pop()
            if tensor.name in self.value_of:
                continue
            if ready:
                self.plans[tensor.name].build()
                continue
            if tensor.name not in self.plans:
                if self._source(tensor):
                    continue
                self.plans[tensor.name] = self._plan(tensor)
            stack.append((tensor, True))
            stack.extend((d, False) for d in reversed(self.plans[tensor.name].deps) if d.name not in self.value_of)

    def _plan(self, tensor: tf.Tensor) -> Plan:
        op = tensor.op
        if any(t.shape.rank is None for t in op.inputs):
            # reported where the unknown rank starts (a py_function, a ragged conversion), not at every later op
            return self._unsupported(tensor, "an input of unknown rank", inherited=True)
        if tensor.shape.rank is None:
            return self._unsupported(tensor, "a tensor of unknown rank")
        plan = self.rules.loop(self, tensor)  # a while loop, unrolled; its TensorLists
        if plan is not None:
            return plan
        for match in self.rules.patterns.get(op.type, ()):
            plan = match(self, tensor)
            if plan is not None:
                return plan
        mapper = self.rules.mappings.get(op.type)
        if mapper is not None:
            try:
                return mapper(self, tensor)
            except CannotMap as reason:
                return self._unsupported(tensor, str(reason), form=reason.form)
        return self._unsupported(tensor)

    def _unsupported(self, tensor: tf.Tensor, reason: str = "", inherited: bool = False, form: str = "") -> Plan:
        """A node named after the TF op type, for validation to report (``inherited``: only
        because an input is already refused, reported there), with the suggestion
        refused_tf keeps for the op type (in its refused ``form``)."""
        op = tensor.op
        data = [t for t in op.inputs]

        def build():
            outs = [t for t in op.outputs if t.name not in self.value_of]
            attrs = {"reason": reason} if reason else {}
            if inherited:
                attrs["inherited"] = True
            elif refused_tf.suggestion(op.type, form):
                attrs["suggestion"] = refused_tf.suggestion(op.type, form)
            self.emit(op.type, [self.value_of[t.name] for t in data], op, outs, attrs)
        return Plan(data, build)

    # -- sources: inputs, variables, constants -----------------------------------

    def _source(self, tensor: tf.Tensor) -> bool:
        """Give ``tensor`` a value if it is a variable or a constant; True if it did."""
        op = tensor.op
        handle = None
        if op.type == "ReadVariableOp" and op.inputs[0].op.type == "VarHandleOp":
            handle = op.inputs[0].op
        elif op.type in ("VarHandleOp", "VariableV2"):
            handle = op
        if handle is not None:
            self.value_of[tensor.name] = self.variable(handle)
            return True
        value = self.const(tensor)
        if value is None:
            return False
        self.graph.add_value(tensor.name, static_shape(tensor) if tensor.shape.is_fully_defined() else value.shape,
                             ir_dtype(tensor.dtype))
        self.graph.constants[tensor.name] = value
        self.value_of[tensor.name] = tensor.name
        return True

    def variable(self, handle: tf.Operation) -> str:
        """The IR value of a variable: named as TF names it, a param if trained, else state."""
        name = handle.name
        if name not in self.graph.values:
            if handle.type == "VarHandleOp":
                shape = tuple(tf.TensorShape(handle.get_attr("shape")).as_list())
                dtype = ir_dtype(handle.get_attr("dtype"))
            else:
                shape, dtype = static_shape(handle.outputs[0]), ir_dtype(handle.outputs[0].dtype)
            self.graph.add_value(name, shape, dtype)
            trained = name in self.trainable and (self.updated is None or name in self.updated)
            (self.graph.params if trained else self.graph.state)[name] = name
        return name

    def const(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of a tensor computable from constants alone, else None."""
        return self.constants.value(tensor)

    def scalar(self, tensor: tf.Tensor) -> float | None:
        return self.constants.scalar(tensor)

    def is_const(self, tensor: tf.Tensor, expected: float, rtol: float | None = None) -> bool:
        return self.constants.is_const(tensor, expected, rtol)

    def attr(self, tensor: tf.Tensor, what: str) -> np.ndarray:
        """A constant input that an IR attribute needs (axes, shape, perm)."""
        value = self.const(tensor)
        if value is None:
            raise CannotMap(f"{what} is not a constant")
        return value

    # -- emitting -----------------------------------------------------------------

    def loc(self, op: tf.Operation, label: str | None = None) -> ir.SourceLoc:
        key = f"{op.name}|{label}"
        if key not in self.locs:
            self.locs[key] = source_loc(op, label)
        return self.locs[key]

    def value(self, tensor: tf.Tensor) -> str:
        return self.value_of[tensor.name]

    def emit(self, ir_op: str, inputs: list[str], op: tf.Operation, outputs: list[tf.Tensor], attrs=None,
              label: str | None = None) -> None:
        """One IR node whose outputs are the given TF tensors; ``label`` names a pattern's framework op."""
        for t in outputs:
            self.graph.add_value(t.name, static_shape(t), ir_dtype(t.dtype))
            self.value_of[t.name] = t.name
        self.graph.add_node(ir_op, inputs, [t.name for t in outputs], attrs, self.loc(op, label), name=op.name)

    def aux(self, ir_op: str, inputs: list[str], op: tf.Operation, shape, dtype: str, attrs=None) -> str:
        """One IR node with a fresh output value (a step of an op lowered to several nodes)."""
        self._fresh += 1
        name = f"{op.name}/{ir_op}_{self._fresh}"
        self.graph.add_value(name + ":0", tuple(shape), dtype)
        self.graph.add_node(ir_op, inputs, [name + ":0"], attrs, self.loc(op), name=name)
        return name + ":0"

    def constant(self, op: tf.Operation, suffix: str, value: np.ndarray) -> str:
        self._fresh += 1
        name = f"{op.name}/{suffix}_{self._fresh}:0"
        self.graph.add_value(name, value.shape, ir_dtype(tf.as_dtype(value.dtype)))
        self.graph.constants[name] = value
        return name

    # -- metrics in a training graph -------------------------------------------------

    def _report_metrics(self, roots: list):
        """tf.compat.v1.metrics in a training graph's path: metrics belong in host_call (EVAL)."""
        metric_vars = {variable_name(v) for key in (_KEYS.LOCAL_VARIABLES, _KEYS.METRIC_VARIABLES)
                       for v in self.tf_graph.get_collection(key)}
        reported = set()
        for op in reachable([r for r in roots if r is not None]):
            if op.type not in ("VarHandleOp", "VariableV2"):
                continue
            if op.name not in metric_vars and "metrics" not in op.name.split("/"):
                continue
            metric = op.name.rsplit("/", 1)[0]
            if metric in reported:
                continue
            reported.add(metric)
            self.graph.issues.append({
                "kind": "metrics_in_training_graph",
                "message": (f"metric {metric!r} (tf.compat.v1.metrics) is part of the training graph; the device "
                            "runs no metrics while training: compute them in EVAL through host_call"),
                "loc": self.loc(op),
            })


def _drop_unused(graph, names: set[str]) -> None:
    """Drop the unrolled nodes nothing reads (the last step's counters, a final state the model
    does not use), then the values and constants of ``names`` nothing reads any more."""
    while True:
        read = {v for n in graph.nodes for v in n.inputs} | {graph.loss, *graph.outputs.values()}
        unused = {n.name for n in graph.nodes if n.name in names and not read & set(n.outputs)}
        if not unused:
            break
        graph.nodes = [n for n in graph.nodes if n.name not in unused]
    used = {v for n in graph.nodes for v in (*n.inputs, *n.outputs)} | {graph.loss, *graph.outputs.values()}
    for name in names - used:
        graph.values.pop(name, None)
        graph.constants.pop(name, None)
