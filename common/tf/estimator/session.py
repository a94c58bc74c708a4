"""A built graph in an initialised TF session, and a checkpoint restored into it.

The session is what the steps of every backend run in (common/tf/estimator/cs_estimator.py:
SessionSteps, common/tf/device_run.py: EmulatorSteps, whose host it is).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import tensorflow as tf

from common.errors import UserError
from common.tf.estimator import checkpoints
from common.tf.estimator.graph import ModelGraph
from common.tf.estimator.run_config import RunConfig
from common.tf.estimator.tf_logs import quiet_tf_logs

logger = logging.getLogger("zoo")


class GraphSession:
    """A built graph with its session, initialised; ``restore`` loads a checkpoint into it.

    ``weights=False`` (a compile, which reads shapes only) leaves the model's trainable
    variables and their optimizer slots (``<variable>/Adam``, ...) uninitialised, so that no
    memory is allocated for them: a model whose weights exceed the host's memory compiles.
    The other variables (the global step a learning-rate schedule reads, the loss scale,
    Adam's beta powers) are initialised as usual."""

    def __init__(self, built: ModelGraph, config: RunConfig, weights: bool = True):
        self.built = built
        with built.graph.as_default():
            variables = tf.compat.v1.global_variables()
            if not weights:
                variables = [v for v in variables if not is_weight_or_slot(v, built.graph)]
            self._init = tf.group(tf.compat.v1.variables_initializer(variables),
                                  tf.compat.v1.local_variables_initializer(), tf.compat.v1.tables_initializer())
            self.local_init = tf.compat.v1.local_variables_initializer()
        from common.tf.estimator.distribute import session_options

        target, session_config = session_options(built.strategy, config.session_config)
        self.session = tf.compat.v1.Session(target, graph=built.graph, config=session_config)
        self._restorers: dict[frozenset, Any] = {}
        self.session.run([self._init, built.iterator.initializer])

    def restore(self, path: str, select: Callable[[str], bool] | None = None) -> None:
        """Every variable of the graph that the checkpoint holds, and the input position when it
        holds one for this input pipeline; a checkpoint of another model is a UserError. With
        ``select`` (a warm start, warm_start.py): only the trainable variables it selects that the
        checkpoint holds; the rest, the global step and the input position start afresh."""
        shapes = checkpoints.read_checkpoint(path)
        trainable = {v.op.name for v in self.built.graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
        present, missing = [], []
        for v in self.built.variables:
            name = v.op.name
            if select is not None and not (name in trainable and select(name)):
                continue
            if name not in shapes:
                missing.append(name)
            elif list(shapes[name]) != v.shape.as_list():
                raise UserError(f"{path}: '{name}' has shape {list(shapes[name])} there, but the model's is "
                                f"{v.shape.as_list()} (a checkpoint of another model or config?)")
            else:
                present.append(v)
        if select is not None:
            if not present:
                raise UserError(f"{path}: holds none of the variables the warm start selects; a checkpoint of "
                                f"another model?")
            logger.info("warm start from %s: %d variables; initialised afresh: %s", path, len(present),
                        ", ".join(sorted(trainable - {v.op.name for v in present})) or "none of the model's")
        lost = [name for name in missing if name in trainable]
        if lost and select is None:
            raise UserError(f"{path}: holds no '{lost[0]}'" + (f" (nor {len(lost) - 1} more model variables)"
                            if len(lost) > 1 else "") + "; a checkpoint of another model?")
        if missing and select is None:
            logger.info("not in %s, initialised afresh: %s", path, ", ".join(missing))
        key = frozenset(v.op.name for v in present)
        if key not in self._restorers:
            with self.built.graph.as_default():
                self._restorers[key] = tf.compat.v1.train.Saver(var_list=present) if present else None
        if self._restorers[key] is not None:
            try:
                with self.built.graph.as_default(), quiet_tf_logs():
                    self._restorers[key].restore(self.session, path)
            except tf.errors.OpError as e:
                raise UserError(f"{path}: corrupt or unreadable checkpoint ({checkpoints.op_error_line(e)})") from None
        saveable = self.built.iterator_saveable
        if select is None and saveable is not None and all(spec.name in shapes for spec in saveable.specs):
            try:
                with self.built.graph.as_default(), quiet_tf_logs():
                    tf.compat.v1.train.Saver(var_list=[saveable]).restore(self.session, path)
            except tf.errors.OpError:
                self.session.run(self.built.iterator.initializer)
                logger.warning("%s: the input position there is for another input pipeline; the data starts "
                               "from its beginning", path)
        if select is None:
            logger.info("restored %s", path)

    def step(self) -> int:
        return int(self.session.run(self.built.global_step))

    def close(self) -> None:
        self.session.close()


def is_weight_or_slot(variable, graph: tf.Graph) -> bool:
    """A trainable variable, or an optimizer slot TF named after one (``<variable>/<slot>``)."""
    trainable = {v.op.name for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    name = variable.op.name
    return name in trainable or any(name.startswith(t + "/") for t in trainable)


