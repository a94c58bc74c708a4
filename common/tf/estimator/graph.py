"""One mode's graph: input_fn -> iterator -> model_fn -> a checked spec, its metrics and savers.

Every check of what a user's input_fn and model_fn hand back lives here, so each failure
is one line naming the function (file:line) and what it should have returned.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from common.errors import UserError, where
from common.tf.estimator.cs_estimator_spec import EstimatorSpec
from common.tf.estimator.mode_keys import ModeKeys
from common.tf.estimator.utils import summaries_enabled
from common.tf.optim import LEARNING_RATE_COLLECTION, LOSS_SCALE_COLLECTION

logger = logging.getLogger("zoo")

# mixed_precision.dtype -> the Keras dtype policy (fp32 variables, 16-bit compute)
KERAS_POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


@dataclass
class ModelGraph:
    """A built graph of one mode and the tensors the runner fetches from it."""

    graph: tf.Graph
    mode: str
    spec: EstimatorSpec
    features: Any
    labels: Any
    iterator: Any
    global_step: tf.Variable
    batch_size: int | None  # None: the dataset's batch dimension is unknown
    static_shapes: bool
    dynamic_batch_size: tf.Tensor | None = None  # the batch dimension at run time, where it is unknown
    train_op: Any = None  # TRAIN: the spec's train_op, plus the Keras layers' state updates
    learning_rate: tf.Tensor | None = None
    loss_scale: tf.Tensor | None = None
    summary: tf.Tensor | None = None  # merged tf.compat.v1.summary scalars of the model_fn
    metrics: dict[str, tuple[tf.Tensor, Any]] = field(default_factory=dict)  # EVAL: {name: (value, update)}
    metrics_update: Any = None  # EVAL: every metric's update op
    predictions: dict[str, tf.Tensor] = field(default_factory=dict)  # PREDICT
    cardinality: tf.Tensor | None = None
    variables: list = field(default_factory=list)  # what a checkpoint holds, iterator aside
    iterator_saveable: Any = None
    saver: Any = None  # variables (+ the iterator position in TRAIN)
    # the 16-bit compute format of a Keras policy (or floatx) that model_fn set itself, as the
    # vendor's models do (set_policy(Policy("mixed_float16"))); None: model_fn set none
    model_precision: str | None = None
    strategy: Any = None  # TRAIN under RunConfig.train_distribute: the tf.distribute strategy it was built for


def call_input_fn(input_fn: Callable, params: Mapping, mode: str):
    """``input_fn(params, mode)``, or ``input_fn(params)`` when it takes one argument, or a second one that
    tf.estimator passes by name (``input_context``, ``config``), left to its default."""
    try:
        signature = inspect.signature(input_fn)
    except (TypeError, ValueError):
        return input_fn(params, mode)
    named = signature.parameters.get("mode")
    if named is not None and named.kind == named.KEYWORD_ONLY:  # input_fn(params, *, mode=...)
        return input_fn(params, mode=mode)
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    # tf.estimator passes input_context (under a tf.distribute strategy) and config by name, never the mode:
    # the vendor's input functions are input_fn(params, input_context=None)
    by_name = len(positional) >= 2 and positional[1].name in ("input_context", "config")
    takes_mode = named is not None or (len(positional) >= 2 and not by_name) or \
        any(p.kind == p.VAR_POSITIONAL for p in positional)
    return input_fn(params, mode) if takes_mode else input_fn(params)


def _shapes(structure: Any) -> str:
    return ", ".join(str(tuple(s.shape.as_list()) if s.shape.rank is not None else "unknown rank")
                     for s in tf.nest.flatten(structure))


def _dataset_element(dataset: Any, input_fn: Callable, mode: str):
    if not isinstance(dataset, tf.data.Dataset):
        raise UserError(f"{where(input_fn)} returned {type(dataset).__name__}; an input_fn returns a "
                        f"tf.data.Dataset of (features, labels) batches")
    spec = dataset.element_spec
    if mode != ModeKeys.PREDICT and not (isinstance(spec, tuple) and len(spec) == 2):
        raise UserError(f"{where(input_fn)}: the dataset yields {type(spec).__name__} elements; in {mode} mode "
                        f"it must yield (features, labels) pairs")
    return spec


def _batch_size(element_spec: Any, input_fn: Callable) -> tuple[int | None, bool]:
    """The static batch size, and whether every shape is static; warns once when not."""
    specs = [s for s in tf.nest.flatten(element_spec) if isinstance(s, tf.TensorSpec)]
    static = all(s.shape.is_fully_defined() for s in specs)
    first = specs[0].shape if specs else tf.TensorShape(None)
    batch = first[0] if first.rank else None
    if not static:
        logger.warning("%s: the dataset's shapes are not static (%s); this runs on the CPU, but the device "
                       "needs static shapes: batch with drop_remainder=True (train_input.drop_last: true)",
                       where(input_fn), _shapes(element_spec))
    return batch, static


def _check_spec(spec: Any, mode: str, model_fn: Callable, graph: tf.Graph) -> EstimatorSpec:
    fn = where(model_fn)
    if not isinstance(spec, EstimatorSpec):
        raise UserError(f"{fn} returned {type(spec).__name__}; a model_fn returns an EstimatorSpec or "
                        f"CSEstimatorSpec (from common.tf.estimator)")
    if spec.mode != mode:
        raise UserError(f"{fn} returned a spec for mode {spec.mode!r} when called in mode {mode!r}")
    for field in ("training_hooks", "evaluation_hooks", "prediction_hooks"):
        hooks = list(getattr(spec, field, None) or ())
        if hooks:
            raise UserError(f"{fn}: the spec's {field} hold {', '.join(type(h).__name__ for h in hooks)}; the runner "
                            f"runs no session hook (it logs, saves and stops by itself): leave {field} empty")
    host_call = getattr(spec, "host_call", None)
    if host_call is not None and spec.eval_metric_ops is not None:
        raise UserError(f"{fn}: the spec has both host_call and eval_metric_ops; give eval metrics through "
                        f"host_call only (the device computes them on the host)")
    if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
        if spec.loss is None:
            raise UserError(f"{fn}: the {mode} spec has no loss")
        if not isinstance(spec.loss, tf.Tensor) or spec.loss.graph is not graph:
            raise UserError(f"{fn}: loss must be a tensor of the graph model_fn builds, got {type(spec.loss).__name__}")
        if spec.loss.shape.rank != 0 or not spec.loss.dtype.is_floating:
            raise UserError(f"{fn}: loss must be a float scalar, got {spec.loss.dtype.name} of shape {spec.loss.shape}")
    if mode == ModeKeys.TRAIN:
        if spec.train_op is None:
            raise UserError(f"{fn}: the TRAIN spec has no train_op (e.g. common.tf.optim.build_train_op(loss, params) "
                            f"or optimizer.minimize(loss, global_step))")
        if not isinstance(spec.train_op, (tf.Operation, tf.Tensor)) or spec.train_op.graph is not graph:
            raise UserError(f"{fn}: train_op must be an op of the graph model_fn builds, "
                            f"got {type(spec.train_op).__name__}")
    if mode == ModeKeys.PREDICT and spec.predictions is None:
        raise UserError(f"{fn}: the PREDICT spec has no predictions")
    return spec


def _metric_ops(spec: EstimatorSpec, model_fn: Callable) -> dict[str, tuple[tf.Tensor, Any]]:
    """EVAL metrics: host_call's fn run in the graph (what the host does for the device), or
    eval_metric_ops, plus the mean loss under ``loss``."""
    host_call = getattr(spec, "host_call", None)
    if host_call is not None:
        if not (isinstance(host_call, (tuple, list)) and len(host_call) == 2 and callable(host_call[0])):
            raise UserError(f"{where(model_fn)}: host_call must be (fn, [tensors]), got {host_call!r}")
        fn, tensors = host_call
        metrics = fn(**tensors) if isinstance(tensors, Mapping) else fn(*tensors)
        origin = f"host_call fn {where(fn)}"
    else:
        metrics, origin = spec.eval_metric_ops or {}, f"{where(model_fn)}: eval_metric_ops"
    if not isinstance(metrics, Mapping):
        raise UserError(f"{origin} returned {type(metrics).__name__}; expected a dict of "
                        f"{{name: tf.compat.v1.metrics.*(...)}} (value, update_op) pairs")
    result = {}
    for name, pair in metrics.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise UserError(f"{origin}: metric {name!r} is not a (value, update_op) pair such as "
                            f"tf.compat.v1.metrics.accuracy returns")
        result[str(name)] = (pair[0], pair[1])
    if "loss" not in result:
        result["loss"] = tf.compat.v1.metrics.mean(spec.loss, name="mean_loss")
    return result


def _ancestors(targets: list) -> set:
    """Every op that ``targets`` depend on (data and control inputs)."""
    seen, stack = set(), [t.op if isinstance(t, tf.Tensor) else t for t in targets]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return seen


def components(variable) -> tuple:
    """A distributed variable's per-device variables (under a strategy); else the variable itself."""
    return tuple(variable._values) if isinstance(variable, tf.distribute.DistributedValues) else (variable,)


def _run_state_updates(graph: tf.Graph, train_op: Any) -> Any:
    """Run the state updates of Keras 3 layers with every training step.

    In a TF1 graph, Keras 3 layers update their non-trainable state with assign ops that
    nothing depends on: a SeedGenerator's seed (every step would reuse the first step's
    dropout mask) and BatchNormalization's moving mean and variance (they would never
    move). Here each such assign runs with the train op, after the step's reads of its
    variable, so the masks follow one deterministic stream that a checkpoint (which holds
    the seed variable) resumes, and the running statistics update as in eager Keras.
    """
    # the initialisers of every variable (a local one too: a running tf.compat.v1.metrics value in a
    # training model_fn) are not state updates: run with the step, they would reset it every step
    variables = tf.compat.v1.global_variables() + tf.compat.v1.local_variables()
    initializers = {c.initializer for v in variables for c in components(v)}
    trainable = {c.handle.op for v in tf.compat.v1.trainable_variables() for c in components(v)}
    needed = _ancestors([train_op])
    advances = []
    for op in graph.get_operations():
        if op.type != "AssignVariableOp" or op in initializers or op in needed:
            continue
        handle = op.inputs[0].op
        if handle.type != "VarHandleOp" or handle in trainable:
            continue
        reads = [c for c in handle.outputs[0].consumers() if c.type == "ReadVariableOp" and c in needed]
        op._add_control_inputs(reads)  # after this step's reads of the old value (no public API for it)
        advances.append(op)
    return tf.group(train_op, *advances, name="train_step") if advances else train_op


@contextlib.contextmanager
def keras_policy(params: Mapping, enabled: bool = True):
    """The Keras dtype policy of ``params["mixed_precision"]`` while model_fn builds layers."""
    mixed = params.get("mixed_precision", {})
    if not enabled or not mixed.get("enabled"):
        yield
        return
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(KERAS_POLICIES.get(mixed["dtype"], "mixed_bfloat16"))
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


_HALF = ("float16", "bfloat16")


@contextlib.contextmanager
def model_set_precision():
    """Around model_fn: yields a one-item list that receives the 16-bit compute format of a
    Keras global policy or floatx that model_fn set itself (else None), and puts both back as
    they were, so that one model's setting never leaks into the next graph of the process."""
    policy, floatx = keras.config.dtype_policy(), keras.config.floatx()
    found: list[str | None] = [None]
    try:
        yield found
    finally:
        now_policy, now_floatx = keras.config.dtype_policy(), keras.config.floatx()
        if now_policy.name != policy.name and now_policy.compute_dtype in _HALF:
            found[0] = now_policy.compute_dtype
        elif now_floatx != floatx and now_floatx in _HALF:
            found[0] = now_floatx
        keras.config.set_dtype_policy(policy)
        keras.config.set_floatx(floatx)


def run_precision(params: Mapping, built: ModelGraph) -> str:
    """The compute format a run of ``built`` uses on the CPU and on the device alike:
    mixed_precision.dtype when params enable it, else the 16-bit format of a Keras policy that
    model_fn set itself, else float32. The two disagreeing is an error, never a silent difference."""
    mixed = params.get("mixed_precision", {})
    asked = mixed.get("dtype") if mixed.get("enabled") else None
    if built.model_precision and asked and asked != built.model_precision:
        raise UserError(f"model_fn sets a Keras {built.model_precision} policy, params ask for "
                        f"mixed_precision.dtype {asked}: give one precision (set mixed_precision.dtype: "
                        f"{built.model_precision}, or remove the model_fn's set_global_policy)")
    return asked or built.model_precision or "float32"


def build_graph(model_fn: Callable, input_fn: Callable, mode: str, params: Mapping, seed: int,
                mixed_policy: bool = True) -> ModelGraph:
    """Build ``mode``'s graph in a fresh tf.Graph; nothing runs yet.

    ``mixed_policy``: build the layers under the Keras mixed-precision policy that params ask
    for (the CPU/GPU run); the device's graph is built in fp32 and the device rounds its
    compute to the 16-bit format itself. (The TRAIN graph on every replica of a tf.distribute
    strategy: common/tf/estimator/distribute.py's build_train_graph.)
    """
    # Keras names layers and draws default seeds from process-wide state: reset both, so
    # every build of the same model_fn gets the same variable names and initial values.
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    graph = tf.Graph()
    with graph.as_default(), keras_policy(params, mixed_policy):
        tf.compat.v1.set_random_seed(seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        dataset = call_input_fn(input_fn, params, mode)
        element_spec = _dataset_element(dataset, input_fn, mode)
        batch_size, static = _batch_size(element_spec, input_fn)
        cardinality = dataset.cardinality()
        iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
        element = iterator.get_next()
        if isinstance(element_spec, tuple) and len(element_spec) == 2:
            features, labels = element
        else:
            features, labels = element, None
        if mode == ModeKeys.PREDICT:
            labels = None
        with model_set_precision() as model_precision:
            spec = _check_spec(model_fn(features, labels, mode, params), mode, model_fn, graph)
        built = ModelGraph(graph=graph, mode=mode, spec=spec, features=features, labels=labels, iterator=iterator,
                      global_step=global_step, batch_size=batch_size, static_shapes=static, cardinality=cardinality,
                      model_precision=model_precision[0])
        if batch_size is None:
            built.dynamic_batch_size = tf.shape(tf.nest.flatten(features)[0])[0]
        if mode == ModeKeys.TRAIN:
            built.train_op = _run_state_updates(graph, spec.train_op)
            built.learning_rate = _single(graph, LEARNING_RATE_COLLECTION)
            built.loss_scale = _single(graph, LOSS_SCALE_COLLECTION)
            built.summary = tf.compat.v1.summary.merge_all() if summaries_enabled() else None
        elif mode == ModeKeys.EVAL:
            built.metrics = _metric_ops(spec, model_fn)
            built.metrics_update = tf.group(*[update for _, update in built.metrics.values()])
        else:
            predictions = spec.predictions
            built.predictions = dict(predictions) if isinstance(predictions, Mapping) else {"predictions": predictions}
        built.variables = tf.compat.v1.global_variables()
        if mode == ModeKeys.TRAIN:
            # the input position travels with the checkpoint, so a resumed run reads the batches
            # an uninterrupted run would have read ("warn": an input with state TF cannot save, a
            # tf.py_function map say, is saved all the same, its position with it, where "fail" refuses)
            built.iterator_saveable = tf.data.experimental.make_saveable_from_iterator(
                iterator, external_state_policy="warn")
        built.saver = tf.compat.v1.train.Saver(
            var_list=built.variables + ([built.iterator_saveable] if built.iterator_saveable else []),
            max_to_keep=None, save_relative_paths=True)
    return built


def _single(graph: tf.Graph, collection: str) -> tf.Tensor | None:
    values = graph.get_collection(collection)
    return values[-1] if values else None
