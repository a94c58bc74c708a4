"""Capture a TF1-style training graph (``tf.compat.v1.Graph``) as the device IR.

The TF runner rebuilds the Estimator contract on TF1 graph mode: the user's
``model_fn`` builds Keras 3 layers inside a ``tf.compat.v1.Graph`` and returns a loss
and ``train_op = optimizer.minimize(loss, global_step)``. ``capture`` walks that graph
backwards from the loss (and any outputs) to the batch inputs, the variables and the
constants, and lowers every forward op to ``device.ir``. The gradient and optimizer
subgraphs are not lowered: the runtime differentiates the IR itself; the optimizer is
read from the train_op's Apply ops into an ``OptimizerSpec`` ("tf" semantics).

The frontend, one file per concern:

    lowering.py    the walk from the targets, sources (inputs, variables, constants), emitting IR;
                   it is handed its rules (below), so that their modules import it and it none of them
    plan.py        what the lowering and its rules share: Plan, CannotMap, TensorList
    table.py       TF op type -> mapping, one literal (the table a new op is added to)
    elementwise.py  activations.py  linalg.py  layout.py  reductions.py  normalization.py
    vision.py  language.py  losses.py
                   the mappings, one TF op -> one or a few IR ops, by the families of device/ops/
    patterns.py    several TF ops -> one IR op: Keras Dropout, Embedding, LayerNormalization,
                   BatchNormalization, gelu written out in ops
    loops.py       a static-length tf.while_loop (Keras LSTM, GRU) unrolled; its TensorLists
    constants.py   folding stateless subgraphs of constants into values
    optimizer.py   the Apply ops train_op runs -> OptimizerSpec
    variables.py   weights, state and optimizer slots between a session and the emulator
    tensors.py     what they all read of a TF graph (shapes, dtypes, operands, source lines)
"""

from __future__ import annotations

import tensorflow as tf

from device import ir
from device.capture.tf import loops
from device.capture.tf.elementwise import STOP_GRADIENT_ATTR
from device.capture.tf.lowering import Lowering, Rules
from device.capture.tf.optimizer import learning_rate_tensor, optimizer_spec, update_views, updated_variables
from device.capture.tf.patterns import PATTERNS
from device.capture.tf.table import MAPPINGS
from device.capture.tf.tensors import reachable
from device.capture.tf.variables import (optimizer_slots, read_optimizer_state, read_state, read_variables,
                                         read_weights, write_optimizer_state, write_variables, write_weights)
from device.dtypes import PRECISIONS
from device.optimizer import DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, MAX_LOSS_SCALE, MIN_LOSS_SCALE
from zoo_base.errors import UserError

__all__ = ["STOP_GRADIENT_ATTR", "capture", "learning_rate", "optimizer_slots", "read_optimizer_state", "read_state",
           "read_variables", "read_weights", "write_optimizer_state", "write_variables", "write_weights"]

# what the lowering tries on each tensor, in this order: a loop or TensorList op, a pattern, a mapping
_RULES = Rules(loop=loops.plan, patterns=PATTERNS, mappings=MAPPINGS)


def capture(tf_graph: tf.Graph, *, inputs: list[tf.Tensor], loss: tf.Tensor | None,
            train_op: tf.Operation | None = None, outputs: dict[str, tf.Tensor] | None = None,
            precision: str = "float32", max_gradient_norm: float | None = None,
            max_gradient_value: float | None = None, loss_scale: float | str | None = None,
            initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE,
            steps_per_increase: int = DEFAULT_STEPS_PER_INCREASE, min_loss_scale: float = MIN_LOSS_SCALE,
            max_loss_scale: float = MAX_LOSS_SCALE,
            session: tf.compat.v1.Session | None = None) -> ir.Graph:
    """Lower the forward pass of ``tf_graph`` (up to ``loss`` and ``outputs``) to the device IR.

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
    with tf_graph.as_default():
        # the ops train_op runs, tf.cond branches included (dynamic loss scaling wraps the update in one)
        views = update_views(reachable([train_op])) if train_op is not None else []
        updated = updated_variables(views) if train_op is not None else None
        lowering = Lowering(tf_graph, inputs, train_op, updated, _RULES)
        try:
            graph = lowering.run(loss, outputs or {}, training=train_op is not None)
        finally:
            lowering.close()
        graph.precision = precision
        if train_op is not None:
            graph.optimizer = optimizer_spec(views, train_op, list(graph.params.values()), session)
            graph.optimizer.max_gradient_norm = max_gradient_norm
            graph.optimizer.max_gradient_value = max_gradient_value
            graph.optimizer.loss_scale = loss_scale
            graph.optimizer.initial_loss_scale = initial_loss_scale
            graph.optimizer.steps_per_increase = steps_per_increase
            graph.optimizer.min_loss_scale = min_loss_scale
            graph.optimizer.max_loss_scale = max_loss_scale
    return graph


def learning_rate(tf_graph: tf.Graph, train_op, graph: ir.Graph) -> tf.Tensor | None:
    """The tensor of train_op's learning rate when it is not a constant (a schedule: the runner
    evaluates it at every step), else None: it is ``graph.optimizer.hyper["lr"]``."""
    if not isinstance(train_op, tf.Operation):
        train_op = train_op.op
    with tf_graph.as_default():
        return learning_rate_tensor(update_views(reachable([train_op])), list(graph.params.values()))
