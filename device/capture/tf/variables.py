"""Weights, state and optimizer slots between a TF session and the emulator, by TF variable name.

read_weights / read_state / write_weights move a Program's weights and state (batch-norm
statistics), read_optimizer_state / write_optimizer_state its optimizer slots
(``<var>/Adam``, ``<var>/Adam_1``, ``<var>/Momentum``, Adam's beta powers), so that a TF
checkpoint of emulator weights resumes as the emulator would.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from device import ir
from device.capture.tf.optimizer import SLOT_INPUTS, adam_powers, apply_entry, assigned_adams, ref_variable, update_views
from device.capture.tf.tensors import variable_name
from zoo_base.errors import UserError

_V1 = tf.compat.v1
_KEYS = _V1.GraphKeys


def read_weights(session: tf.compat.v1.Session, graph: ir.Graph) -> dict[str, np.ndarray]:
    """The IR's params in ``session``, by TF variable name (``Program(graph, weights)``'s weights)."""
    return read_variables(session, list(graph.params.values()))


def read_state(session: tf.compat.v1.Session, graph: ir.Graph) -> dict[str, np.ndarray]:
    """The IR's state (batch-norm running statistics) in ``session``, by TF variable name."""
    return read_variables(session, list(graph.state.values()))


def write_weights(session: tf.compat.v1.Session, graph: ir.Graph, weights: dict[str, np.ndarray]) -> None:
    """Assign ``weights`` (TF variable name -> array: params and/or state of ``graph``,
    e.g. a Program's get_weights() and get_state()) in ``session``."""
    known = set(graph.params.values()) | set(graph.state.values())
    unknown = sorted(set(weights) - known)
    if unknown:
        raise UserError(f"weights {unknown} are not parameters or state of the captured graph")
    write_variables(session, weights)


def optimizer_slots(tf_graph: tf.Graph, graph: ir.Graph) -> dict[str, dict[str, str]]:
    """Where TF keeps the optimizer's state: {param name: {slot: TF variable name}}.

    Slots as the device's optimizer names them: "m" and "v" (Adam: ``<var>/Adam``,
    ``<var>/Adam_1``), "momentum" (``<var>/Momentum``). Found from the TF graph's Apply
    ops, so a renamed optimizer works too; Adam's sparse (embedding) updates have no
    Apply op, and their slots are found by TF's naming next to the others.
    """
    params = set(graph.params.values())
    slots: dict[str, dict[str, str]] = {}
    suffixes: dict[str, str] = {}  # slot -> the suffix TF gave its variables ("Adam", "Adam_1")
    views = update_views(tf_graph.get_operations())
    for adam in assigned_adams(views, sorted(params)):  # an Adam written out in ops
        slots[adam.var] = {"m": adam.m, "v": adam.v}
    for view in views:
        entry = apply_entry(view.type)
        var = ref_variable(view.inputs[0]) if entry is not None else None
        if var not in params:
            continue
        names = {slot: ref_variable(view.inputs[i]) for slot, i in SLOT_INPUTS[entry[0]].items()}
        if None in names.values():
            continue
        slots[var] = names
        suffixes.update({slot: name[len(var) + 1:] for slot, name in names.items()})
    existing = {variable_name(v) for v in _graph_variables(tf_graph)}
    for var in params - set(slots):
        guessed = {slot: f"{var}/{suffix}" for slot, suffix in suffixes.items()}
        if guessed and all(name in existing for name in guessed.values()):
            slots[var] = guessed
    return slots


def read_optimizer_state(session: tf.compat.v1.Session, graph: ir.Graph) -> dict:
    """The optimizer's state in ``session``, shaped like the device optimizer's state_dict():
    {param name: {slot: array}, "step": updates applied}.

    TF's Adam keeps no step count, only beta1_power = beta1 ** (step + 1): "step" comes
    from it while it is a normal float32 (a few hundred steps), then from the global step
    (which also counts the updates dynamic loss scaling skipped; by then beta1's bias
    correction is exactly 1 in float32 and beta2's changes by 1e-3 per step miscounted).
    """
    slots = optimizer_slots(session.graph, graph)
    values = read_variables(session, [name for per_param in slots.values() for name in per_param.values()])
    state: dict = {param: {slot: values[name] for slot, name in slots.get(param, {}).items()}
                   for param in graph.params.values()}
    global_step = _V1.train.get_global_step(session.graph)
    state["step"] = int(session.run(global_step)) if global_step is not None else 0
    powers = adam_powers(session.graph)
    if graph.optimizer is not None and graph.optimizer.kind in ("adam", "adamw") and powers:
        b1_power = float(read_variables(session, [powers[0]])[powers[0]])
        if b1_power > 1e-30:
            state["step"] = round(np.log(b1_power) / np.log(graph.optimizer.hyper["beta1"])) - 1
    return state


def write_optimizer_state(session: tf.compat.v1.Session, graph: ir.Graph, state: dict) -> None:
    """Assign optimizer state shaped like ``read_optimizer_state``'s result in ``session``.

    For Adam, beta1_power and beta2_power are set to the float32 running products TF
    would hold after ``state["step"]`` updates. The global step is the runner's to set.
    """
    slots = optimizer_slots(session.graph, graph)
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
    spec = graph.optimizer
    powers = adam_powers(session.graph)
    if spec is not None and spec.kind in ("adam", "adamw") and powers:
        b1_power, b2_power = np.float32(spec.hyper["beta1"]), np.float32(spec.hyper["beta2"])
        for _ in range(int(state.get("step", 0))):  # TF multiplies them once per update, in float32
            b1_power, b2_power = b1_power * np.float32(spec.hyper["beta1"]), b2_power * np.float32(spec.hyper["beta2"])
        values[powers[0]], values[powers[1]] = b1_power, b2_power
    write_variables(session, values)


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


def _graph_variables(tf_graph: tf.Graph) -> list:
    seen, result = set(), []
    for key in (_KEYS.GLOBAL_VARIABLES, _KEYS.LOCAL_VARIABLES, _KEYS.METRIC_VARIABLES):
        for var in tf_graph.get_collection(key):
            if id(var) not in seen:
                seen.add(id(var))
                result.append(var)
    return result


def _variables_by_name(tf_graph: tf.Graph, names: list[str]) -> dict:
    variables = {variable_name(v): v for v in _graph_variables(tf_graph)}
    missing = [n for n in names if n not in variables]
    if missing:
        raise UserError(f"variables {missing} are not variables of the session's graph")
    return variables
