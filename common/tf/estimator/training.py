"""``train_and_evaluate(estimator, TrainSpec(...), EvalSpec(...))``, as tf.estimator had it.

Here every saved checkpoint is evaluated as it is saved (CerebrasEstimator.train_and_evaluate),
so EvalSpec's timing arguments (throttle_secs, start_delay_secs) have nothing to time:
given, they are named once as ignored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

logger = logging.getLogger("zoo")


@dataclass(frozen=True)
class TrainSpec:
    input_fn: Callable
    max_steps: int | None = None
    hooks: tuple = ()


@dataclass(frozen=True)
class EvalSpec:
    input_fn: Callable
    steps: int | None = None  # None: the whole eval set
    name: str | None = None
    hooks: tuple = ()
    exporters: Any = None
    start_delay_secs: int | None = None
    throttle_secs: int | None = None


def train_and_evaluate(estimator, train_spec: TrainSpec, eval_spec: EvalSpec) -> dict[str, float] | None:
    """Train to train_spec.max_steps, evaluating each checkpoint as it is saved; the last metrics."""
    for name in ("start_delay_secs", "throttle_secs"):
        if getattr(eval_spec, name) is not None:
            logger.info("EvalSpec.%s is ignored: each checkpoint is evaluated as it is saved", name)
    if train_spec.hooks or eval_spec.hooks or eval_spec.exporters:
        logger.warning("TrainSpec/EvalSpec hooks and exporters are not run here")
    return estimator.train_and_evaluate(train_spec.input_fn, eval_spec.input_fn, max_steps=train_spec.max_steps,
                                        eval_steps=eval_spec.steps)
