"""Reading the optimizer from a TF training graph: the Apply ops train_op runs -> OptimizerSpec.

The ops train_op runs are found through data and control inputs and inside the
functions they call (a tf.cond branch: dynamic loss scaling wraps the update in one).
An Apply op gives the optimizer's kind, hyper-parameters (its constant inputs) and its
slot variables (``<var>/Adam``, ``<var>/Momentum``, Adam's beta powers):

    ResourceApplyGradientDescent -> sgd, ResourceApplyMomentum (use_nesterov) -> momentum,
    ResourceApplyAdam -> adam, or adamw when a ``var -= lr * wd * var`` precedes it
    (common/tf/optim.py's AdamWOptimizer); any other Apply op is a UserError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from device.capture.tf.tensors import f32
from device.optimizer import OptimizerSpec
from zoo_base.errors import UserError

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
SLOT_INPUTS = {"sgd": {}, "momentum": {"momentum": 1}, "adam": {"m": 1, "v": 2}}
ADAM_POWERS = {"beta1_power": 3, "beta2_power": 4}


def apply_entry(op_type: str):
    """(kind, hyper input indices) for an Apply op type (with or without Resource), else None."""
    base = op_type[len("Resource"):] if op_type.startswith("Resource") else op_type
    return _APPLY_OPS.get(base)


def _is_apply_op(op_type: str) -> bool:
    base = op_type[len("Resource"):] if op_type.startswith("Resource") else op_type
    return base.startswith(("Apply", "SparseApply"))


@dataclass
class FunctionNode:
    """A node of a function body (a tf.cond branch: the train_op of dynamic loss scaling)."""

    node: Any  # NodeDef
    resolve: Callable[[str], Any]  # an input string of the body -> a ref


# A ref is what an op input is: a tf.Tensor of the graph, an FunctionNode output, or None
# (a function argument that does not lead back to the graph).


@dataclass
class OpView:
    """An op of the graph or of a function body, seen the same way."""

    type: str
    name: str
    use_nesterov: bool
    inputs: list  # refs


def _graph_view(op: tf.Operation) -> OpView:
    nesterov = _is_apply_op(op.type) and "use_nesterov" in op.node_def.attr and bool(op.get_attr("use_nesterov"))
    return OpView(op.type, op.name, nesterov, list(op.inputs))


def _ref_type(ref) -> str | None:
    if isinstance(ref, tf.Tensor):
        return ref.op.type
    return ref.node.op if isinstance(ref, FunctionNode) else None


def _ref_input(ref, index: int):
    if isinstance(ref, tf.Tensor):
        return ref.op.inputs[index]
    return ref.resolve(ref.node.input[index])


def _ref_name(ref) -> str | None:
    if isinstance(ref, tf.Tensor):
        return ref.name
    return ref.node.name if isinstance(ref, FunctionNode) else None


def ref_variable(ref) -> str | None:
    """The variable a ref is (a handle) or reads, else None."""
    kind = _ref_type(ref)
    if kind == "ReadVariableOp":
        return ref_variable(_ref_input(ref, 0))
    if kind in ("VarHandleOp", "VariableV2") and isinstance(ref, tf.Tensor):
        return ref.op.name
    return None


def _ref_value(ref, session) -> float | None:
    """A ref's value if it is a constant (or, with a session, computable), else None."""
    if isinstance(ref, tf.Tensor):
        return _hyper_value(ref, session)
    kind = _ref_type(ref)
    if kind == "Const":
        return f32(tf.make_ndarray(ref.node.attr["value"].tensor))
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
    return None if value is None else f32(value)


# function-calling ops -> (attributes naming the functions, index of the op input that is argument 0)
_CALLS = {"If": (("then_branch", "else_branch"), 1), "StatelessIf": (("then_branch", "else_branch"), 1),
          "PartitionedCall": (("f",), 0), "StatefulPartitionedCall": (("f",), 0)}


def _function_views(graph: tf.Graph, call: tf.Operation | FunctionNode, args: list, library: dict,
                    depth: int = 0) -> list[OpView]:
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
            views.append(OpView(n.op, n.name, nesterov, data))
            if n.op in _CALLS:
                inner = data[_CALLS[n.op][1]:]
                views += _function_views(graph, FunctionNode(n, resolve), inner, library, depth + 1)
    return views


def _resolver(env: dict, nodes: dict) -> Callable[[str], Any]:
    """Input string of a function body ("name:output:0", an argument's name) -> its ref."""
    def resolve(spec: str):
        name = spec.lstrip("^").split(":")[0]
        if name in env:
            return env[name]
        return FunctionNode(nodes[name], resolve) if name in nodes else None
    return resolve


def update_views(ops: list[tf.Operation]) -> list[OpView]:
    """Every op among ``ops`` and inside the functions they call (tf.cond branches)."""
    views = [_graph_view(op) for op in ops]
    calls = [op for op in ops if op.type in _CALLS]
    if calls:
        library = {f.signature.name: f for f in calls[0].graph.as_graph_def().library.function}
        for op in calls:
            views += _function_views(op.graph, op, list(op.inputs)[_CALLS[op.type][1]:], library)
    return views


def updated_variables(views: list[OpView]) -> set[str] | None:
    """Names of the variables train_op writes (Apply ops, the scatter-adds and assignments
    of sparse updates); None if an Apply op's variable cannot be traced (then every
    trainable variable counts as updated)."""
    names = set()
    for view in views:
        if view.inputs and (_is_apply_op(view.type) or view.type.startswith(("ResourceScatter", "Assign"))):
            name = ref_variable(view.inputs[0])
            if name is None and _is_apply_op(view.type):
                return None
            names.add(name)
    return names


def adam_powers(graph: tf.Graph) -> tuple[str, str] | None:
    """The names of Adam's beta1_power and beta2_power variables, if the graph has an Adam."""
    for view in update_views(graph.get_operations()):
        entry = apply_entry(view.type)
        if entry is not None and entry[0] == "adam":
            names = tuple(ref_variable(view.inputs[i]) for i in ADAM_POWERS.values())
            if None not in names:
                return names
    return None


def _decoupled_decay(apply: OpView, views: list[OpView], session) -> float | None:
    """AdamW's weight decay of ``apply``'s variable: wd of a ``var -= lr * wd * var`` that
    train_op runs (common/tf/optim.py's AdamWOptimizer, just before the Adam update)."""
    var = ref_variable(apply.inputs[0])
    lr_name = _ref_name(apply.inputs[_APPLY_OPS["ApplyAdam"][1]["lr"]])
    for view in views:
        if view.type != "AssignSubVariableOp" or ref_variable(view.inputs[0]) != var:
            continue
        wd, seen, stack = 1.0, set(), [view.inputs[1]]
        while stack:
            ref = stack.pop()
            if _ref_type(ref) == "Mul":
                stack += [_ref_input(ref, 0), _ref_input(ref, 1)]
            elif ref_variable(ref) == var or _ref_name(ref) == lr_name:
                seen.add("var" if ref_variable(ref) == var else "lr")
            else:
                value = _ref_value(ref, session)
                if value is None:
                    break
                wd *= value
        else:
            if seen == {"var", "lr"}:
                return f32(wd)
    return None


def optimizer_spec(views: list[OpView], train_op: tf.Operation, params: list[str], session) -> OptimizerSpec:
    """The update rule of ``train_op``, read from its Apply ops ("tf" semantics)."""
    applies = [v for v in views if _is_apply_op(v.type)]
    unknown = sorted({v.type for v in applies if apply_entry(v.type) is None})
    if unknown:
        raise UserError(f"optimizer op(s) {', '.join(unknown)} in train_op {train_op.name!r} are not supported "
                        "on the device: use GradientDescentOptimizer, MomentumOptimizer or AdamOptimizer")
    if not applies:
        raise UserError(f"train_op {train_op.name!r} updates no variable with an optimizer Apply op "
                        "(expected optimizer.minimize(loss, global_step))")
    kinds = sorted({apply_entry(v.type)[0] for v in applies})
    if len(kinds) > 1:
        raise UserError(f"train_op {train_op.name!r} mixes optimizers ({', '.join(kinds)}); the device runs one")
    kind = kinds[0]
    first = min(applies, key=lambda v: v.name)
    hyper: dict[str, float] = {}
    for key, index in apply_entry(first.type)[1].items():
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
        decays = {ref_variable(v.inputs[0]): _decoupled_decay(v, views, session) for v in applies}
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
