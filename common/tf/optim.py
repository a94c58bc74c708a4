"""The training op of a TF model, from params: optimizer, LR schedule, clipping, loss scaling.

    train_op = build_train_op(loss, params)      # in model_fn, TRAIN mode

The params keys are the PyTorch side's (common/pytorch/optim.py), with the same meaning:

    optimizer:
      optimizer_type: adamw          # sgd | momentum | adam | adamw
      learning_rate:                 # a number, one schedule, or a list run in sequence
        - {scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.001, steps: 100}
        - {scheduler: Cosine, initial_learning_rate: 0.001, end_learning_rate: 0.0, steps: 900}
      weight_decay: 0.01             # coupled L2 for sgd/momentum/adam, decoupled for adamw
      weight_decay_exclude: [bias, norm]
      max_gradient_norm: 1.0         # or max_gradient_value
      loss_scaling_factor: dynamic   # 1.0 (none), a number, or dynamic (mixed precision only)

Schedules are common/schedules.py's: parsed and validated there, built here as graph ops.
The learning rate is a graph tensor of the global step (computed in float64, as the
PyTorch side computes it in Python floats), so a checkpoint resumes the schedule exactly.
The runner finds it (and the loss scale) in the graph collections below for its logs.

Mixed precision itself is the runner's Keras dtype policy (mixed_bfloat16 / mixed_float16:
fp32 variables, 16-bit compute); model code casts its logits to float32 before the loss.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Mapping, Sequence

import tensorflow as tf

from common.errors import UserError
from common.precision import loss_scaling
from common.schedules import Schedule, Segment, parse_schedule
from device.api import MAX_LOSS_SCALE, MIN_LOSS_SCALE, excluded_from_weight_decay

logger = logging.getLogger("zoo")

LEARNING_RATE_COLLECTION = "zoo_learning_rate"
LOSS_SCALE_COLLECTION = "zoo_loss_scale"  # the scale (a variable when dynamic)
LOSS_SCALE_STEPS_COLLECTION = "zoo_loss_scale_good_steps"  # dynamic: finite steps since the last change

# --- learning-rate schedules -------------------------------------------------------------

def _segment_tensor(segment: Segment, step: tf.Tensor) -> tf.Tensor:
    """The formula of common/schedules.py's Segment, as float64 ops of the local ``step``."""
    if segment.kind == "constant":
        return tf.constant(segment.initial, tf.float64)
    if segment.kind == "exponential":
        exponent = step / segment.decay_steps
        if segment.staircase:
            exponent = tf.floor(exponent)
        return segment.initial * tf.pow(tf.constant(segment.decay_rate, tf.float64), exponent)
    if segment.kind == "piecewise":
        # index = how many boundaries the step has reached (step == boundary: the next value)
        index = tf.reduce_sum(tf.cast(step >= tf.constant(segment.boundaries, tf.float64), tf.int32))
        return tf.gather(tf.constant(segment.values, tf.float64), index)
    progress = tf.minimum(step, float(segment.steps)) / segment.steps
    if segment.kind == "cosine":
        return segment.end + (segment.initial - segment.end) * 0.5 * (1.0 + tf.cos(math.pi * progress))
    return (segment.initial - segment.end) * tf.pow(1.0 - progress, segment.power) + segment.end


def learning_rate(spec: Any, global_step: tf.Tensor, where: str = "optimizer.learning_rate",
                  reset_steps: bool = True) -> tf.Tensor:
    """The float32 learning rate at ``global_step`` from ``params["optimizer"]["learning_rate"]``
    (``reset_steps=False``: the vendor's disable_lr_steps_reset, each segment reads the global step)."""
    schedule = Schedule(parse_schedule(spec, where), reset_steps)
    step = tf.cast(global_step, tf.float64)
    lr = None
    for segment, start in zip(schedule.segments, schedule.starts):
        value = _segment_tensor(segment, step - start if reset_steps else step)
        # later segments take over from their start step on
        lr = value if lr is None else tf.where(step >= start, value, lr)
    return tf.cast(lr, tf.float32, name="learning_rate")


# --- optimizers --------------------------------------------------------------------------

class AdamWOptimizer(tf.compat.v1.train.AdamOptimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), as torch.optim.AdamW: before
    the Adam update, ``var -= lr * weight_decay * var`` for every variable not excluded."""

    def __init__(self, learning_rate, weight_decay: float, decay_var_names: set[str], **kwargs):
        super().__init__(learning_rate, **kwargs)
        self._weight_decay = weight_decay
        self._decay_var_names = decay_var_names

    def _decayed(self, grad, var, apply):
        if var.op.name not in self._decay_var_names:
            return apply()
        lr = tf.cast(self._lr_t, var.dtype.base_dtype)
        # after the gradient: it needs the whole forward pass, so no read of this step sees
        # the decayed variable (else a race, and results that differ from run to run)
        with tf.control_dependencies([grad]):
            decay = var.assign_sub(lr * self._weight_decay * var, read_value=False)
        with tf.control_dependencies([decay]):
            return apply()

    def _resource_apply_dense(self, grad, var):
        return self._decayed(grad, var, lambda: super(AdamWOptimizer, self)._resource_apply_dense(grad, var))

    def _apply_dense(self, grad, var):
        return self._decayed(grad, var, lambda: super(AdamWOptimizer, self)._apply_dense(grad, var))

    # a gathered variable (an embedding table) gets a sparse gradient: it decays whole all the
    # same, every row, as torch.optim.AdamW decays the table whose gradient is dense
    def _resource_apply_sparse(self, grad, var, indices):
        return self._decayed(grad, var, lambda: super(AdamWOptimizer, self)._resource_apply_sparse(grad, var, indices))

    def _apply_sparse(self, grad, var):
        return self._decayed(grad.values, var, lambda: super(AdamWOptimizer, self)._apply_sparse(grad, var))


class _NoBiasCorrection:
    """Adam without bias correction (the vendor's use_bias_correction / correct_bias: false):
    TF's update divides by 1 - beta^t through the beta powers; with powers of 0 it divides by 1."""

    def _get_beta_accumulators(self):
        zero = tf.constant(0.0)
        return zero, zero

    def _finish(self, update_ops, name_scope):
        return tf.group(*update_ops, name=name_scope)  # no beta powers to advance


class AdamNoBiasCorrection(_NoBiasCorrection, tf.compat.v1.train.AdamOptimizer):
    pass


class AdamWNoBiasCorrection(_NoBiasCorrection, AdamWOptimizer):
    pass


def build_optimizer(optimizer_params: Mapping, lr: tf.Tensor, var_list: Sequence[tf.Variable] = ()
                    ) -> tf.compat.v1.train.Optimizer:
    """The tf.compat.v1.train optimizer of ``params["optimizer"]`` (adamw decays ``var_list``'s
    variables whose names contain none of ``weight_decay_exclude``)."""
    p = optimizer_params
    kind = p["optimizer_type"]
    if kind == "sgd":
        return tf.compat.v1.train.GradientDescentOptimizer(lr)
    if kind == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(lr, p["momentum"], use_nesterov=p["nesterov"])
    adam = {"beta1": p["beta1"], "beta2": p["beta2"], "epsilon": p["epsilon"]}
    corrected = p.get("correct_bias", True)
    if kind == "adam":
        return (tf.compat.v1.train.AdamOptimizer if corrected else AdamNoBiasCorrection)(lr, **adam)
    if kind == "adamw":
        names = {v.op.name for v in var_list if not excluded_from_weight_decay(v.op.name, p["weight_decay_exclude"])}
        return (AdamWOptimizer if corrected else AdamWNoBiasCorrection)(lr, p["weight_decay"], names, **adam)
    raise UserError(f"optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got {kind!r}")


# --- the train op ------------------------------------------------------------------------

def in_replica_of_several() -> int:
    """The number of replicas when called in a replica of a tf.distribute strategy with several
    (model_fn under runconfig.train_distribute: common/tf/estimator/distribute.py), else 1."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return 1
    return tf.distribute.get_strategy().num_replicas_in_sync


NON_FINITE = "zoo non-finite: "  # the start of a check_numerics message (common/tf/estimator reads it)


def check_finite(loss: tf.Tensor, grads: list, variables: list[tf.Variable]) -> list:
    """``grads``, each passed through a check that stops the step when the loss or a gradient
    is NaN or inf, before any variable changes: without loss scaling nothing skips such a
    step, and it would leave NaN weights for the next checkpoint. The loss is checked first,
    so a NaN loss is reported as the loss, not as its gradients."""
    loss_checked = tf.debugging.check_numerics(loss, f"{NON_FINITE}the loss")
    checked = []
    with tf.control_dependencies([loss_checked]):
        for g, v in zip(grads, variables):
            message = f"{NON_FINITE}the gradient of {v.op.name}"
            if isinstance(g, tf.IndexedSlices):  # a gathered table's gradient: its rows only
                checked.append(tf.IndexedSlices(tf.debugging.check_numerics(g.values, message), g.indices,
                                                g.dense_shape))
            else:
                checked.append(tf.debugging.check_numerics(g, message))
    return checked


def build_train_op(loss: tf.Tensor, params: Mapping, global_step: tf.Variable | None = None,
                   var_list: Sequence[tf.Variable] | None = None) -> tf.Operation:
    """``minimize(loss)`` with everything ``params`` say: schedule, optimizer, weight decay,
    loss scaling, clipping; increments the global step once per call of the op."""
    p = params["optimizer"]
    global_step = global_step if global_step is not None else tf.compat.v1.train.get_or_create_global_step()
    var_list = list(var_list if var_list is not None else tf.compat.v1.trainable_variables())
    if not var_list:
        raise UserError("optimizer: the model has no trainable variables")
    lr = learning_rate(p["learning_rate"], global_step, reset_steps=not p.get("disable_lr_steps_reset", False))
    tf.compat.v1.add_to_collection(LEARNING_RATE_COLLECTION, lr)
    optimizer = build_optimizer(p, lr, var_list)

    scaling = loss_scaling(params)
    replicas = in_replica_of_several()
    in_strategy = tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
    if scaling is not None and (replicas > 1 or in_strategy):  # one replica too: a tf.cond cannot hold its merge
        raise UserError(f"optimizer.loss_scaling_factor={p['loss_scaling_factor']!r} with runconfig.train_distribute: "
                        f"loss scaling skips steps with a tf.cond around the update, which the replicas cannot "
                        f"share; train data parallel in bfloat16 or float32")
    if scaling == "dynamic":
        scale = tf.compat.v1.Variable(p["initial_loss_scale"], trainable=False, dtype=tf.float32, name="loss_scale")
        good_steps = tf.compat.v1.Variable(0, trainable=False, dtype=tf.int64, name="loss_scale_good_steps")
        tf.compat.v1.add_to_collection(LOSS_SCALE_STEPS_COLLECTION, good_steps)
    elif scaling is not None:
        scale = tf.constant(scaling, tf.float32, name="loss_scale")
    if scaling is not None:
        tf.compat.v1.add_to_collection(LOSS_SCALE_COLLECTION, scale)
        scaled_loss = loss * tf.cast(scale, loss.dtype)
    else:
        scaled_loss = loss

    grads_and_vars = optimizer.compute_gradients(scaled_loss, var_list)
    missing = [v.op.name for g, v in grads_and_vars if g is None]
    if len(missing) == len(var_list):
        raise UserError("optimizer: the loss depends on none of the trainable variables")
    grads_and_vars = [(g, v) for g, v in grads_and_vars if g is not None]
    grads = [g for g, _ in grads_and_vars]
    variables = [v for _, v in grads_and_vars]
    if replicas > 1:
        # the global batch's gradient on every replica, before clipping and weight decay see it: the
        # replicas' gradients added up (compute_gradients divided a mean loss by the replicas, as
        # tf.estimator had the v1 optimizers do: common/tf/estimator/distribute.py)
        grads = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, grads)
    if scaling is None:
        grads = check_finite(loss, grads, variables)
    # one step as device/optimizer.py states it: unscale -> skip if non-finite -> clip by value
    # -> clip by global norm -> weight decay -> update rule
    if scaling is not None:
        grads = [g / tf.cast(scale, g.dtype) for g in grads]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    if p["max_gradient_value"] is not None:
        limit = p["max_gradient_value"]
        grads = [tf.clip_by_value(g, -limit, limit) for g in grads]
    if p["max_gradient_norm"] is not None:
        grads, _ = tf.clip_by_global_norm(grads, p["max_gradient_norm"])
    if p["weight_decay"] and p["optimizer_type"] != "adamw":
        # coupled L2 on the clipped gradient, as torch.optim's weight_decay: grad += weight_decay * var
        grads = [g if excluded_from_weight_decay(v.op.name, p["weight_decay_exclude"]) else g + p["weight_decay"] * v
                 for g, v in zip(grads, variables)]
    if replicas > 1:
        # apply_gradients adds the replicas' gradients up once more (a v1 optimizer's merge): each
        # hands in 1/replicas of the global one (exact for 2 replicas: x/2 + x/2 == x)
        grads = [g / replicas for g in grads]
    grads_and_vars = list(zip(grads, variables))

    if scaling is None:
        return optimizer.apply_gradients(grads_and_vars, global_step=global_step)

    # Loss scaling skips the update when a gradient overflowed; the global step counts every
    # step. A fixed scale keeps its value; a dynamic one halves, and doubles after
    # steps_per_increase finite steps (within [MIN, MAX]_LOSS_SCALE, as the device).
    apply = tf.cond(finite, lambda: tf.group(optimizer.apply_gradients(grads_and_vars)), tf.no_op)
    if scaling != "dynamic":
        with tf.control_dependencies([apply]):
            return tf.group(global_step.assign_add(1), name="train_op")
    with tf.control_dependencies([apply]):
        grown = good_steps + 1 >= p["steps_per_increase"]
        new_scale = tf.where(finite, tf.where(grown, tf.minimum(scale * 2.0, p.get("max_loss_scale", MAX_LOSS_SCALE)),
                                              scale),
                             tf.maximum(scale / 2.0, MIN_LOSS_SCALE))
        new_good = tf.where(finite & ~grown, good_steps + 1, tf.zeros_like(good_steps))
        update_scale = tf.group(scale.assign(new_scale), good_steps.assign(new_good))
    with tf.control_dependencies([update_scale]):
        return tf.group(global_step.assign_add(1), name="train_op")
