"""Reading the optimizer from a TF training graph: the Apply ops train_op runs -> OptimizerSpec.

The ops train_op runs are found through data and control inputs and inside the
functions they call (a tf.cond branch: dynamic loss scaling wraps the update in one).
An Apply op gives the optimizer's kind, hyper-parameters (its constant inputs) and its
slot variables (``<var>/Adam``, ``<var>/Momentum``, Adam's beta powers):

    ResourceApplyGradientDescent -> sgd, ResourceApplyMomentum (use_nesterov) -> momentum,
    ResourceApplyAdam -> adam, or adamw when a ``var -= lr * wd * var`` precedes it
    (common/tf/optim.py's AdamWOptimizer); any other Apply op is a UserError.

An optimizer written out in TF ops has no Apply op: BERT's AdamWeightDecayOptimizer (and
the vendor's TF AdamW, which follows it) assigns each weight and its two slots

    next_m = b1 * m + (1 - b1) * g;   next_v = b2 * v + (1 - b2) * square(g)
    update = next_m / (sqrt(next_v) + eps)  [* sqrt(1 - beta2_power) / (1 - beta1_power)]  [+ wd * var]
    var := var - lr * update;   m := next_m;   v := next_v      [beta powers := powers * b]

``assigned_adams`` matches exactly that (the operands of +, * in either order) into the
device's adam / adamw of form "bert"; a trainable variable assigned any other way is a
UserError naming it, never a guess. A learning rate that is not a graph constant (a
schedule) is not read into the spec: ``learning_rate_tensor`` gives the tensor, which the
runner evaluates at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
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
    """The names of Adam's beta1_power and beta2_power variables, if the graph has an Adam
    (an Apply op, or one written out in ops with bias correction)."""
    views = update_views(graph.get_operations())
    for view in views:
        entry = apply_entry(view.type)
        if entry is not None and entry[0] == "adam":
            names = tuple(ref_variable(view.inputs[i]) for i in ADAM_POWERS.values())
            if None not in names:
                return names
    if any(_is_apply_op(view.type) for view in views):
        return None
    return next((adam.powers for adam in assigned_adams(views) if adam.powers is not None), None)


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


def _lr_refs(views: list[OpView], assigned: list[AssignedAdam]) -> list:
    """The learning-rate input of every update train_op runs (Apply ops, assigned Adams)."""
    refs = [v.inputs[apply_entry(v.type)[1]["lr"]] for v in views if apply_entry(v.type) is not None]
    return refs + [a.lr for a in assigned]


def learning_rate_tensor(views: list[OpView], params: list[str]) -> tf.Tensor | None:
    """The learning rate of train_op's updates when it is a tensor of the graph that is not a
    constant (a schedule of the global step), else None. The spec leaves such a rate out:
    its value changes every step."""
    for ref in _lr_refs(views, assigned_adams(views, params)):
        if isinstance(ref, tf.Tensor) and tf.get_static_value(ref) is None:
            return ref
    return None


def _check_one_learning_rate(views: list[OpView], assigned: list[AssignedAdam], train_op: tf.Operation) -> None:
    rates = set()
    for ref in _lr_refs(views, assigned):
        value = _ref_value(ref, None)
        rates.add(("value", value) if value is not None else ("tensor", _ref_name(ref)))
    if len(rates) > 1:
        raise UserError(f"train_op {train_op.name!r} updates its variables with {len(rates)} different learning "
                        "rates; the device runs one rate for every parameter")


def optimizer_spec(views: list[OpView], train_op: tf.Operation, params: list[str], session) -> OptimizerSpec:
    """The update rule of ``train_op``, read from its Apply ops ("tf" semantics), or from the
    assignments of an Adam written out in ops (form "bert")."""
    assigned = assigned_adams(views, params)
    _check_one_learning_rate(views, assigned, train_op)
    applies = [v for v in views if _is_apply_op(v.type)]
    if assigned or (not applies and _assigned_params(views, params)):
        if applies:
            raise UserError(f"train_op {train_op.name!r} mixes optimizer Apply ops with assigned updates; "
                            "the device runs one optimizer")
        return _assigned_spec(assigned, views, train_op, params)
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
        if key == "lr":
            value = _ref_value(first.inputs[index], None)
            if value is not None:  # else a schedule: learning_rate_tensor, read every step
                hyper[key] = value
            continue
        value = _ref_value(first.inputs[index], session)
        if value is None:
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


# --- Adam written out in ops ------------------------------------------------------------------


@dataclass
class AssignedAdam:
    """One variable's update by BERT's AdamWeightDecay as ops (the module docstring)."""

    var: str
    m: str
    v: str
    lr: Any  # ref
    beta1: float
    beta2: float
    eps: float
    weight_decay: float | None  # None: no decay term
    powers: tuple[str, str] | None  # bias correction's beta1_power and beta2_power variables


_ASSIGNS = ("AssignVariableOp", "Assign")


def _unwrap(ref):
    while _ref_type(ref) == "Identity":
        ref = _ref_input(ref, 0)
    return ref


def _operands(ref, *types: str) -> tuple | None:
    ref = _unwrap(ref)
    return (_ref_input(ref, 0), _ref_input(ref, 1)) if _ref_type(ref) in types else None


def _orders(pair: tuple | None) -> tuple:
    """Both orders of a commutative op's operands (none when there is no such op)."""
    return () if pair is None else (pair, pair[::-1])


def _const(ref) -> float | None:
    ref = _unwrap(ref)
    return _ref_value(ref, None) if _ref_type(ref) not in ("ReadVariableOp", None) else None


def _reads(ref) -> str | None:
    return ref_variable(_unwrap(ref))


def _same_gradient(a, b) -> bool:
    """The same gradient tensor; a sparse gradient is densified once per use (the same inputs)."""
    a, b = _unwrap(a), _unwrap(b)
    if _ref_name(a) == _ref_name(b):
        return True
    return (_ref_type(a) == _ref_type(b) == "UnsortedSegmentSum"
            and all(_ref_name(_ref_input(a, i)) == _ref_name(_ref_input(b, i)) for i in range(3)))


def _moment(ref, squared: bool) -> tuple[float, str, Any] | None:
    """b * slot + (1 - b) * g (g squared for the second moment) -> (b, slot variable, g)."""
    for decay_term, grad_term in _orders(_operands(ref, "AddV2", "Add")):
        for beta_ref, slot_ref in _orders(_operands(decay_term, "Mul")):
            beta, slot = _const(beta_ref), _reads(slot_ref)
            if beta is None or slot is None:
                continue
            for rest_ref, grad in _orders(_operands(grad_term, "Mul")):
                if _const(rest_ref) is None or np.float32(_const(rest_ref)) != np.float32(1.0 - beta):
                    continue
                if squared:
                    if _ref_type(_unwrap(grad)) != "Square":
                        continue
                    grad = _ref_input(_unwrap(grad), 0)
                return beta, slot, grad
    return None


def _one_minus_power(ref) -> str | None:
    pair = _operands(ref, "Sub")
    return _reads(pair[1]) if pair is not None and _const(pair[0]) == 1.0 else None


def _bias_correction(ref) -> tuple[str, str] | None:
    """sqrt(1 - beta2_power) / (1 - beta1_power) -> (beta1_power, beta2_power)."""
    pair = _operands(ref, "RealDiv")
    if pair is None or _ref_type(_unwrap(pair[0])) != "Sqrt":
        return None
    b2_power, b1_power = _one_minus_power(_ref_input(_unwrap(pair[0]), 0)), _one_minus_power(pair[1])
    return (b1_power, b2_power) if b1_power and b2_power else None


def _adam_step(ref) -> tuple | None:
    """next_m / (sqrt(next_v) + eps) [* bias correction] -> (next_m, next_v, eps, powers)."""
    candidates = [(ref, None)] + [(step, _bias_correction(bc)) for step, bc in _orders(_operands(ref, "Mul"))]
    for step, powers in candidates:
        pair = _operands(step, "RealDiv")
        if pair is None or (step is not ref and powers is None):
            continue
        for root, eps_ref in _orders(_operands(pair[1], "AddV2", "Add")):
            eps = _const(eps_ref)
            if eps is not None and _ref_type(_unwrap(root)) == "Sqrt":
                return pair[0], _ref_input(_unwrap(root), 0), eps, powers
    return None


def _update(ref, var: str) -> tuple | None:
    """adam step [+ wd * var] -> (adam step's match, wd or None)."""
    found = _adam_step(ref)
    if found is not None:
        return found, None
    for step_ref, decay_ref in _orders(_operands(ref, "AddV2", "Add")):
        for wd_ref, var_ref in _orders(_operands(decay_ref, "Mul")):
            if _reads(var_ref) == var and _const(wd_ref) is not None:
                found = _adam_step(step_ref)
                if found is not None:
                    return found, _const(wd_ref)
    return None


def _assigned_params(views: list[OpView], params: list[str] | None) -> dict[str, OpView]:
    """The assignments train_op makes to trainable variables (to any, params None): {variable: assign op}."""
    assigns = {ref_variable(v.inputs[0]): v for v in views if v.type in _ASSIGNS and len(v.inputs) > 1}
    return {var: v for var, v in assigns.items() if var is not None and (params is None or var in set(params))}


def _match_assigned(var: str, assign: OpView, assigns: dict[str, OpView]) -> AssignedAdam | None:
    pair = _operands(assign.inputs[1], "Sub")
    if pair is None or _reads(pair[0]) != var:
        return None
    for lr, update_ref in _orders(_operands(pair[1], "Mul")):
        found = _update(update_ref, var)
        if found is None:
            continue
        (next_m, next_v, eps, powers), wd = found
        first, second = _moment(next_m, squared=False), _moment(next_v, squared=True)
        if first is None or second is None or not _same_gradient(first[2], second[2]):
            return None
        (beta1, m, _), (beta2, v, _) = first, second
        for slot, value in ((m, next_m), (v, next_v)):  # the slots keep what the step used
            kept = assigns.get(slot)
            if kept is None or _ref_name(_unwrap(kept.inputs[1])) != _ref_name(_unwrap(value)):
                return None
        if powers is not None:
            for power, beta in zip(powers, (beta1, beta2)):  # each power := power * beta
                kept = assigns.get(power)
                operands = _operands(kept.inputs[1], "Mul") if kept is not None else None
                if not any(_reads(a) == power and _const(b) == beta for a, b in _orders(operands)):
                    return None
        return AssignedAdam(var, m, v, lr, beta1, beta2, eps, wd, powers)
    return None


def assigned_adams(views: list[OpView], params: list[str] | None = None) -> list[AssignedAdam]:
    """The update of each trainable variable (of any variable, params None) by an Adam written
    out in ops (the module docstring)."""
    assigns = _assigned_params(views, None)
    found = [_match_assigned(var, view, assigns) for var, view in _assigned_params(views, params).items()]
    return [a for a in found if a is not None]


def _assigned_spec(assigned: list[AssignedAdam], views: list[OpView], train_op: tf.Operation,
                   params: list[str]) -> OptimizerSpec:
    unmatched = sorted(set(_assigned_params(views, params)) - {a.var for a in assigned})
    if unmatched:
        raise UserError(f"train_op {train_op.name!r} assigns {unmatched[0]!r} with ops the device does not read as "
                        "an optimizer update: use a tf.compat.v1.train optimizer (its Apply ops), or BERT's "
                        "AdamWeightDecay written out (m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g^2, "
                        "var -= lr * (m / (sqrt(v) + eps) + wd*var))")
    settings = {(a.beta1, a.beta2, a.eps, a.powers is not None) for a in assigned}
    if len(settings) > 1:
        raise UserError(f"train_op {train_op.name!r} updates variables with different Adam settings "
                        f"(beta1, beta2, epsilon, bias correction: {sorted(settings)}); the device runs one")
    rates = {a.weight_decay for a in assigned if a.weight_decay is not None}
    if len(rates) > 1:
        raise UserError(f"train_op {train_op.name!r} decays weights at different rates {sorted(rates)}; "
                        "the device's adamw has one weight_decay")
    beta1, beta2, eps, corrected = settings.pop()
    hyper = {"beta1": beta1, "beta2": beta2, "eps": eps, "bias_correction": float(corrected)}
    lr = _ref_value(assigned[0].lr, None)
    if lr is not None:
        hyper["lr"] = lr
    spec = OptimizerSpec(kind="adamw" if rates else "adam", semantics="tf", hyper=hyper, form="bert")
    if rates:
        spec.hyper["weight_decay"] = rates.pop()
        decayed = {a.var for a in assigned if a.weight_decay is not None}
        spec.weight_decay_exclude = tuple(sorted(p for p in params if p not in decayed))
        wrong = [p for p in params if spec.decays(p) != (p in decayed)]
        if wrong:  # the exclusion matches substrings: an excluded name inside a decayed one
            raise UserError(f"variable {wrong[0]!r} decays where the device's exclusion by name cannot tell it "
                            "from an undecayed variable whose name it contains; rename one")
    return spec
