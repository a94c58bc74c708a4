"""What a model_fn returns: ``EstimatorSpec`` (in place of tf.estimator's) or ``CSEstimatorSpec``.

    TRAIN    loss, train_op            (train_op: optimizer.minimize(loss, global_step))
    EVAL     loss, and metrics as host_call=(fn, [tensors]) or eval_metric_ops={name: (value, update_op)}
    PREDICT  predictions               (a tensor or a dict of tensors; labels is None)

``host_call`` is how metrics reach the device: the device computes the tensors and the
host runs ``fn(*tensors)``, which returns ``{name: tf.compat.v1.metrics.*(...)}``. On a CPU
run the runner calls ``fn`` in the graph, which makes ordinary eval metrics of it. The
runner checks a spec against its mode and names the model_fn when something is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence


@dataclass(frozen=True)
class EstimatorSpec:
    mode: str
    predictions: Any = None  # tf.Tensor or {name: tf.Tensor}
    loss: Any = None  # scalar tf.Tensor
    train_op: Any = None  # tf.Operation or tf.Tensor
    eval_metric_ops: Mapping[str, tuple[Any, Any]] | None = None  # {name: (value, update_op)}
    # tf.estimator's session hooks: taken when empty (the vendor's model_fns pass a list that is empty unless
    # they accumulate gradients); the runner runs no hook, so a hook given is one error line (graph.py)
    training_hooks: Sequence[Any] = ()
    evaluation_hooks: Sequence[Any] = ()
    prediction_hooks: Sequence[Any] = ()


@dataclass(frozen=True)
class CSEstimatorSpec(EstimatorSpec):
    # (fn, tensors): fn(*tensors) -- or fn(**tensors) for a dict -- returns {name: (value, update_op)}
    host_call: tuple[Callable[..., Mapping[str, tuple[Any, Any]]], Sequence[Any] | Mapping[str, Any]] | None = None
