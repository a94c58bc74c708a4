"""Capture a TF1-style training graph (``tf.compat.v1.Graph``) as the device IR.

The TF runner rebuilds the Estimator contract on TF1 graph mode: the user's
``model_fn`` builds Keras 3 layers inside a ``tf.compat.v1.Graph`` and returns a loss
and ``train_op = optimizer.minimize(loss, global_step)``. ``capture`` walks that graph
backwards from the loss (and any outputs) to the batch inputs, the variables and the
constants, and lowers every forward op to ``device.ir``. The gradient and optimizer
subgraphs are not lowered: the runtime differentiates the IR itself; the optimizer is
read from the train_op's Apply ops into an ``OptimizerSpec``.

Lowering, TF op -> IR op (the order in which an op is tried: patterns first):

    patterns (several TF ops -> one IR op)
      Keras Dropout / tf.nn.dropout       SelectV2(uniform >= rate, x * 1/(1-rate), 0) -> dropout(rate)
      Keras Embedding                     GatherV2(table, SelectV2(ids < 0, ids + n, ids), 0) -> embedding
      Keras LayerNormalization            moments(keepdims) + rsqrt/mul/add -> layer_norm
      Keras BatchNormalization (training) moments + tf.nn.batch_normalization, with the moving-average
                                          assignments of its running stats in the graph -> batch_norm
      gelu (exact: erfc or erf form)      0.5 * x * erfc(-x / sqrt 2), 0.5 * x * (1 + erf(x / sqrt 2)) -> gelu("none")
      gelu (tanh form)                    0.5 * x * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -> gelu("tanh")
    one TF op -> one or a few IR ops
      AddV2 Add BiasAdd / Sub / Mul / RealDiv Div(float) / Maximum    add / sub / mul / div / maximum
      DivNoNan (denominator a nonzero constant)                      div
      AddN                                                          a chain of add
      Neg Exp Log Sqrt Rsqrt Square Relu Tanh Sigmoid Selu          the same name, lower case
      Elu / LeakyRelu                                               elu(alpha=1) / maximum(x, alpha * x)
      SquaredDifference                                             sub, square
      Pow (exponent 1, 2, 0.5, -0.5)                                identity, square, sqrt, rsqrt
      Identity Snapshot                                             identity
      StopGradient PreventGradient                                  identity {"stop_gradient": True}
      Softmax / LogSoftmax                                          softmax / log_softmax (last axis)
      SparseSoftmaxCrossEntropyWithLogits                           sparse_softmax_cross_entropy (output 0)
      SoftmaxCrossEntropyWithLogits                                 neg(reduce_sum(labels * log_softmax))
      Mean Sum Max                                                  reduce_mean reduce_sum reduce_max
      Reshape Squeeze ExpandDims                                    reshape (the static output shape)
      Transpose / ConcatV2 / StridedSlice (no ellipsis, new axis)   transpose / concat / slice (+ reshape)
      MatMul BatchMatMul{,V2,V3}                                    matmul (transpose_a/b, adj_x/y -> transpose)
      Einsum / Cast / ArgMax / Equal                                einsum / cast / argmax / equal
      Conv2D                                                        conv2d (layout NHWC or NCHW, weight HWIO)
      MaxPool AvgPool                                               max_pool2d avg_pool2d
      FusedBatchNorm{,V2,V3} training / inference                  batch_norm / its elementwise formula
      GatherV2 (axis 0) ResourceGather                              embedding
    sources
      a tensor in ``inputs``                                        graph.inputs
      ReadVariableOp(VarHandleOp), VariableV2                       graph.params (trainable and updated
                                                                    by train_op) or graph.state
      Const, and any stateless subgraph of constants                graph.constants (folded once)

Any other op becomes an IR node whose ``op`` is the TF op type (``"Unique"``,
``"Where"``), with its outputs' static shapes, so that validation reports every
unsupported op at once with its source line. A batch dimension of None stays None in
the value's shape (validation rejects it and names drop_remainder). Keras
BatchNormalization at inference (fixed statistics) stays elementwise on purpose: the
IR's batch_norm takes its statistics from the runtime's training flag.

Optimizer (``semantics="tf"``), from the Apply ops train_op runs, tf.cond branches
included (dynamic loss scaling wraps the update in one): ResourceApplyGradientDescent
-> sgd, ResourceApplyMomentum (use_nesterov) -> momentum, ResourceApplyAdam -> adam,
or adamw when a ``var -= lr * wd * var`` precedes it (common/tf/optim.py's
AdamWOptimizer); any other Apply op is a UserError. Hyper-parameters are the Apply
ops' constant inputs.

Weights move between a session and the emulator by TF variable name: read_weights /
read_state / write_weights, and read_optimizer_state / write_optimizer_state for the
slots (``<var>/Adam``, ``<var>/Adam_1``, ``<var>/Momentum``, Adam's beta powers), so
that a TF checkpoint of emulator weights resumes as the emulator would.
"""

from __future__ import annotations

import functools
import os
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from device import ir
from device.capture.frames import ZOO_DIRS
from device.dtypes import PRECISIONS
from device.optimizer import (DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, MAX_LOSS_SCALE, MIN_LOSS_SCALE,
                              OptimizerSpec)
from zoo_base.errors import UserError

_V1 = tf.compat.v1
_KEYS = _V1.GraphKeys

# tf.stop_gradient: the IR has no stop-gradient op, so it is an identity marked with this
# attribute; the runtime must not pass a gradient through a node that has it.
STOP_GRADIENT_ATTR = "stop_gradient"

# TF dtype name -> IR dtype; any other dtype keeps its TF name, which validation rejects
_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
           "int32": "int32", "int64": "int64", "bool": "bool"}

# Optimizer Apply ops -> (optimizer kind, {hyper-parameter: input index}). The sparse
# variants appear for embedding tables (IndexedSlices gradients). TF1's Adam updates a
# sparse gradient with scatter-adds (no Apply op), which equals its dense update.
_APPLY_OPS: dict[str, tuple[str, dict[str, int]]] = {
    "ApplyGradientDescent": ("sgd", {"lr": 1}),
    "ApplyMomentum": ("momentum", {"lr": 2, "momentum": 4}),
    "SparseApplyMomentum": ("momentum", {"lr": 2, "momentum": 5}),
    "ApplyAdam": ("adam", {"lr": 5, "beta1": 6, "beta2": 7, "eps": 8}),
}
# slots of each kind (named as device/runtime/optimizers.py names them) -> Apply-op input index
_SLOT_INPUTS = {"sgd": {}, "momentum": {"momentum": 1}, "adam": {"m": 1, "v": 2}}
_ADAM_POWERS = {"beta1_power": 3, "beta2_power": 4}

# how far a pattern's constant may be from its exact value: rounding in the tensor's dtype
# (Keras' mixed precision writes gelu's 1/sqrt(2) and dropout's 1/(1 - rate) in 16 bits)
_CONST_RTOL = {"float16": 2e-3, "bfloat16": 1e-2}

# ops whose value is never folded into a constant even when their inputs are constant
_NOT_FOLDABLE = {"Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "ReadVariableOp"}

# frames in these folders are library code; a node's source line is the innermost frame outside them
_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {
        sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
        os.path.dirname(tf.__file__), *ZOO_DIRS,
    })


def capture(graph: tf.Graph, *, inputs: list[tf.Tensor], loss: tf.Tensor | None,
            train_op: tf.Operation | None = None, outputs: dict[str, tf.Tensor] | None = None,
            precision: str = "float32", max_gradient_norm: float | None = None,
            max_gradient_value: float | None = None, loss_scale: float | str | None = None,
            initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE,
            steps_per_increase: int = DEFAULT_STEPS_PER_INCREASE, min_loss_scale: float = MIN_LOSS_SCALE,
            max_loss_scale: float = MAX_LOSS_SCALE,
            session: tf.compat.v1.Session | None = None) -> ir.Graph:
    """Lower the forward pass of ``graph`` (up to ``loss`` and ``outputs``) to the device IR.

    ``inputs`` are the batch tensors (features, labels: a ``get_next()``'s outputs or
    placeholders) in feed order. ``train_op`` (TRAIN only) gives the optimizer.
    ``session`` is used only to read optimizer hyper-parameters that are not graph
    constants (a learning-rate schedule: its value at the session's current step);
    without one, such a learning rate is left out of ``optimizer.hyper`` (the runner
    passes the rate to every step anyway) and any other non-constant one is an error.
    """
    if precision not in PRECISIONS:
        raise UserError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    if loss is None and not outputs:
        raise UserError("capture needs a loss or outputs: the graph has nothing to compute")
    if train_op is not None and not isinstance(train_op, tf.Operation):
        train_op = train_op.op  # a tensor, or the unread variable of global_step.assign_add
    with graph.as_default():
        # the ops train_op runs, tf.cond branches included (dynamic loss scaling wraps the update in one)
        views = _update_views(_reachable([train_op])) if train_op is not None else []
        updated = _updated_variables(views) if train_op is not None else None
        lowering = _Lowering(graph, inputs, train_op, updated)
        try:
            ir_graph = lowering.run(loss, outputs or {}, training=train_op is not None)
        finally:
            lowering.close()
        ir_graph.precision = precision
        if train_op is not None:
            ir_graph.optimizer = _optimizer_spec(views, train_op, list(ir_graph.params.values()), session)
            ir_graph.optimizer.max_gradient_norm = max_gradient_norm
            ir_graph.optimizer.max_gradient_value = max_gradient_value
            ir_graph.optimizer.loss_scale = loss_scale
            ir_graph.optimizer.initial_loss_scale = initial_loss_scale
            ir_graph.optimizer.steps_per_increase = steps_per_increase
            ir_graph.optimizer.min_loss_scale = min_loss_scale
            ir_graph.optimizer.max_loss_scale = max_loss_scale
    return ir_graph


# ---------------------------------------------------------------------------------
# weights and optimizer state between a session and the emulator
# ---------------------------------------------------------------------------------


def read_weights(session: tf.compat.v1.Session, graph_ir: ir.Graph) -> dict[str, np.ndarray]:
    """The IR's params in ``session``, by TF variable name (``Program(graph, weights)``'s weights)."""
    return read_variables(session, list(graph_ir.params.values()))


def read_state(session: tf.compat.v1.Session, graph_ir: ir.Graph) -> dict[str, np.ndarray]:
    """The IR's state (batch-norm running statistics) in ``session``, by TF variable name."""
    return read_variables(session, list(graph_ir.state.values()))


def write_weights(session: tf.compat.v1.Session, graph_ir: ir.Graph, weights: dict[str, np.ndarray]) -> None:
    """Assign ``weights`` (TF variable name -> array: params and/or state of ``graph_ir``,
    e.g. a Program's get_weights() and get_state()) in ``session``."""
    known = set(graph_ir.params.values()) | set(graph_ir.state.values())
    unknown = sorted(set(weights) - known)
    if unknown:
        raise UserError(f"weights {unknown} are not parameters or state of the captured graph")
    write_variables(session, weights)


def optimizer_slots(graph: tf.Graph, graph_ir: ir.Graph) -> dict[str, dict[str, str]]:
    """Where TF keeps the optimizer's state: {param name: {slot: TF variable name}}.

    Slots as the device's optimizer names them: "m" and "v" (Adam: ``<var>/Adam``,
    ``<var>/Adam_1``), "momentum" (``<var>/Momentum``). Found from the graph's Apply
    ops, so a renamed optimizer works too; Adam's sparse (embedding) updates have no
    Apply op, and their slots are found by TF's naming next to the others.
    """
    params = set(graph_ir.params.values())
    slots: dict[str, dict[str, str]] = {}
    suffixes: dict[str, str] = {}  # slot -> the suffix TF gave its variables ("Adam", "Adam_1")
    for view in _update_views(graph.get_operations()):
        entry = _apply_entry(view.type)
        var = _ref_variable(view.inputs[0]) if entry is not None else None
        if var not in params:
            continue
        names = {slot: _ref_variable(view.inputs[i]) for slot, i in _SLOT_INPUTS[entry[0]].items()}
        if None in names.values():
            continue
        slots[var] = names
        suffixes.update({slot: name[len(var) + 1:] for slot, name in names.items()})
    existing = {_variable_name(v) for v in _graph_variables(graph)}
    for var in params - set(slots):
        guessed = {slot: f"{var}/{suffix}" for slot, suffix in suffixes.items()}
        if guessed and all(name in existing for name in guessed.values()):
            slots[var] = guessed
    return slots


def read_optimizer_state(session: tf.compat.v1.Session, graph_ir: ir.Graph) -> dict:
    """The optimizer's state in ``session``, shaped like the device optimizer's state_dict():
    {param name: {slot: array}, "step": updates applied}.

    TF's Adam keeps no step count, only beta1_power = beta1 ** (step + 1): "step" comes
    from it while it is a normal float32 (a few hundred steps), then from the global step
    (which also counts the updates dynamic loss scaling skipped; by then beta1's bias
    correction is exactly 1 in float32 and beta2's changes by 1e-3 per step miscounted).
    """
    slots = optimizer_slots(session.graph, graph_ir)
    values = read_variables(session, [name for per_param in slots.values() for name in per_param.values()])
    state: dict = {param: {slot: values[name] for slot, name in slots.get(param, {}).items()}
                   for param in graph_ir.params.values()}
    global_step = _V1.train.get_global_step(session.graph)
    state["step"] = int(session.run(global_step)) if global_step is not None else 0
    powers = _adam_powers(session.graph)
    if graph_ir.optimizer is not None and graph_ir.optimizer.kind in ("adam", "adamw") and powers:
        b1_power = float(read_variables(session, [powers[0]])[powers[0]])
        if b1_power > 1e-30:
            state["step"] = round(np.log(b1_power) / np.log(graph_ir.optimizer.hyper["beta1"])) - 1
    return state


def write_optimizer_state(session: tf.compat.v1.Session, graph_ir: ir.Graph, state: dict) -> None:
    """Assign optimizer state shaped like ``read_optimizer_state``'s result in ``session``.

    For Adam, beta1_power and beta2_power are set to the float32 running products TF
    would hold after ``state["step"]`` updates. The global step is the runner's to set.
    """
    slots = optimizer_slots(session.graph, graph_ir)
    values = {}
    for param, per_param in state.items():
        if not isinstance(per_param, dict) or not per_param:  # "step", "loss_scale"; sgd's empty slots
            continue
        if param not in slots:
            raise UserError(f"optimizer state for {param!r}, for which the graph's optimizer has no slots")
        for slot, array in per_param.items():
            if slot not in slots[param]:
                raise UserError(f"optimizer slot {slot!r} of {param!r} does not exist in the graph "
                                f"(slots: {sorted(slots[param])})")
            values[slots[param][slot]] = array
    spec = graph_ir.optimizer
    powers = _adam_powers(session.graph)
    if spec is not None and spec.kind in ("adam", "adamw") and powers:
        b1_power, b2_power = np.float32(spec.hyper["beta1"]), np.float32(spec.hyper["beta2"])
        for _ in range(int(state.get("step", 0))):  # TF multiplies them once per update, in float32
            b1_power, b2_power = b1_power * np.float32(spec.hyper["beta1"]), b2_power * np.float32(spec.hyper["beta2"])
        values[powers[0]], values[powers[1]] = b1_power, b2_power
    write_variables(session, values)


def _adam_powers(graph: tf.Graph) -> tuple[str, str] | None:
    """The names of Adam's beta1_power and beta2_power variables, if the graph has an Adam."""
    for view in _update_views(graph.get_operations()):
        entry = _apply_entry(view.type)
        if entry is not None and entry[0] == "adam":
            names = tuple(_ref_variable(view.inputs[i]) for i in _ADAM_POWERS.values())
            if None not in names:
                return names
    return None


def read_variables(session: tf.compat.v1.Session, names: list[str]) -> dict[str, np.ndarray]:
    """The values of TF variables by name (as tf.compat.v1.global_variables() names them, no ":0")."""
    variables = _variables_by_name(session.graph, names)
    return session.run({name: variables[name] for name in names}) if names else {}


def write_variables(session: tf.compat.v1.Session, values: dict[str, np.ndarray]) -> None:
    """Assign TF variables by name in one session run.

    Runs each variable's initializer with its initial value fed: no op is added, so this
    works on a finalized graph (MonitoredSession) too.
    """
    variables = _variables_by_name(session.graph, list(values))
    feed, fetch = {}, []
    for name, array in values.items():
        var = variables[name]
        array = np.asarray(array)
        shape = tuple(var.shape.as_list())
        if array.shape != shape:
            raise UserError(f"value for variable {name!r} has shape {array.shape}, the variable has {shape}")
        feed[var.initializer.inputs[1]] = array.astype(var.dtype.base_dtype.as_numpy_dtype, copy=False)
        fetch.append(var.initializer)
    if fetch:
        session.run(fetch, feed_dict=feed)


def _graph_variables(graph: tf.Graph) -> list:
    seen, result = set(), []
    for key in (_KEYS.GLOBAL_VARIABLES, _KEYS.LOCAL_VARIABLES, _KEYS.METRIC_VARIABLES):
        for var in graph.get_collection(key):
            if id(var) not in seen:
                seen.add(id(var))
                result.append(var)
    return result


def _variables_by_name(graph: tf.Graph, names: list[str]) -> dict:
    variables = {_variable_name(v): v for v in _graph_variables(graph)}
    missing = [n for n in names if n not in variables]
    if missing:
        raise UserError(f"variables {missing} are not variables of the session's graph")
    return variables


def _variable_name(var_or_tensor) -> str:
    """``dense/kernel`` for a variable, its handle tensor or a read of it."""
    op = var_or_tensor.op
    if op.type == "ReadVariableOp":
        op = op.inputs[0].op
    return op.name


# ---------------------------------------------------------------------------------
# the optimizer
# ---------------------------------------------------------------------------------


def _apply_entry(op_type: str):
    """(kind, hyper input indices) for an Apply op type (with or without Resource), else None."""
    base = op_type[len("Resource"):] if op_type.startswith("Resource") else op_type
    return _APPLY_OPS.get(base)


def _is_apply_op(op_type: str) -> bool:
    base = op_type[len("Resource"):] if op_type.startswith("Resource") else op_type
    return base.startswith(("Apply", "SparseApply"))


def _reachable(roots: list) -> list[tf.Operation]:
    """Every op the roots depend on, through data and control inputs."""
    seen: set[str] = set()
    order: list[tf.Operation] = []
    stack = [r.op if isinstance(r, tf.Tensor) else r for r in roots]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        order.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return order


@dataclass
class _FnNode:
    """A node of a function body (a tf.cond branch: the train_op of dynamic loss scaling)."""

    node: Any  # NodeDef
    resolve: Callable[[str], Any]  # an input string of the body -> a ref


# A ref is what an op input is: a tf.Tensor of the graph, an _FnNode output, or None
# (a function argument that does not lead back to the graph).


@dataclass
class _View:
    """An op of the graph or of a function body, seen the same way."""

    type: str
    name: str
    use_nesterov: bool
    inputs: list  # refs


def _graph_view(op: tf.Operation) -> _View:
    nesterov = _is_apply_op(op.type) and "use_nesterov" in op.node_def.attr and bool(op.get_attr("use_nesterov"))
    return _View(op.type, op.name, nesterov, list(op.inputs))


def _ref_type(ref) -> str | None:
    if isinstance(ref, tf.Tensor):
        return ref.op.type
    return ref.node.op if isinstance(ref, _FnNode) else None


def _ref_input(ref, index: int):
    if isinstance(ref, tf.Tensor):
        return ref.op.inputs[index]
    return ref.resolve(ref.node.input[index])


def _ref_name(ref) -> str | None:
    if isinstance(ref, tf.Tensor):
        return ref.name
    return ref.node.name if isinstance(ref, _FnNode) else None


def _ref_variable(ref) -> str | None:
    """The variable a ref is (a handle) or reads, else None."""
    kind = _ref_type(ref)
    if kind == "ReadVariableOp":
        return _ref_variable(_ref_input(ref, 0))
    if kind in ("VarHandleOp", "VariableV2") and isinstance(ref, tf.Tensor):
        return ref.op.name
    return None


def _ref_value(ref, session) -> float | None:
    """A ref's value if it is a constant (or, with a session, computable), else None."""
    if isinstance(ref, tf.Tensor):
        return _hyper_value(ref, session)
    kind = _ref_type(ref)
    if kind == "Const":
        return _f32(tf.make_ndarray(ref.node.attr["value"].tensor))
    if kind in ("Cast", "Identity"):
        return _ref_value(_ref_input(ref, 0), session)
    return None


def _hyper_value(tensor: tf.Tensor, session) -> float | None:
    value = tf.get_static_value(tensor)
    if value is None and session is not None:
        try:
            value = session.run(tensor)
        except (tf.errors.OpError, ValueError, TypeError):
            value = None
    return None if value is None else _f32(value)


def _f32(value) -> float:
    """A float32 number as the shortest decimal that rounds to it (0.001, not 0.0010000000474974513)."""
    return _shortest(value, np.float32)


def _shortest(value, dtype) -> float:
    """The shortest decimal that rounds to the same ``dtype`` number as ``value``
    (0.1 for bfloat16's 0.10009765625: the number the user wrote)."""
    target = np.asarray(value).astype(dtype)
    for digits in range(1, 18):
        short = float(f"{float(target):.{digits}g}")
        if np.asarray(short).astype(dtype) == target:
            return short
    return float(target)


# function-calling ops -> (attributes naming the functions, index of the op input that is argument 0)
_CALLS = {"If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
          "PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0)}


def _function_views(graph: tf.Graph, call: tf.Operation | _FnNode, args: list, library: dict,
                    depth: int = 0) -> list[_View]:
    """The ops inside the functions that ``call`` runs, ``args`` being its arguments' refs."""
    attrs_of = call.node_def.attr if isinstance(call, tf.Operation) else call.node.attr
    names, _ = _CALLS[call.type if isinstance(call, tf.Operation) else call.node.op]
    views = []
    for attr in names:
        fdef = library.get(attrs_of[attr].func.name)
        if fdef is None or depth > 4:
            continue
        env = {a.name: (args[i] if i < len(args) else None) for i, a in enumerate(fdef.signature.input_arg)}
        resolve = _resolver(env, {n.name: n for n in fdef.node_def})
        for n in fdef.node_def:
            data = [resolve(i) for i in n.input if not i.startswith("^")]
            nesterov = "use_nesterov" in n.attr and n.attr["use_nesterov"].b
            views.append(_View(n.op, n.name, nesterov, data))
            if n.op in _CALLS:
                inner = data[_CALLS[n.op][1]:]
                views += _function_views(graph, _FnNode(n, resolve), inner, library, depth + 1)
    return views


def _resolver(env: dict, nodes: dict) -> Callable[[str], Any]:
    """Input string of a function body ("name:output:0", an argument's name) -> its ref."""
    def resolve(spec: str):
        name = spec.lstrip("^").split(":")[0]
        if name in env:
            return env[name]
        return _FnNode(nodes[name], resolve) if name in nodes else None
    return resolve


def _update_views(ops: list[tf.Operation]) -> list[_View]:
    """Every op among ``ops`` and inside the functions they call (tf.cond branches)."""
    views = [_graph_view(op) for op in ops]
    calls = [op for op in ops if op.type in _CALLS]
    if calls:
        library = {f.signature.name: f for f in calls[0].graph.as_graph_def().library.function}
        for op in calls:
            views += _function_views(op.graph, op, list(op.inputs)[_CALLS[op.type][1]:], library)
    return views


def _updated_variables(views: list[_View]) -> set[str] | None:
    """Names of the variables train_op writes (Apply ops, the scatter-adds and assignments
    of sparse updates); None if an Apply op's variable cannot be traced (then every
    trainable variable counts as updated)."""
    names = set()
    for view in views:
        if view.inputs and (_is_apply_op(view.type) or view.type.startswith(("ResourceScatter", "Assign"))):
            name = _ref_variable(view.inputs[0])
            if name is None and _is_apply_op(view.type):
                return None
            names.add(name)
    return names


def _decoupled_decay(apply: _View, views: list[_View], session) -> float | None:
    """AdamW's weight decay of ``apply``'s variable: wd of a ``var -= lr * wd * var`` that
    train_op runs (common/tf/optim.py's AdamWOptimizer, just before the Adam update)."""
    var = _ref_variable(apply.inputs[0])
    lr_name = _ref_name(apply.inputs[_APPLY_OPS["ApplyAdam"][1]["lr"]])
    for view in views:
        if view.type != "AssignSubVariableOp" or _ref_variable(view.inputs[0]) != var:
            continue
        wd, seen, stack = 1.0, set(), [view.inputs[1]]
        while stack:
            ref = stack.pop()
            if _ref_type(ref) == "Mul":
                stack += [_ref_input(ref, 0), _ref_input(ref, 1)]
            elif _ref_variable(ref) == var or _ref_name(ref) == lr_name:
                seen.add("var" if _ref_variable(ref) == var else "lr")
            else:
                value = _ref_value(ref, session)
                if value is None:
                    break
                wd *= value
        else:
            if seen == {"var", "lr"}:
                return _f32(wd)
    return None


def _optimizer_spec(views: list[_View], train_op: tf.Operation, params: list[str], session) -> OptimizerSpec:
    """The update rule of ``train_op``, read from its Apply ops ("tf" semantics)."""
    applies = [v for v in views if _is_apply_op(v.type)]
    unknown = sorted({v.type for v in applies if _apply_entry(v.type) is None})
    if unknown:
        raise UserError(f"optimizer op(s) {', '.join(unknown)} in train_op {train_op.name!r} are not supported "
                        "on the device: use GradientDescentOptimizer, MomentumOptimizer or AdamOptimizer")
    if not applies:
        raise UserError(f"train_op {train_op.name!r} updates no variable with an optimizer Apply op "
                        "(expected optimizer.minimize(loss, global_step))")
    kinds = sorted({_apply_entry(v.type)[0] for v in applies})
    if len(kinds) > 1:
        raise UserError(f"train_op {train_op.name!r} mixes optimizers ({', '.join(kinds)}); the device runs one")
    kind = kinds[0]
    first = min(applies, key=lambda v: v.name)
    hyper: dict[str, float] = {}
    for key, index in _apply_entry(first.type)[1].items():
        value = _ref_value(first.inputs[index], session)
        if value is None:
            if key == "lr":
                continue  # a schedule: the runner passes the rate to every step
            raise UserError(f"optimizer {key} of {first.name!r} is not a constant; pass the session to capture "
                            "so that it can be read")
        hyper[key] = value
    if kind == "momentum":
        hyper["nesterov"] = float(first.use_nesterov)
    if kind == "adam" and first.use_nesterov:
        raise UserError(f"{first.name!r}: Adam with use_nesterov is not supported on the device")
    spec = OptimizerSpec(kind=kind, semantics="tf", hyper=hyper)
    if kind == "adam":
        decays = {_ref_variable(v.inputs[0]): _decoupled_decay(v, views, session) for v in applies}
        rates = {wd for wd in decays.values() if wd is not None}
        if len(rates) > 1:
            raise UserError(f"train_op {train_op.name!r} decays weights at different rates {sorted(rates)}; "
                            "the device's adamw has one weight_decay")
        if rates:
            spec.kind = "adamw"
            spec.hyper["weight_decay"] = rates.pop()
            # the runtime excludes a param when an entry is a substring of its name (ignoring
            # case, device/optimizer.py): full names
            spec.weight_decay_exclude = tuple(sorted(p for p in params if decays.get(p) is None))
    return spec


# ---------------------------------------------------------------------------------
# lowering the forward graph
# ---------------------------------------------------------------------------------


class _CannotMap(Exception):
    """An op that is normally lowered cannot be here (a non-constant attribute input)."""


@dataclass
class _Plan:
    deps: list  # tf.Tensors that must have IR values first
    build: Callable[[], None]  # emits the IR nodes, once every dep has a value


def _shape(tensor: tf.Tensor) -> tuple:
    """Static shape; None marks an unknown dimension (an unknown rank is one unknown dimension)."""
    if tensor.shape.rank is None:
        return (None,)
    return tuple(tensor.shape.as_list())


def _dtype(dtype: tf.DType) -> str:
    return _DTYPES.get(dtype.base_dtype.name, dtype.base_dtype.name)


def _loc_of(op: tf.Operation, framework_op: str | None = None) -> ir.SourceLoc:
    """The op's innermost stack frame in the user's code (outside TF, Keras, common/ and device/)."""
    for frame in reversed(op.traceback):
        if not _is_library(frame.filename):
            return ir.SourceLoc(framework_op or op.type, frame.filename, frame.lineno)
    return ir.SourceLoc(framework_op or op.type)


@functools.lru_cache(maxsize=None)
def _is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(_LIBRARY_DIRS)


def _pairs(op: tf.Operation):
    """Both orders of a binary op's operands (for commutative patterns)."""
    a, b = op.inputs[0], op.inputs[1]
    return ((a, b), (b, a))


def _is(tensor: tf.Tensor, *types: str) -> bool:
    return tensor.op.type in types


def _same(a: tf.Tensor, b: tf.Tensor) -> bool:
    return a.name == b.name


def _same_op(a: tf.Operation | None, b: tf.Operation | None) -> bool:
    return a is not None and b is not None and a.name == b.name


class _Lowering:
    def __init__(self, graph: tf.Graph, inputs: list[tf.Tensor], train_op: tf.Operation | None,
                 updated: set[str] | None):
        self.tf_graph = graph
        self.graph = ir.Graph(frontend="tf")
        self.inputs = {t.name: t for t in inputs}
        self.value_of: dict[str, str] = {}  # TF tensor name -> IR value name
        self.plans: dict[str, _Plan] = {}
        self.train_op = train_op
        self.trainable = {_variable_name(v) for v in graph.get_collection(_KEYS.TRAINABLE_VARIABLES)}
        self.updated = updated  # variables train_op writes; None: every trainable one
        self.foldable: dict[str, bool] = {}
        self.const_cache: dict[str, np.ndarray | None] = {}
        self._session = None  # for folding constant subgraphs that get_static_value cannot
        self._moving: dict[str, tuple[tf.Operation, float]] | None = None  # see _moving_averages
        self._fresh = 0
        self.locs: dict[str, ir.SourceLoc] = {}
        self.mappers: dict[str, Callable[[tf.Tensor], _Plan]] = self._mapper_table()
        self.patterns: dict[str, list[Callable[[tf.Tensor], _Plan | None]]] = {
            "SelectV2": [self._match_dropout], "Select": [self._match_dropout],
            "GatherV2": [self._match_gather], "ResourceGather": [self._match_gather],
            "AddV2": [self._match_norm], "Add": [self._match_norm],
            "Mul": [self._match_gelu],
        }

    def close(self):
        if self._session is not None:
            self._session.close()

    # -- driver ---------------------------------------------------------------

    def run(self, loss, outputs: dict[str, tf.Tensor], training: bool) -> ir.Graph:
        for tensor in self.inputs.values():
            self.graph.add_value(tensor.name, _shape(tensor), _dtype(tensor.dtype))
            self.graph.inputs.append(tensor.name)
            self.value_of[tensor.name] = tensor.name
        targets = ([loss] if loss is not None else []) + list(outputs.values())
        self._lower(targets)
        if loss is not None:
            self.graph.loss = self.value_of[loss.name]
        self.graph.outputs = {key: self.value_of[t.name] for key, t in outputs.items()}
        if training:
            self._report_metrics(targets + [self.train_op])
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

    def _plan(self, tensor: tf.Tensor) -> _Plan:
        op = tensor.op
        if any(t.shape.rank is None for t in [*op.inputs, tensor]):
            return self._unsupported(tensor, "a tensor of unknown rank")
        for match in self.patterns.get(op.type, ()):
            plan = match(tensor)
            if plan is not None:
                return plan
        mapper = self.mappers.get(op.type)
        if mapper is not None:
            try:
                return mapper(tensor)
            except _CannotMap as reason:
                return self._unsupported(tensor, str(reason))
        return self._unsupported(tensor)

    def _unsupported(self, tensor: tf.Tensor, reason: str = "") -> _Plan:
        """A node named after the TF op type, for validation to report."""
        op = tensor.op
        data = [t for t in op.inputs]

        def build():
            outs = [t for t in op.outputs if t.name not in self.value_of]
            attrs = {"reason": reason} if reason else {}
            self._emit(op.type, [self.value_of[t.name] for t in data], op, outs, attrs)
        return _Plan(data, build)

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
            self.value_of[tensor.name] = self._variable(handle)
            return True
        value = self._const(tensor)
        if value is None:
            return False
        self.graph.add_value(tensor.name, _shape(tensor) if tensor.shape.is_fully_defined() else value.shape,
                             _dtype(tensor.dtype))
        self.graph.constants[tensor.name] = value
        self.value_of[tensor.name] = tensor.name
        return True

    def _variable(self, handle: tf.Operation) -> str:
        """The IR value of a variable: named as TF names it, a param if trained, else state."""
        name = handle.name
        if name not in self.graph.values:
            if handle.type == "VarHandleOp":
                shape = tuple(tf.TensorShape(handle.get_attr("shape")).as_list())
                dtype = _dtype(handle.get_attr("dtype"))
            else:
                shape, dtype = _shape(handle.outputs[0]), _dtype(handle.outputs[0].dtype)
            self.graph.add_value(name, shape, dtype)
            trained = name in self.trainable and (self.updated is None or name in self.updated)
            (self.graph.params if trained else self.graph.state)[name] = name
        return name

    def _const(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of a tensor computable from constants alone (folded), else None."""
        if tensor.name in self.const_cache:
            return self.const_cache[tensor.name]
        value = None
        if tensor.name not in self.inputs and tensor.dtype != tf.resource:
            if tensor.op.type in ("Const", "Shape", "Size", "Rank"):
                value = tf.get_static_value(tensor)
            elif tensor.op.type in ("ZerosLike", "OnesLike") and tensor.shape.is_fully_defined():
                # depends on its input's shape only, which is static
                fill = np.zeros if tensor.op.type == "ZerosLike" else np.ones
                value = fill(tensor.shape.as_list(), tensor.dtype.as_numpy_dtype)
            if value is None and tensor.op.type != "Const" and self._is_foldable(tensor.op):
                value = tf.get_static_value(tensor)
                if value is None:
                    value = self._fold_session().run(tensor)
        value = None if value is None else np.asarray(value)
        self.const_cache[tensor.name] = value
        return value

    def _is_foldable(self, op: tf.Operation) -> bool:
        """Stateless and fed by constants only (iterative: constant subgraphs can be long)."""
        stack = [op]
        while stack:
            current = stack[-1]
            if current.name in self.foldable:
                stack.pop()
                continue
            # control inputs are ignored: they order execution, a stateless op's value does not depend on them
            if (current.type in _NOT_FOLDABLE or current.op_def.is_stateful
                    or any(t.name in self.inputs or t.dtype in (tf.resource, tf.variant) for t in current.inputs)):
                self.foldable[current.name] = False
                stack.pop()
                continue
            pending = [t.op for t in current.inputs if t.op.name not in self.foldable]
            if pending:
                stack.extend(pending)
                continue
            self.foldable[current.name] = all(self.foldable[t.op.name] for t in current.inputs)
            stack.pop()
        return self.foldable[op.name]

    def _fold_session(self):
        if self._session is None:
            self._session = _V1.Session(graph=self.tf_graph)
        return self._session

    def _attr(self, tensor: tf.Tensor, what: str) -> np.ndarray:
        """A constant input that an IR attribute needs (axes, shape, perm)."""
        value = self._const(tensor)
        if value is None:
            raise _CannotMap(f"{what} is not a constant")
        return value

    def _scalar(self, tensor: tf.Tensor) -> float | None:
        value = self._const(tensor)
        if value is None or value.size != 1:
            return None
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            return None  # a complex or string constant: no pattern's number, and validation names its dtype
        if tensor.dtype.is_floating:
            return _shortest(value.reshape(()), tensor.dtype.as_numpy_dtype)
        return float(value.reshape(()))

    def _is_const(self, tensor: tf.Tensor, expected: float, rtol: float | None = None) -> bool:
        """Whether ``tensor`` is the constant ``expected`` up to rounding in its dtype."""
        value = self._scalar(tensor)
        rtol = rtol if rtol is not None else _CONST_RTOL.get(tensor.dtype.base_dtype.name, 1e-4)
        return value is not None and bool(np.isclose(value, expected, rtol=rtol, atol=0.0))

    # -- emitting -----------------------------------------------------------------

    def _loc(self, op: tf.Operation, label: str | None = None) -> ir.SourceLoc:
        key = f"{op.name}|{label}"
        if key not in self.locs:
            self.locs[key] = _loc_of(op, label)
        return self.locs[key]

    def _v(self, tensor: tf.Tensor) -> str:
        return self.value_of[tensor.name]

    def _emit(self, ir_op: str, inputs: list[str], op: tf.Operation, outputs: list[tf.Tensor], attrs=None,
              label: str | None = None) -> None:
        """One IR node whose outputs are the given TF tensors; ``label`` names a pattern's framework op."""
        for t in outputs:
            self.graph.add_value(t.name, _shape(t), _dtype(t.dtype))
            self.value_of[t.name] = t.name
        self.graph.add_node(ir_op, inputs, [t.name for t in outputs], attrs, self._loc(op, label), name=op.name)

    def _aux(self, ir_op: str, inputs: list[str], op: tf.Operation, shape, dtype: str, attrs=None) -> str:
        """One IR node with a fresh output value (a step of an op lowered to several nodes)."""
        self._fresh += 1
        name = f"{op.name}/{ir_op}_{self._fresh}"
        self.graph.add_value(name + ":0", tuple(shape), dtype)
        self.graph.add_node(ir_op, inputs, [name + ":0"], attrs, self._loc(op), name=name)
        return name + ":0"

    def _constant(self, op: tf.Operation, suffix: str, value: np.ndarray) -> str:
        self._fresh += 1
        name = f"{op.name}/{suffix}_{self._fresh}:0"
        self.graph.add_value(name, value.shape, _dtype(tf.as_dtype(value.dtype)))
        self.graph.constants[name] = value
        return name

    # -- one TF op -> IR ------------------------------------------------------------

    def _mapper_table(self) -> dict[str, Callable[[tf.Tensor], _Plan]]:
        simple = {
            "AddV2": "add", "Add": "add", "Sub": "sub", "Mul": "mul", "RealDiv": "div", "Maximum": "maximum",
            "Neg": "neg", "Exp": "exp", "Erf": "erf", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Square": "square",
            "Identity": "identity", "Snapshot": "identity", "Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid",
            "Selu": "selu", "Equal": "equal",
        }
        table: dict[str, Callable[[tf.Tensor], _Plan]] = {k: self._simple(v) for k, v in simple.items()}
        table.update({
            "StopGradient": self._map_stop_gradient, "PreventGradient": self._map_stop_gradient,
            "Div": self._map_div, "DivNoNan": self._map_div_no_nan, "AddN": self._map_add_n,
            "BiasAdd": self._map_bias_add, "Elu": self._map_elu, "LeakyRelu": self._map_leaky_relu,
            "SquaredDifference": self._map_squared_difference, "Pow": self._map_pow,
            "Softmax": self._map_softmax, "LogSoftmax": self._map_softmax,
            "SparseSoftmaxCrossEntropyWithLogits": self._map_sparse_xent,
            "SoftmaxCrossEntropyWithLogits": self._map_xent,
            "Mean": self._map_reduce, "Sum": self._map_reduce, "Max": self._map_reduce,
            "Reshape": self._map_reshape, "Squeeze": self._map_reshape, "ExpandDims": self._map_reshape,
            "Transpose": self._map_transpose, "ConcatV2": self._map_concat, "StridedSlice": self._map_strided_slice,
            "MatMul": self._map_matmul, "BatchMatMul": self._map_matmul, "BatchMatMulV2": self._map_matmul,
            "BatchMatMulV3": self._map_matmul, "Einsum": self._map_einsum, "Cast": self._map_cast,
            "ArgMax": self._map_argmax, "Conv2D": self._map_conv2d, "MaxPool": self._map_pool,
            "AvgPool": self._map_pool, "FusedBatchNorm": self._map_fused_batch_norm,
            "FusedBatchNormV2": self._map_fused_batch_norm, "FusedBatchNormV3": self._map_fused_batch_norm,
        })
        return table

    def _simple(self, ir_op: str):
        def plan(tensor: tf.Tensor) -> _Plan:
            op = tensor.op
            return _Plan(list(op.inputs), lambda: self._emit(ir_op, [self._v(t) for t in op.inputs], op, [tensor]))
        return plan

    def _map_stop_gradient(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        return _Plan([x], lambda: self._emit("identity", [self._v(x)], op, [tensor], {STOP_GRADIENT_ATTR: True}))

    def _map_div(self, tensor):
        if not tensor.dtype.is_floating:
            raise _CannotMap("integer division")
        return self._simple("div")(tensor)

    def _map_div_no_nan(self, tensor):
        denominator = self._const(tensor.op.inputs[1])
        if denominator is None or np.any(denominator == 0):
            raise _CannotMap("the denominator is not a nonzero constant")
        return self._simple("div")(tensor)

    def _map_add_n(self, tensor):
        op = tensor.op
        terms = list(op.inputs)

        def build():
            acc = self._v(terms[0])
            for t in terms[1:-1]:
                acc = self._aux("add", [acc, self._v(t)], op, _shape(tensor), _dtype(tensor.dtype))
            if len(terms) == 1:
                self._emit("identity", [acc], op, [tensor])
            else:
                self._emit("add", [acc, self._v(terms[-1])], op, [tensor])
        return _Plan(terms, build)

    def _map_bias_add(self, tensor):
        op = tensor.op
        x, bias = op.inputs

        def build():
            b = self._v(bias)
            if op.get_attr("data_format") == b"NCHW" and x.shape.rank > 2:
                # bias (C,) -> (C, 1, ..., 1) so that it broadcasts over N C H W
                shape = [bias.shape[0]] + [1] * (x.shape.rank - 2)
                b = self._aux("reshape", [b], op, shape, _dtype(bias.dtype), {"shape": shape})
            self._emit("add", [self._v(x), b], op, [tensor])
        return _Plan([x, bias], build)

    def _map_elu(self, tensor):
        op = tensor.op
        return _Plan([op.inputs[0]], lambda: self._emit("elu", [self._v(op.inputs[0])], op, [tensor], {"alpha": 1.0}))

    def _map_leaky_relu(self, tensor):
        op = tensor.op
        alpha = _f32(op.get_attr("alpha"))
        if not 0.0 <= alpha <= 1.0:
            raise _CannotMap("alpha outside [0, 1]")
        x = op.inputs[0]

        def build():
            # leaky_relu(x) = max(x, alpha * x) for 0 <= alpha <= 1
            a = self._constant(op, "alpha", np.asarray(alpha, dtype=x.dtype.as_numpy_dtype))
            scaled = self._aux("mul", [self._v(x), a], op, _shape(x), _dtype(x.dtype))
            self._emit("maximum", [self._v(x), scaled], op, [tensor])
        return _Plan([x], build)

    def _map_squared_difference(self, tensor):
        op = tensor.op
        a, b = op.inputs

        def build():
            diff = self._aux("sub", [self._v(a), self._v(b)], op, _shape(tensor), _dtype(tensor.dtype))
            self._emit("square", [diff], op, [tensor])
        return _Plan([a, b], build)

    def _map_pow(self, tensor):
        op = tensor.op
        exponent = self._scalar(op.inputs[1])
        ir_op = {1.0: "identity", 2.0: "square", 0.5: "sqrt", -0.5: "rsqrt"}.get(exponent)
        if ir_op is None:
            raise _CannotMap("the exponent is not a constant 1, 2, 0.5 or -0.5")
        x = op.inputs[0]
        return _Plan([x], lambda: self._emit(ir_op, [self._v(x)], op, [tensor]))

    def _map_softmax(self, tensor):
        op = tensor.op
        ir_op = "softmax" if op.type == "Softmax" else "log_softmax"
        axis = tensor.shape.rank - 1
        return _Plan([op.inputs[0]], lambda: self._emit(ir_op, [self._v(op.inputs[0])], op, [tensor], {"axis": axis}))

    def _map_sparse_xent(self, tensor):
        op = tensor.op
        if tensor.value_index != 0:
            raise _CannotMap("the backprop output is not part of a forward pass")
        logits, labels = op.inputs
        return _Plan([logits, labels], lambda: self._emit("sparse_softmax_cross_entropy",
                                                          [self._v(logits), self._v(labels)], op, [tensor]))

    def _map_xent(self, tensor):
        op = tensor.op
        if tensor.value_index != 0:
            raise _CannotMap("the backprop output is not part of a forward pass")
        logits, labels = op.inputs

        def build():
            # loss = -sum(labels * log_softmax(logits), -1): (N, C) -> (N,)
            dtype = _dtype(logits.dtype)
            log_p = self._aux("log_softmax", [self._v(logits)], op, _shape(logits), dtype, {"axis": 1})
            weighted = self._aux("mul", [self._v(labels), log_p], op, _shape(logits), dtype)
            total = self._aux("reduce_sum", [weighted], op, _shape(tensor), dtype, {"axes": [1], "keepdims": False})
            self._emit("neg", [total], op, [tensor])
        return _Plan([logits, labels], build)

    def _map_reduce(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        rank = x.shape.rank
        axes = sorted({int(a) % rank for a in np.atleast_1d(self._attr(op.inputs[1], "the reduction axis"))})
        keepdims = bool(op.get_attr("keep_dims"))
        ir_op = {"Mean": "reduce_mean", "Sum": "reduce_sum", "Max": "reduce_max"}[op.type]
        if not axes:  # TF reduces over nothing: the value itself
            return _Plan([x], lambda: self._emit("identity", [self._v(x)], op, [tensor]))
        return _Plan([x], lambda: self._emit(ir_op, [self._v(x)], op, [tensor], {"axes": axes, "keepdims": keepdims}))

    def _map_reshape(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        if tensor.shape.is_fully_defined():
            shape = tensor.shape.as_list()
        elif op.type == "Reshape" and self._const(op.inputs[1]) is not None:
            shape = [int(d) for d in self._const(op.inputs[1])]
        elif tensor.shape.rank is not None and sum(d is None for d in tensor.shape.as_list()) == 1:
            shape = [-1 if d is None else d for d in tensor.shape.as_list()]
        else:
            raise _CannotMap("the target shape is not static")
        return _Plan([x], lambda: self._emit("reshape", [self._v(x)], op, [tensor], {"shape": shape}))

    def _map_transpose(self, tensor):
        op = tensor.op
        perm = [int(p) for p in self._attr(op.inputs[1], "the permutation")]
        x = op.inputs[0]
        return _Plan([x], lambda: self._emit("transpose", [self._v(x)], op, [tensor], {"perm": perm}))

    def _map_concat(self, tensor):
        op = tensor.op
        operands = list(op.inputs[:-1])
        axis = int(self._attr(op.inputs[-1], "the concat axis")) % tensor.shape.rank
        return _Plan(operands, lambda: self._emit("concat", [self._v(t) for t in operands], op, [tensor],
                                                  {"axis": axis}))

    def _map_strided_slice(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        if op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask"):
            raise _CannotMap("ellipsis or new-axis slicing")
        begin = [int(v) for v in self._attr(op.inputs[1], "the slice begin")]
        end = [int(v) for v in self._attr(op.inputs[2], "the slice end")]
        strides = [int(v) for v in self._attr(op.inputs[3], "the slice strides")]
        if any(s <= 0 for s in strides):
            raise _CannotMap("a negative stride")
        begin_mask, end_mask, shrink = (op.get_attr(k) for k in ("begin_mask", "end_mask", "shrink_axis_mask"))
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
                    raise _CannotMap("slicing a dimension of unknown size")
                bounds.append((0, None, 1))
                continue
            bounds.append(slice(b, e, s).indices(dim))
        attrs = {"begin": [b for b, _, _ in bounds], "end": [e for _, e, _ in bounds], "step": [s for _, _, s in bounds]}
        sliced_shape = [None if e is None else len(range(b, e, s)) for b, e, s in bounds]

        def build():
            if not shrink:
                self._emit("slice", [self._v(x)], op, [tensor], attrs)
                return
            part = self._aux("slice", [self._v(x)], op, sliced_shape, _dtype(x.dtype), attrs)
            shape = [-1 if d is None else d for d in _shape(tensor)]
            self._emit("reshape", [part], op, [tensor], {"shape": shape})
        return _Plan([x], build)

    def _transposed(self, value: str, tensor: tf.Tensor, op: tf.Operation) -> str:
        """``value`` with its last two axes swapped."""
        shape = list(_shape(tensor))
        perm = list(range(len(shape)))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return self._aux("transpose", [value], op, [shape[p] for p in perm], _dtype(tensor.dtype), {"perm": perm})

    def _map_matmul(self, tensor):
        op = tensor.op
        a, b = op.inputs
        keys = ("transpose_a", "transpose_b") if op.type == "MatMul" else ("adj_x", "adj_y")
        swap_a, swap_b = (bool(op.get_attr(k)) for k in keys)

        def build():
            va, vb = self._v(a), self._v(b)
            if swap_a:
                va = self._transposed(va, a, op)
            if swap_b:
                vb = self._transposed(vb, b, op)
            self._emit("matmul", [va, vb], op, [tensor])
        return _Plan([a, b], build)

    def _map_einsum(self, tensor):
        op = tensor.op
        equation = op.get_attr("equation").decode()
        operands = list(op.inputs)
        return _Plan(operands, lambda: self._emit("einsum", [self._v(t) for t in operands], op, [tensor],
                                                  {"equation": equation}))

    def _map_cast(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        return _Plan([x], lambda: self._emit("cast", [self._v(x)], op, [tensor], {"dtype": _dtype(tensor.dtype)}))

    def _map_argmax(self, tensor):
        op = tensor.op
        x = op.inputs[0]
        axis = int(self._attr(op.inputs[1], "the argmax axis")) % x.shape.rank
        return _Plan([x], lambda: self._emit("argmax", [self._v(x)], op, [tensor], {"axis": axis}))

    @staticmethod
    def _spatial(values, layout: str) -> list[int]:
        """The H and W entries of a 4-element strides/ksize/dilations attribute."""
        values = list(values)
        return [int(v) for v in (values[1:3] if layout == "NHWC" else values[2:4])]

    def _map_conv2d(self, tensor):
        op = tensor.op
        layout = op.get_attr("data_format").decode()
        padding = op.get_attr("padding").decode()
        if padding == "EXPLICIT":
            pads = list(op.get_attr("explicit_paddings"))
            pairs = [pads[i:i + 2] for i in range(0, 8, 2)]
            padding = [[int(v) for v in p] for p in (pairs[1:3] if layout == "NHWC" else pairs[2:4])]
        attrs = {"strides": self._spatial(op.get_attr("strides"), layout), "padding": padding,
                 "dilations": self._spatial(op.get_attr("dilations"), layout), "layout": layout,
                 "weight_layout": "HWIO"}
        x, w = op.inputs
        return _Plan([x, w], lambda: self._emit("conv2d", [self._v(x), self._v(w)], op, [tensor], attrs))

    def _map_pool(self, tensor):
        op = tensor.op
        layout = op.get_attr("data_format").decode()
        attrs = {"kernel": self._spatial(op.get_attr("ksize"), layout),
                 "strides": self._spatial(op.get_attr("strides"), layout),
                 "padding": op.get_attr("padding").decode(), "layout": layout}
        ir_op = "max_pool2d" if op.type == "MaxPool" else "avg_pool2d"
        x = op.inputs[0]
        return _Plan([x], lambda: self._emit(ir_op, [self._v(x)], op, [tensor], attrs))

    def _map_fused_batch_norm(self, tensor):
        op = tensor.op
        if tensor.value_index != 0:
            raise _CannotMap("only the normalised output of a fused batch norm is lowered")
        x, gamma, beta, mean, variance = op.inputs[:5]
        eps = _f32(op.get_attr("epsilon"))
        axis = 3 if op.get_attr("data_format").decode() == "NHWC" else 1
        if op.get_attr("is_training"):
            # running stats: the variables read into mean/variance, updated by
            # exponential_avg_factor f: new = (1 - f) * old + f * batch
            stats = [_read_handle(t) for t in (mean, variance)]
            if any(s is None for s in stats):
                raise _CannotMap("the running mean and variance are not variables")
            factor = float(op.get_attr("exponential_avg_factor")) if "exponential_avg_factor" in op.node_def.attr \
                else 1.0
            # the IR's momentum is torch's: new = (1 - m) * old + m * batch, so m = f
            attrs = {"axis": axis, "eps": eps, "momentum": _f32(factor)}

            def build():
                self._emit("batch_norm", [self._v(x), self._v(gamma), self._v(beta),
                                          self._variable(stats[0]), self._variable(stats[1])], op, [tensor], attrs)
            return _Plan([x, gamma, beta], build)

        def build_inference():
            self._normalize_inference(op, tensor, x, gamma, beta, mean, variance, eps, axis)
        return _Plan([x, gamma, beta, mean, variance], build_inference)

    def _normalize_inference(self, op, tensor, x, gamma, beta, mean, variance, eps, axis):
        """y = x * inv + (beta - mean * inv), inv = gamma * rsqrt(var + eps), with fixed stats."""
        dtype = _dtype(x.dtype)
        rank = x.shape.rank
        channel_shape = [1] * rank
        channel_shape[axis] = x.shape[axis]

        def per_channel(value: str) -> str:  # (C,) -> broadcastable against x
            if axis == rank - 1:
                return value
            return self._aux("reshape", [value], op, channel_shape, dtype, {"shape": channel_shape})

        c = [x.shape[axis]]
        e = self._constant(op, "epsilon", np.asarray(eps, dtype=x.dtype.as_numpy_dtype))
        var_eps = self._aux("add", [self._v(variance), e], op, c, dtype)
        inv = self._aux("mul", [self._aux("rsqrt", [var_eps], op, c, dtype), self._v(gamma)], op, c, dtype)
        shift = self._aux("sub", [self._v(beta), self._aux("mul", [self._v(mean), inv], op, c, dtype)], op, c, dtype)
        scaled = self._aux("mul", [self._v(x), per_channel(inv)], op, _shape(x), dtype)
        self._emit("add", [scaled, per_channel(shift)], op, [tensor])

    # -- patterns: several TF ops -> one IR op ------------------------------------

    def _match_dropout(self, tensor) -> _Plan | None:
        """select(uniform >= rate, x * 1/(1 - rate), 0): Keras 3 Dropout and tf.nn.dropout."""
        op = tensor.op
        cond, kept, zero = op.inputs
        if not (_is(cond, "GreaterEqual") and _is(kept, "Mul") and self._is_const(zero, 0.0)):
            return None
        uniform, rate_t = cond.op.inputs
        rate = self._scalar(rate_t)
        if rate is None or not 0.0 < rate < 1.0 or not _from_random(uniform) or _shape(uniform) != _shape(tensor):
            return None
        for x, scale in _pairs(kept.op):
            if self._is_const(scale, 1.0 / (1.0 - rate)):
                return _Plan([x], lambda x=x: self._emit("dropout", [self._v(x)], op, [tensor], {"rate": rate},
                                                         label="Dropout"))
        return None

    def _match_gather(self, tensor) -> _Plan | None:
        """table[ids]: GatherV2 on axis 0 (Keras Embedding wraps negative ids first) or ResourceGather."""
        op = tensor.op
        if op.get_attr("batch_dims") != 0:
            return None
        table, ids = op.inputs[0], op.inputs[1]
        if op.type == "GatherV2" and self._scalar(op.inputs[2]) != 0:
            return None
        ids = _unwrap_negative_ids(ids)
        label = "Embedding" if op.type == "GatherV2" else None
        if op.type == "ResourceGather":
            handle = table.op

            def build():
                self._emit("embedding", [self._variable(handle), self._v(ids)], op, [tensor], label=label)
            return _Plan([ids], build)
        return _Plan([table, ids], lambda: self._emit("embedding", [self._v(table), self._v(ids)], op, [tensor],
                                                      label=label))

    def _match_gelu(self, tensor) -> _Plan | None:
        """0.5 * x * erfc(-x / sqrt 2), 0.5 * x * (1 + erf(x / sqrt 2)), or the tanh form."""
        factors = _mul_factors(tensor)
        halves = [f for f in factors if self._is_const(f, 0.5)]
        if len(factors) != 3 or len(halves) != 1:
            return None
        rest = list(factors)
        rest.remove(halves[0])
        for x, g in (rest, rest[::-1]):
            approximate = self._gelu_form(x, g)
            if approximate is not None:
                op = tensor.op
                return _Plan([x], lambda x=x: self._emit("gelu", [self._v(x)], op, [tensor],
                                                         {"approximate": approximate}, label="Gelu"))
        return None

    def _gelu_form(self, x: tf.Tensor, g: tf.Tensor) -> str | None:
        """"none" or "tanh" if ``g`` is the gate of gelu(x), else None."""
        if _is(g, "Erfc"):  # erfc(-x / sqrt 2)
            inner = _mul_factors(g.op.inputs[0])
            if len(inner) == 2:
                for neg, c in (inner, inner[::-1]):
                    if _is(neg, "Neg") and _same(neg.op.inputs[0], x) and self._is_const(c, 2.0**-0.5):
                        return "none"
            return None
        if not _is(g, "AddV2", "Add"):
            return None
        for one, h in _pairs(g.op):
            if not self._is_const(one, 1.0):
                continue
            if _is(h, "Erf") and self._is_scaled(h.op.inputs[0], x, 2.0**-0.5):
                return "none"
            if _is(h, "Tanh") and self._is_tanh_gelu_arg(h.op.inputs[0], x):
                return "tanh"
        return None

    def _is_scaled(self, t: tf.Tensor, x: tf.Tensor, factor: float) -> bool:
        """t == x * factor, written as a product or a division."""
        if _is(t, "Mul"):
            return any(_same(a, x) and self._is_const(c, factor) for a, c in _pairs(t.op))
        if _is(t, "RealDiv"):
            return _same(t.op.inputs[0], x) and self._is_const(t.op.inputs[1], 1.0 / factor)
        return False

    def _is_tanh_gelu_arg(self, t: tf.Tensor, x: tf.Tensor) -> bool:
        """t == sqrt(2/pi) * (x + 0.044715 * x**3)."""
        if not _is(t, "Mul"):
            return False
        for c, inner in _pairs(t.op):
            if not (self._is_const(c, np.sqrt(2.0 / np.pi)) and _is(inner, "AddV2", "Add")):
                continue
            for x0, cubic in _pairs(inner.op):
                if not _same(x0, x) or not _is(cubic, "Mul"):
                    continue
                for k, power in _pairs(cubic.op):
                    if (self._is_const(k, 0.044715) and _is(power, "Pow") and _same(power.op.inputs[0], x)
                            and self._is_const(power.op.inputs[1], 3.0)):
                        return True
        return False

    def _match_norm(self, tensor) -> _Plan | None:
        """x * inv + shift with inv = rsqrt(var + eps) [* gamma] over moments of x.

        Moments with kept dims: Keras 3 LayerNormalization -> layer_norm.
        Squeezed moments over every axis but one, whose running averages the graph
        assigns: BatchNormalization in training -> batch_norm. Anything else (e.g.
        BatchNormalization at inference, whose stats are variables) stays elementwise.
        """
        op = tensor.op
        for scaled, shift in _pairs(op):
            if not _is(scaled, "Mul"):
                continue
            for x, inv in _pairs(scaled.op):
                parsed = self._parse_inv(inv)
                if parsed is None:
                    continue
                var, eps, gamma = parsed
                shifted = _parse_shift(shift, inv)
                if shifted is None:
                    continue
                mean, beta = shifted
                plan = self._layer_norm(tensor, x, mean, var, eps, gamma, beta)
                if plan is None:
                    plan = self._batch_norm(tensor, x, mean, var, eps, gamma, beta)
                if plan is not None:
                    return plan
        return None

    def _parse_inv(self, inv: tf.Tensor):
        """rsqrt(var + eps) [* gamma] -> (var, eps, gamma or None)."""
        gamma = None
        if _is(inv, "Mul"):
            for r, g in _pairs(inv.op):
                if _is(r, "Rsqrt"):
                    inv, gamma = r, g
                    break
            else:
                return None
        if not _is(inv, "Rsqrt") or not _is(inv.op.inputs[0], "AddV2", "Add"):
            return None
        for var, eps_t in _pairs(inv.op.inputs[0].op):
            eps = self._scalar(eps_t)
            if eps is not None and not _is(var, "Const"):
                return var, _f32(eps), gamma
        return None

    def _layer_norm(self, tensor, x, mean, var, eps, gamma, beta) -> _Plan | None:
        axes = _moments_axes(x, mean, var, keepdims=True)
        if axes is None:
            return None
        norm_shape = [x.shape[a] for a in axes]  # gamma and beta: x's dims at the normalised axes
        gamma, beta = (None if t is None else _unwrap_reshape(t) for t in (gamma, beta))
        if any(t is not None and t.shape.as_list() != norm_shape for t in (gamma, beta)):
            return None
        op = tensor.op
        dtype = x.dtype.as_numpy_dtype

        def build():
            g = self._v(gamma) if gamma is not None else self._constant(op, "gamma", np.ones(norm_shape, dtype))
            b = self._v(beta) if beta is not None else self._constant(op, "beta", np.zeros(norm_shape, dtype))
            self._emit("layer_norm", [self._v(x), g, b], op, [tensor], {"axes": axes, "eps": eps},
                       label="LayerNormalization")
        return _Plan([t for t in (x, gamma, beta) if t is not None], build)

    def _batch_norm(self, tensor, x, mean, var, eps, gamma, beta) -> _Plan | None:
        mean, var = _unwrap_reshape(mean), _unwrap_reshape(var)
        if not (_is(mean, "Squeeze") and _is(var, "Squeeze")):
            return None
        axes = _moments_axes(x, mean.op.inputs[0], var.op.inputs[0], keepdims=True)
        rank = x.shape.rank
        if axes is None or len(axes) != rank - 1:
            return None
        axis = next(a for a in range(rank) if a not in axes)
        channels = [x.shape[axis]]
        gamma, beta = (None if t is None else _unwrap_reshape(t) for t in (gamma, beta))
        if gamma is None or beta is None or any(t.shape.as_list() != channels for t in (gamma, beta)):
            return None
        moving = self._moving_averages()
        if mean.name not in moving or var.name not in moving:
            return None
        (mean_var, share), (var_var, share_v) = moving[mean.name], moving[var.name]
        if not np.isclose(share, share_v):
            return None
        op = tensor.op
        # the IR's momentum is torch's: the batch statistic's share of the new running value
        # Keras averages the biased batch variance into moving_variance (torch and fused BN: unbiased)
        attrs = {"axis": axis, "eps": eps, "momentum": _f32(share), "unbiased_var": False}

        def build():
            self._emit("batch_norm", [self._v(x), self._v(gamma), self._v(beta), self._variable(mean_var),
                                      self._variable(var_var)], op, [tensor], attrs, label="BatchNormalization")
        return _Plan([x, gamma, beta], build)

    def _moving_averages(self) -> dict[str, tuple[tf.Operation, float]]:
        """batch statistic tensor name -> (variable handle, the statistic's share s) of each
        moving average new = (1 - s) * old + s * stat.

        Keras 3: assign(v, v * m + stat * (1 - m)); tf.compat.v1's
        assign_moving_average: assign_sub(v, (v - stat) * (1 - m)). s = 1 - m.
        """
        if self._moving is not None:
            return self._moving
        self._moving = {}
        for op in self.tf_graph.get_operations():
            if op.type not in ("AssignVariableOp", "AssignSubVariableOp") or op.inputs[0].op.type != "VarHandleOp":
                continue
            handle, value = op.inputs[0].op, op.inputs[1]
            found = (self._keras_average(handle, value) if op.type == "AssignVariableOp"
                     else self._v1_average(handle, value))
            if found is not None:
                self._moving[found[0].name] = (handle, found[1])
        return self._moving

    def _keras_average(self, handle, value):
        if not _is(value, "AddV2", "Add"):
            return None
        for old, new in _pairs(value.op):
            if not (_is(old, "Mul") and _is(new, "Mul")):
                continue
            for read, m_t in _pairs(old.op):
                m = self._scalar(m_t)
                if m is None or not _same_op(_read_handle(read), handle):
                    continue
                for stat, c in _pairs(new.op):
                    if self._is_const(c, 1.0 - m, rtol=1e-3):
                        return stat, self._scalar(c)
        return None

    def _v1_average(self, handle, value):
        if not _is(value, "Mul"):
            return None
        for diff, c_t in _pairs(value.op):
            c = self._scalar(c_t)
            if c is not None and _is(diff, "Sub") and _same_op(_read_handle(diff.op.inputs[0]), handle):
                return diff.op.inputs[1], c
        return None

    # -- metrics in a training graph -------------------------------------------------

    def _report_metrics(self, roots: list):
        """tf.compat.v1.metrics in a training graph's path: metrics belong in host_call (EVAL)."""
        metric_vars = {_variable_name(v) for key in (_KEYS.LOCAL_VARIABLES, _KEYS.METRIC_VARIABLES)
                       for v in self.tf_graph.get_collection(key)}
        reported = set()
        for op in _reachable([r for r in roots if r is not None]):
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
                "loc": self._loc(op),
            })


# ---------------------------------------------------------------------------------
# small graph helpers for the patterns
# ---------------------------------------------------------------------------------


def _from_random(tensor: tf.Tensor, depth: int = 4) -> bool:
    """Whether ``tensor`` is a random draw, up to a few affine steps away (uniform * (max - min) + min)."""
    stack = [(tensor, 0)]
    while stack:
        t, d = stack.pop()
        if "Random" in t.op.type:
            return True
        if d < depth and t.op.type in ("AddV2", "Add", "Mul", "Sub"):
            stack.extend((i, d + 1) for i in t.op.inputs)
    return False


def _mul_factors(tensor: tf.Tensor, depth: int = 3) -> list[tf.Tensor]:
    """The operands of a product, nested Muls flattened (a * b * c -> [a, b, c])."""
    if depth == 0 or not _is(tensor, "Mul"):
        return [tensor]
    a, b = tensor.op.inputs
    return _mul_factors(a, depth - 1) + _mul_factors(b, depth - 1)


def _unwrap_negative_ids(ids: tf.Tensor) -> tf.Tensor:
    """ids behind Keras Embedding's select(ids < 0, ids + n, ids) (negative ids wrap)."""
    if _is(ids, "SelectV2", "Select"):
        cond, _, plain = ids.op.inputs
        if _is(cond, "Less") and _same(cond.op.inputs[0], plain):
            return plain
    return ids


def _unwrap_reshape(tensor: tf.Tensor) -> tf.Tensor:
    """The tensor behind reshapes / identities (Keras reshapes gamma to broadcast)."""
    while _is(tensor, "Reshape", "Identity") or (_is(tensor, "Cast") and tensor.op.inputs[0].dtype == tensor.dtype):
        tensor = tensor.op.inputs[0]
    return tensor


def _read_handle(tensor: tf.Tensor):
    """The VarHandleOp that ``tensor`` reads (through Identity / Cast / ReadVariableOp), else None."""
    tensor = _unwrap_reshape(tensor)
    if _is(tensor, "ReadVariableOp") and tensor.op.inputs[0].op.type == "VarHandleOp":
        return tensor.op.inputs[0].op
    return None


def _parse_shift(shift: tf.Tensor, inv: tf.Tensor):
    """(mean, beta or None) from the additive part of a normalisation.

    tf.nn.batch_normalization: beta - mean * inv, or -(mean * inv).
    Keras 3 layer_normalization: -mean * inv + beta, or -mean * inv.
    """
    def mean_times_inv(t):  # mean * inv
        if _is(t, "Mul"):
            for m, i in _pairs(t.op):
                if _same(i, inv):
                    return m
        return None

    def neg_mean_times_inv(t):  # (-mean) * inv
        m = mean_times_inv(t)
        return m.op.inputs[0] if m is not None and _is(m, "Neg") else None

    if _is(shift, "Sub"):
        mean = mean_times_inv(shift.op.inputs[1])
        return None if mean is None else (mean, shift.op.inputs[0])
    if _is(shift, "Neg"):
        mean = mean_times_inv(shift.op.inputs[0])
        return None if mean is None else (mean, None)
    if _is(shift, "AddV2", "Add"):
        for part, beta in _pairs(shift.op):
            mean = neg_mean_times_inv(part)
            if mean is not None:
                return mean, beta
        return None
    mean = neg_mean_times_inv(shift)
    return None if mean is None else (mean, None)


def _moments_axes(x: tf.Tensor, mean: tf.Tensor, var: tf.Tensor, keepdims: bool) -> list[int] | None:
    """The axes of tf.nn.moments(x): mean = Mean(x), var = Mean((x - stop_gradient(mean))**2)."""
    if not (_is(mean, "Mean") and _is(var, "Mean")) or not _same(mean.op.inputs[0], x):
        return None
    if bool(mean.op.get_attr("keep_dims")) != keepdims or bool(var.op.get_attr("keep_dims")) != keepdims:
        return None
    sq = var.op.inputs[0]
    if not _is(sq, "SquaredDifference") or not _same(sq.op.inputs[0], x):
        return None
    centre = sq.op.inputs[1]
    if _is(centre, "StopGradient"):
        centre = centre.op.inputs[0]
    if not _same(centre, mean):
        return None
    axes = []
    for t in (mean.op.inputs[1], var.op.inputs[1]):
        value = tf.get_static_value(t)
        if value is None:
            return None
        axes.append(sorted({int(a) % x.shape.rank for a in np.atleast_1d(value)}))
    return axes[0] if axes[0] == axes[1] else None
