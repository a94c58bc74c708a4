"""Loops and tensor lists: a ``tf.while_loop`` of a static length is unrolled into the IR.

Keras' ``LSTM`` and ``GRU`` (and any ``tf.while_loop``) are a ``While`` op whose condition and
body are functions in the graph's library, with the sequence read from and written to
TensorLists (``TensorListFromTensor``, ``TensorListGetItem``, ``TensorListSetItem``,
``TensorListStack``). The device runs one static graph, so a loop is unrolled:

    loop variable                  followed as
    the counters, the trip count   a number known at capture time (constants alone determine it)
    the state (h, c)               an IR value
    a TensorList                   a Python list of IR values, one per element (``TensorList``)
    a variable (kernel, bias)      the variable's IR value, read in the body

Before anything is emitted (``_trip``), each iteration's body is imported into a graph of
its own with the known numbers in place of their placeholders, and the condition is folded
the same way: it must be a known bool at every iteration. A loop whose condition depends on
the data (``tf.while_loop`` until a value read from the batch) is refused at the user's line.
Then each iteration's body is lowered by a child ``Lowering`` writing into the same IR graph,
with the frontend's own patterns and mappings: an op in the body the device lacks is
reported like any other, at the line of the loop (the body has no source lines of its own).

The numbers are the body's own ops, so they are the framework's: Keras' gate order,
activations and bias layout are whatever its cell wrote into the body.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

from device.capture import refused_tf
from device.capture.tf.constants import ConstantFolder
from device.capture.tf.lowering import Lowering
from device.capture.tf.plan import CannotMap, Plan, TensorList
from device.capture.tf.tensors import ir_dtype, static_shape

# more iterations than this is a loop that does not stop at capture time, not a sequence
MAX_ITERATIONS = 10_000

_WHILE = ("While", "StatelessWhile")
_LIST_OPS = ("TensorListReserve", "EmptyTensorList", "TensorListFromTensor", "TensorListGetItem",
             "TensorListSetItem", "TensorListPushBack", "TensorListStack", "TensorListLength")
LOOP_OPS = (*_WHILE, *_LIST_OPS)


def handles(low: Lowering, tensor: tf.Tensor) -> bool:
    """Whether this module lowers ``tensor``: a loop, a list op, or a list or variable passed on."""
    op = tensor.op
    if op.type in LOOP_OPS:
        return True
    return op.type == "Identity" and op.inputs[0].dtype in (tf.variant, tf.resource)


def plan(low: Lowering, tensor: tf.Tensor) -> Plan | None:
    """The Plan of a tensor ``handles`` accepts (None for any other): refused at the user's line if
    the loop or list is not static, also when that shows only while it is built (an element never
    written). The lowering tries it on every tensor first (its ``Rules.loop``)."""
    if not handles(low, tensor):
        return None
    try:
        planned = _plan(low, tensor)
    except CannotMap as reason:
        return refusal(low, tensor, str(reason), reason.form)

    def build():
        first, values = len(low.graph.nodes), set(low.graph.values)
        try:
            planned.build()
        except Exception as reason:  # noqa: BLE001 - never a traceback from capture: refused at the line
            del low.graph.nodes[first:]
            for name in set(low.graph.values) - values:
                del low.graph.values[name]
                low.graph.constants.pop(name, None)
            message = str(reason) if isinstance(reason, CannotMap) else \
                f"it could not be unrolled ({type(reason).__name__}: {reason})"
            _refuse(low, tensor, message, inherited=isinstance(reason, _Inherited), form=getattr(reason, "form", ""))
    return Plan(planned.deps, build)


class _Inherited(CannotMap):
    """Refused only because an input is (a list made by a refused op): reported where it starts."""


def refusal(low: Lowering, tensor: tf.Tensor, reason: str, form: str = "") -> Plan:
    """A refused loop or list op: one IR node named after the TF op, for validation to report."""
    return Plan([t for t in tensor.op.inputs if t.dtype != tf.variant], lambda: _refuse(low, tensor, reason,
                                                                                         form=form))


def _refuse(low: Lowering, tensor: tf.Tensor, reason: str, inherited: bool = False, form: str = "") -> None:
    """The node of a refused op, with the suggestion refused_tf keeps for its refused ``form``; its
    list and variable outputs are marked done with no value, so that what reads them is refused as
    inherited instead of named again."""
    op = tensor.op
    inputs = [low.value_of[t.name] for t in op.inputs if low.value_of.get(t.name) in low.graph.values]
    outputs = []
    for t in op.outputs:
        if t.name in low.value_of:
            continue
        if t.dtype in (tf.variant, tf.resource):
            low.value_of[t.name] = t.name
        else:
            outputs.append(t)
    attrs = {"reason": reason, **({"inherited": True} if inherited else {})}
    if not inherited and refused_tf.suggestion(op.type, form):
        attrs["suggestion"] = refused_tf.suggestion(op.type, form)
    low.emit(op.type, inputs, op, outputs, attrs)


def _plan(low: Lowering, tensor: tf.Tensor) -> Plan:
    op = tensor.op
    if op.type in _WHILE:
        return _plan_while(low, tensor)
    if op.type == "Identity":  # a list, or a variable, passed on
        source = op.inputs[0]

        def alias():
            low.value_of[tensor.name] = low.value(source)
            if source.name in low.lists:
                low.lists[tensor.name] = low.lists[source.name]
        return Plan([source], alias)
    return _LIST_PLANS[op.type](low, tensor)


# ------------------------------------------------------------------------------ lists


def _set_list(low: Lowering, tensor: tf.Tensor, items: TensorList) -> None:
    low.lists[tensor.name] = items
    low.value_of[tensor.name] = tensor.name  # lowered; the list itself lives in low.lists, not in the IR


def _list_of(low: Lowering, tensor: tf.Tensor) -> TensorList:
    if tensor.name not in low.lists:  # made by an op the device lacks: that op is the finding
        raise _Inherited("a TensorList made by an unsupported op")
    return low.lists[tensor.name]


def _index(low: Lowering, tensor: tf.Tensor, length: int) -> int:
    value = low.const(tensor)
    if value is None or value.size != 1:
        raise CannotMap("a TensorList index that depends on the data (the device runs a static graph)")
    index = int(value.reshape(()))
    if not -length <= index < length:
        raise CannotMap(f"TensorList index {index} out of range for {length} elements")
    return index % length


def _item(low: Lowering, items: TensorList, index: int, op: tf.Operation) -> str:
    item = items.items[index]
    if item is None:
        raise CannotMap(f"reads TensorList element {index}, which was never written")
    if isinstance(item, tuple):  # a row of the unstacked tensor, sliced out once
        if item not in items.rows:
            value, row = item
            shape = low.graph.values[value].shape
            begin, end = [row] + [0] * (len(shape) - 1), [row + 1] + list(shape[1:])
            part = low.aux("slice", [value], op, (1, *shape[1:]), low.graph.values[value].dtype,
                           {"begin": begin, "end": end, "step": [1] * len(shape)})
            items.rows[item] = low.aux("reshape", [part], op, shape[1:], low.graph.values[value].dtype,
                                       {"shape": list(shape[1:])})
        item = items.rows[item]
    return item


def _plan_reserve(low: Lowering, tensor: tf.Tensor) -> Plan:
    count = low.const(tensor.op.inputs[1])
    if count is None or count.size != 1 or int(count) < 0:
        raise CannotMap("a TensorList whose length depends on the data")
    return Plan([], lambda: _set_list(low, tensor, TensorList([None] * int(count))))


def _plan_empty(low: Lowering, tensor: tf.Tensor) -> Plan:
    return Plan([], lambda: _set_list(low, tensor, TensorList([])))


def _plan_push_back(low: Lowering, tensor: tf.Tensor) -> Plan:
    """Appends an element: tf.gradients makes the loop keep its intermediate values so (they are
    the backward's, which the device derives itself: nothing reads these lists in the IR)."""
    handle, item = tensor.op.inputs[0], tensor.op.inputs[1]

    def build():
        items = _list_of(low, handle).copy()
        items.items.append(low.value(item))
        _set_list(low, tensor, items)
    return Plan([handle, item], build)


def _plan_from_tensor(low: Lowering, tensor: tf.Tensor) -> Plan:
    source = tensor.op.inputs[0]
    if source.shape.rank is None or source.shape.rank == 0 or source.shape[0] is None:
        raise CannotMap("unstacking a tensor whose first dimension is unknown")
    rows = int(source.shape[0])
    return Plan([source], lambda: _set_list(low, tensor, TensorList([(low.value(source), i) for i in range(rows)])))


def _plan_get_item(low: Lowering, tensor: tf.Tensor) -> Plan:
    op = tensor.op
    handle = op.inputs[0]

    def build():
        items = _list_of(low, handle)
        low.value_of[tensor.name] = _item(low, items, _index(low, op.inputs[1], len(items.items)), op)
    return Plan([handle], build)


def _plan_set_item(low: Lowering, tensor: tf.Tensor) -> Plan:
    op = tensor.op
    handle, item = op.inputs[0], op.inputs[2]

    def build():
        items = _list_of(low, handle).copy()
        items.items[_index(low, op.inputs[1], len(items.items))] = low.value(item)
        _set_list(low, tensor, items)
    return Plan([handle, item], build)


def _plan_stack(low: Lowering, tensor: tf.Tensor) -> Plan:
    op = tensor.op
    handle = op.inputs[0]
    if not tensor.shape.is_fully_defined():
        raise CannotMap("stacking a TensorList of unknown shape")

    def build():
        items = _list_of(low, handle)
        element = static_shape(tensor)[1:]
        rows = [low.aux("reshape", [_item(low, items, i, op)], op, (1, *element), ir_dtype(tensor.dtype),
                        {"shape": [1, *element]}) for i in range(len(items.items))]
        low.emit("concat", rows, op, [tensor], {"axis": 0})
    return Plan([handle], build)


def _plan_length(low: Lowering, tensor: tf.Tensor) -> Plan:
    handle = tensor.op.inputs[0]

    def build():
        length = np.asarray(len(_list_of(low, handle).items), np.int32)
        low.value_of[tensor.name] = low.constant(tensor.op, "length", length)
        low.unrolled.add(low.value_of[tensor.name])
    return Plan([handle], build)


_LIST_PLANS = {"TensorListReserve": _plan_reserve, "EmptyTensorList": _plan_empty,
               "TensorListPushBack": _plan_push_back, "TensorListFromTensor": _plan_from_tensor,
               "TensorListGetItem": _plan_get_item, "TensorListSetItem": _plan_set_item,
               "TensorListStack": _plan_stack, "TensorListLength": _plan_length}


# ------------------------------------------------------------------------------ loops


@dataclass
class _Iteration:
    """One iteration's body, imported with the numbers known at capture time in place."""

    graph: tf.Graph
    inputs: list[tf.Tensor]  # the body's placeholders, in loop-variable order
    outputs: list[tf.Tensor]  # the next values of the loop variables
    reads: dict  # a read of a variable in the body -> the loop variable it reads
    known: list  # per loop variable: its number at the start of this iteration, or None


class _Function:
    """A function of the graph's library (a loop's body or condition), imported per iteration.

    A read of a variable passed into the loop (the kernel) becomes a placeholder of the
    variable's shape and dtype, bound to the variable's IR value: the body's shapes are then
    static, as the IR needs them (a read of a resource placeholder has no shape of its own).
    """

    def __init__(self, library: dict, name: str, loop: tf.Operation):
        if name not in library:
            raise CannotMap(f"the loop's function {name!r} is not in the graph")
        func = function_def_to_graph(library[name], input_shapes=[t.shape for t in loop.inputs])  # static
        self.graph_def = func.as_graph_def()
        self.inputs = [t.name for t in func.inputs]
        self.outputs = [t.name for t in func.outputs]
        self.dtypes = [t.dtype for t in func.inputs]
        handles = {t.op.name: _handle(source) for t, source in zip(func.inputs, loop.inputs)
                   if t.dtype == tf.resource}
        self.reads: dict[str, int] = {}  # node name of a read -> the loop variable it reads
        for node in self.graph_def.node:
            data = [i for i in node.input if not i.startswith("^")]
            if node.op != "ReadVariableOp" or not data or handles.get(data[0].split(":")[0]) is None:
                continue
            handle = handles[data[0].split(":")[0]]
            self.reads[node.name] = self.inputs.index(data[0] if ":" in data[0] else data[0] + ":0")
            node.op = "Placeholder"
            del node.input[:]
            node.attr["shape"].shape.CopyFrom(tf.TensorShape(handle.get_attr("shape")).as_proto())
            for key in [k for k in node.attr if k not in ("dtype", "shape")]:
                del node.attr[key]

    def instance(self, known: list, prefix: str) -> tuple[tf.Graph, list[tf.Tensor], list[tf.Tensor], dict]:
        """The function imported with the known numbers in place; its inputs, its outputs, and
        its reads of variables (tensor -> loop variable index)."""
        graph = tf.Graph()
        with graph.as_default():
            mapping = {name: tf.constant(value, dtype=dtype, name=f"{prefix}_known_{i}")
                       for i, (name, value, dtype) in enumerate(zip(self.inputs, known, self.dtypes))
                       if value is not None}
            tf.import_graph_def(self.graph_def, input_map=mapping, name=prefix)
        # an output that is an input passed on (the trip count) is its known number, if it has one
        out = [mapping[n] if n in mapping else graph.get_tensor_by_name(f"{prefix}/{n}") for n in self.outputs]
        reads = {graph.get_tensor_by_name(f"{prefix}/{n}:0"): index for n, index in self.reads.items()}
        return graph, [graph.get_tensor_by_name(f"{prefix}/{n}") for n in self.inputs], out, reads


def _handle(tensor: tf.Tensor):
    """The VarHandleOp a resource loop variable is (through Identity), else None."""
    while tensor.op.type == "Identity":
        tensor = tensor.op.inputs[0]
    return tensor.op if tensor.op.type == "VarHandleOp" else None


def _fold(graph: tf.Graph, tensors: list[tf.Tensor]) -> list:
    folder = ConstantFolder(graph, [])
    try:
        return [None if t.dtype in (tf.resource, tf.variant) else folder.value(t) for t in tensors]
    finally:
        folder.close()


def _trip(low: Lowering, op: tf.Operation) -> list[_Iteration]:
    """Every iteration of a static loop, with the numbers known at its start; CannotMap if the loop is not static."""
    library = {f.signature.name: f for f in low.tf_graph.as_graph_def().library.function}
    cond = _Function(library, op.get_attr("cond").name, op)
    body = _Function(library, op.get_attr("body").name, op)
    known = [None if t.dtype in (tf.resource, tf.variant) else low.const(t) for t in op.inputs]
    iterations = []
    while True:
        graph, _, (test,), _ = cond.instance(known, "cond")
        (go,) = _fold(graph, [test])
        if go is None:
            raise CannotMap("a loop whose condition depends on the data: the device runs a static number of "
                            "steps (a sequence of a fixed length, or a tf.while_loop that stops at a constant)",
                            form="data-dependent")
        if not bool(go):
            return iterations
        if len(iterations) == MAX_ITERATIONS:
            raise CannotMap(f"a loop that does not stop within {MAX_ITERATIONS} iterations")
        graph, inputs, outputs, reads = body.instance(known, f"{op.name}/iteration_{len(iterations)}")
        iterations.append(_Iteration(graph, inputs, outputs, reads, known))
        known = _fold(graph, outputs)


def _plan_while(low: Lowering, tensor: tf.Tensor) -> Plan:
    op = tensor.op
    if op.name not in low.trips:  # once per loop, whichever of its outputs is asked for first
        low.trips[op.name] = _trip(low, op)
    iterations = low.trips[op.name]
    static = [low.const(t) is not None for t in op.inputs]
    deps = [t for t, known in zip(op.inputs, static) if not known]

    def build():
        state = [low.lists[t.name] if t.name in low.lists else None if known else low.value(t)
                 for t, known in zip(op.inputs, static)]
        numbers = [None if t.dtype in (tf.resource, tf.variant) else low.const(t) for t in op.inputs]
        for iteration in iterations:
            state, numbers = _run_body(low, op, iteration, state)
        for out, value, number in zip(op.outputs, state, numbers):
            if isinstance(value, TensorList):
                _set_list(low, out, value)
            elif value is not None:
                low.value_of[out.name] = value
            elif number is not None:
                low.value_of[out.name] = low.constant(op, "final", np.asarray(number))
                low.unrolled.add(low.value_of[out.name])
    return Plan(deps, build)


def _run_body(low: Lowering, op: tf.Operation, iteration: _Iteration, state: list) -> tuple[list, list]:
    """Lower one iteration's body, its placeholders bound to the loop state; the next state."""
    child = type(low)(iteration.graph, [], None, low.updated, low.rules)
    child.graph, child.trainable, child.lists = low.graph, low.trainable, {}
    where = low.loc(op)
    child.loc = lambda body_op, label=None: dataclasses.replace(
        where, framework_op=label or body_op.type, call=refused_tf.CALLS.get(label or body_op.type, ""))
    child.unrolled = low.unrolled
    for placeholder, value, number in zip(iteration.inputs, state, iteration.known):
        if number is not None:
            continue  # a number: imported as a constant
        if isinstance(value, TensorList):
            _set_list(child, placeholder, value)
        elif value is not None:
            child.value_of[placeholder.name] = value
    for read, index in iteration.reads.items():
        child.value_of[read.name] = state[index]
    data = [t for t, number in zip(iteration.outputs, _fold(iteration.graph, iteration.outputs)) if number is None]
    first, values = len(low.graph.nodes), set(low.graph.values)
    try:
        child._lower(data)
    finally:
        child.close()
    low.unrolled.update(n.name for n in low.graph.nodes[first:])
    low.unrolled.update(set(low.graph.values) - values)  # outputs, and the constants the body read
    numbers = _fold(iteration.graph, iteration.outputs)
    state = [child.lists[t.name] if t.name in child.lists else child.value_of.get(t.name) if number is None else None
             for t, number in zip(iteration.outputs, numbers)]
    return state, numbers
