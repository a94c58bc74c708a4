"""CerebrasEstimator: train, evaluate, predict and compile a model_fn, as tf.estimator did.

    est = CerebrasEstimator(model_fn, config=RunConfig(model_dir="model_dir"), params=params)
    est.train(train_input_fn, max_steps=1000)
    est.evaluate(eval_input_fn)                     # the latest checkpoint -> {"accuracy": ..., "loss": ...}
    est.compile(train_input_fn, validate_only=True) # the device's validation report

Each call builds its mode's graph in a fresh ``tf.Graph`` (TF1 graph mode, as the device
needs one static graph per run), opens a ``tf.compat.v1.Session`` and restores the latest
checkpoint of ``model_dir`` (or ``warm_start_from``). Nothing is written into model_dir
before the graph is built and the checkpoint restored, so bad input leaves it as it was;
``on_ready`` (keyword-only) runs at that point (the runner writes params_<mode>.yaml there).

The train, eval and predict loops are here, once; each step comes from the step backend
of ``config.device``: SessionSteps (the TF session's own, cpu and gpu) or EmulatorSteps
(common/tf/device_run.py, the numpy model of the wafer), so a run on the emulator writes
the same logs, TensorBoard files and TF-format checkpoints. A backend gives

    mixed_policy                        whether the graph is built with a Keras mixed policy
    train_step(run) -> step             step(global_step, log_now) -> (loss, batch size, logged);
                                        step.before_save(global_step); step.on (for the log)
    eval_step(run) -> step              step() one batch into the metrics; step.reset (an op);
                                        step.values (the metrics' tensors); step.restored()
    predict_step(run) -> fn             fn() -> the predictions of one batch

(each raises tf.errors.OutOfRangeError when the input ends).
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import tensorflow as tf

from common.errors import NonFiniteGradient, NonFiniteLossError, UserError
from common.interrupt import Interrupted, stop_between_steps
from common.log import EvalProgress, TrainMeter, eval_line
from common.params import fill_zoo_sections
from common.summaries import ScalarWriter
from common.tf.estimator import checkpoints
from common.tf.estimator.graph import ModelGraph, build_graph, run_precision, where
from common.tf.estimator.mode_keys import ModeKeys
from common.tf.estimator.run_config import RunConfig
from common.tf.estimator.session import GraphSession
from common.tf.estimator.tf_logs import quiet_tf_logs
from common.tf.estimator.warm_start import WarmStartSettings
from common.tf.optim import NON_FINITE

logger = logging.getLogger("zoo")


def batch_count(run: GraphSession, steps: int | None) -> int | None:
    """How many batches a loop of at most ``steps`` (None: the whole dataset) runs over ``run``'s
    dataset, for the progress lines: None where tf.data does not know its cardinality."""
    cardinality = int(run.session.run(run.built.cardinality)) if run.built.cardinality is not None else -2
    if cardinality < 0:  # tf.data.INFINITE_CARDINALITY or UNKNOWN_CARDINALITY
        return steps
    return cardinality if steps is None else min(steps, cardinality)


def predictions_of(batch: dict[str, np.ndarray], single_examples: bool) -> Iterator[dict[str, np.ndarray]]:
    """A batch of predictions as predict yields it: whole, or one example at a time."""
    if not single_examples:
        yield batch
        return
    for i in range(len(next(iter(batch.values())))):
        yield {k: v[i] for k, v in batch.items()}


class CerebrasEstimator:
    """tf.estimator.Estimator's contract for ``model_fn(features, labels, mode, params)``."""

    def __init__(self, model_fn: Callable, model_dir: str | None = None, config: RunConfig | None = None,
                 params: Mapping | None = None, warm_start_from: str | WarmStartSettings | None = None):
        self.model_fn = model_fn
        self.config = config or RunConfig()
        self.model_dir = model_dir or self.config.model_dir
        self.params = params if params is not None else {}
        if type(self.params) is dict:  # noqa: E721  (loaded by a vendor run.py itself, not by the runner)
            fill_zoo_sections(self.params)
        self.warm_start_from = warm_start_from

    # --- building --------------------------------------------------------------------

    def build(self, input_fn: Callable, mode: str, mixed_policy: bool = True) -> ModelGraph:
        """``mode``'s graph from ``input_fn`` and ``model_fn`` (for the device capture and tests)."""
        strategy = self.config.train_distribute
        with quiet_tf_logs():
            if strategy is not None and mode == ModeKeys.TRAIN:  # the graph on every replica
                from common.tf.estimator.distribute import build_train_graph

                return build_train_graph(self.model_fn, input_fn, self.params, self.config.tf_random_seed,
                                         mixed_policy, strategy)
            return build_graph(self.model_fn, input_fn, mode, self.params, self.config.tf_random_seed, mixed_policy)

    def open_session(self, input_fn: Callable, mode: str, mixed_policy: bool, weights: bool = True) -> GraphSession:
        """``mode``'s graph in an initialised session (the device runner shares it as the host), with
        the Keras mixed policy where ``mixed_policy`` and params ask for one; ``weights=False``: the
        model's weights and optimizer slots left uninitialised (a compile)."""
        return GraphSession(self.build(input_fn, mode, mixed_policy), self.config, weights=weights)

    def checkpoint_to_load(self, explicit: str | None) -> str | None:
        """``explicit`` (a --checkpoint_path) resolved, else the newest readable in model_dir (a
        damaged newer one is warned about and passed over), else None."""
        if explicit is not None:
            return checkpoints.resolve_checkpoint(explicit)
        return checkpoints.newest_readable(self.model_dir)

    def training_start(self) -> tuple[str | None, Callable[[str], bool] | None]:
        """The checkpoint a training starts from, and which trainable variables it gives (None: all it
        holds): warm_start_from's path; or, for WarmStartSettings, model_dir's newest checkpoint if it
        has one, else the settings' checkpoint with the variables they select (warm_start.py)."""
        settings = self.warm_start_from
        if not isinstance(settings, WarmStartSettings):
            return self.checkpoint_to_load(settings), None
        newest = checkpoints.newest_readable(self.model_dir)
        if newest is not None:
            return newest, None
        return checkpoints.resolve_checkpoint(settings.ckpt_to_initialize_from), settings.selects

    def ready_model_dir(self, on_ready: Callable[[], Any] | None) -> None:
        """Everything loaded fine: from here on the run may write into model_dir."""
        if on_ready is not None:
            on_ready()
        os.makedirs(self.model_dir, exist_ok=True)

    def step_backend(self) -> Any:
        """The steps of config.device: the TF session's own (cpu, gpu), or the emulator's."""
        if self.config.device == "emulator":
            from common.tf.device_run import EmulatorSteps  # the numpy emulator; loaded only when asked for

            return EmulatorSteps(self)
        return SessionSteps(self.model_fn, self.params)

    def latest_checkpoint(self) -> str | None:
        return checkpoints.latest_checkpoint(self.model_dir)

    # --- train -----------------------------------------------------------------------

    def train(self, input_fn: Callable, steps: int | None = None, max_steps: int | None = None, use_cs: bool = False,
              *, saving_listeners: tuple[Callable[[str, int], Any], ...] = (),
              on_ready: Callable[[], Any] | None = None) -> "CerebrasEstimator":
        """Train until the global step reaches ``max_steps`` (or ``steps`` more); a checkpoint every
        ``save_checkpoints_steps`` and at the end; ``saving_listeners`` are called with
        (checkpoint, step) after each save. ``use_cs`` (the vendor's): the steps run where
        config.device says (run_utils.is_cs is False here)."""
        if (steps is None) == (max_steps is None):
            raise UserError("train: give exactly one of steps and max_steps")
        backend = self.step_backend()
        run = self.open_session(input_fn, ModeKeys.TRAIN, mixed_policy=backend.mixed_policy)
        try:
            start, select = self.training_start()
            if start is not None:
                run.restore(start, select=select)
            step = run.step()
            last = step + steps if steps is not None else max_steps
            train_step = backend.train_step(run)  # the emulator compiles here: a model that will not stops
            self.ready_model_dir(on_ready)
            if step >= last:
                logger.info("| Train Device=%s: the global step %d has reached max_steps %d; nothing to train",
                            self.config.device, step, last)
                return self
            logger.info("training %s%s from step %d to %d%s", where(self.model_fn), train_step.on, step, last,
                        f" (from {start})" if start else "")
            self.train_loop(run, step, last, saving_listeners, train_step)
        finally:
            run.close()
        return self

    def train_loop(self, run: GraphSession, step: int, last: int, saving_listeners, train_step=None) -> None:
        """Steps from ``step`` to ``last`` with ``train_step`` (default: the TF session's): the log
        line and TensorBoard scalars every save_summary_steps, the NaN check every step, a
        checkpoint every save_checkpoints_steps and at the end; a SIGINT or SIGTERM stops it
        between two steps, with a checkpoint (common/interrupt.py)."""
        cfg = self.config
        train_step = train_step or CpuTrainStep(run, self.model_fn)
        writer = ScalarWriter(os.path.join(self.model_dir, "train"))
        saved_step, saved_path = step, self.latest_checkpoint()
        finite = VariablesFinite(run.built.graph)
        explicit = self.warm_start_from is not None and not (isinstance(self.warm_start_from, WarmStartSettings)
                                                             and saved_path is not None)
        start = getattr(self.warm_start_from, "ckpt_to_initialize_from", self.warm_start_from)
        meter = TrainMeter(cfg.device, step, last, checkpoints.resolve_checkpoint(start) if explicit else saved_path,
                           explicit_start=explicit)
        try:
            # Ctrl-C / SIGTERM: the step under way finishes, is saved, and the run stops (common/interrupt.py)
            with stop_between_steps() as stop:
                while step < last and not stop.requested:
                    log_now = (step + 1) % cfg.save_summary_steps == 0 or step + 1 == last
                    try:
                        loss_value, batch_size, logged = train_step(step, log_now)
                    except tf.errors.OutOfRangeError:
                        logger.warning("the training dataset ended at step %d, before step %d: repeat it in TRAIN "
                                       "mode (the device needs a repeating dataset)", step, last)
                        break
                    except tf.errors.DataLossError as e:  # a TFRecord file's record fails its checksum
                        raise damaged_input("training", step + 1, e, saved_path) from None
                    except NonFiniteGradient as e:  # not applied: the variables are the last step's
                        raise NonFiniteLossError(non_finite(e, step + 1, saved_path)) from None
                    step += 1
                    if not math.isfinite(loss_value):
                        raise NonFiniteLossError(non_finite(f"the loss is {loss_value}", step, saved_path))
                    meter.add(batch_size)
                    if log_now:
                        self._log_train(writer, meter, step, loss_value, logged, batch_size)
                    if (cfg.save_checkpoints_steps and step % cfg.save_checkpoints_steps == 0) or step == last:
                        saved_path = self._save(run, step, saving_listeners, train_step, finite)
                        saved_step = step
                        meter.saved(saved_path, step)
                if stop.requested and step < last:
                    if saved_step != step:  # without the listeners: an eval there would delay the stop
                        meter.saved(self._save(run, step, (), train_step, finite), step)
                    raise Interrupted(stop.signum, meter.interrupted(stop.signum, step))
            if saved_step != step:
                self._save(run, step, saving_listeners, train_step, finite)
        except Interrupted as e:
            if str(e):
                raise
            # a second signal, mid-step: the newest complete checkpoint is where the same command resumes
            raise Interrupted(e.signum, meter.interrupted(e.signum, step)) from None
        finally:
            writer.close()

    def _log_train(self, writer: ScalarWriter, meter: TrainMeter, step: int, loss_value: float,
                   out: Mapping, batch_size: int) -> None:
        rate = meter.rate()
        logger.info(meter.line(step, loss_value, rate))
        scalars = {"loss": loss_value, "samples_per_sec": rate, "global_step/sec": rate / batch_size}
        if "lr" in out:
            scalars["lr"] = float(out["lr"])
        if "loss_scale" in out:
            scalars["loss_scale"] = float(out["loss_scale"])
        if "summary" in out:
            scalars.update(_scalar_summaries(out["summary"]))
        writer.scalars(step, scalars)
        writer.flush()

    def _save(self, run: GraphSession, step: int, saving_listeners, train_step, finite: "VariablesFinite") -> str:
        train_step.before_save(step)  # the emulator writes its weights into the session here
        # finite gradients can still overflow a variable (a learning rate far too large): never saved
        variable = finite.first_not_finite(run.session)
        if variable is not None:
            raise NonFiniteLossError(non_finite(f"the variable {variable[0]} is {variable[1]} (not saved)", step,
                                                self.latest_checkpoint()))
        path = checkpoints.save_checkpoint(run.built.saver, run.session, self.model_dir, step,
                                           self.config.keep_checkpoint_max)
        logger.info("saved %s", path)
        for listener in saving_listeners:
            listener(path, step)
        return path

    # --- evaluate --------------------------------------------------------------------

    def evaluate(self, input_fn: Callable, steps: int | None = None, checkpoint_path: str | None = None,
                 name: str | None = None, use_cs: bool = False, *,
                 on_ready: Callable[[], Any] | None = None) -> dict[str, float]:
        """The metrics over the eval dataset (or ``steps`` batches) of one checkpoint (default:
        the latest in model_dir), with ``global_step``; written to model_dir/eval[_name]."""
        path = self.checkpoint_to_load(checkpoint_path)
        if path is None:
            raise UserError(f"model_dir {self.model_dir} has no checkpoint to evaluate: train first, or pass "
                            f"--checkpoint_path")
        evaluator = Evaluator(self, input_fn, steps, name)
        try:
            metrics = evaluator(path, on_ready=on_ready)
        finally:
            evaluator.close()
        return metrics

    def evaluate_all(self, input_fn: Callable, steps: int | None = None, *,
                     on_ready: Callable[[], Any] | None = None) -> list[dict[str, float]]:
        """Evaluate every readable checkpoint model_dir holds, oldest first."""
        paths = checkpoints.readable_checkpoints(self.model_dir)
        if not paths:
            raise UserError(f"model_dir {self.model_dir} has no checkpoint to evaluate: train first")
        evaluator = Evaluator(self, input_fn, steps)
        try:
            return [evaluator(path, on_ready=on_ready if i == 0 else None) for i, path in enumerate(paths)]
        finally:
            evaluator.close()

    def train_and_evaluate(self, train_input_fn: Callable, eval_input_fn: Callable, steps: int | None = None,
                           max_steps: int | None = None, eval_steps: int | None = None, *,
                           on_ready: Callable[[], Any] | None = None) -> dict[str, float] | None:
        """Train, evaluating each checkpoint as it is saved; returns the last metrics."""
        if self.config.device == "emulator":  # the device's validator refuses it, with the reason
            self.compile(train_input_fn, validate_only=True, mode="train_and_eval")
        evaluator: Evaluator | None = None
        results: list[dict[str, float]] = []

        def evaluate_checkpoint(path: str) -> None:
            nonlocal evaluator
            if evaluator is None:
                evaluator = Evaluator(self, eval_input_fn, eval_steps)
            results.append(evaluator(path))

        try:
            self.train(train_input_fn, steps=steps, max_steps=max_steps,
                       saving_listeners=(lambda path, step: evaluate_checkpoint(path),), on_ready=on_ready)
            if not results:  # nothing was trained: evaluate where the model stands
                latest = self.checkpoint_to_load(None)
                if latest is not None:
                    evaluate_checkpoint(latest)
        finally:
            if evaluator is not None:
                evaluator.close()
        return results[-1] if results else None

    # --- predict ---------------------------------------------------------------------

    def predict(self, input_fn: Callable, checkpoint_path: str | None = None, yield_single_examples: bool = True,
                *, max_batches: int | None = None,
                on_ready: Callable[[], Any] | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Predictions of one checkpoint over the input (its first ``max_batches`` batches, where
        given), one dict per example (or per batch)."""
        path = self.checkpoint_to_load(checkpoint_path)
        if path is None:
            raise UserError(f"model_dir {self.model_dir} has no checkpoint to predict with: train first, or pass "
                            f"--checkpoint_path")
        backend = self.step_backend()
        run = self.open_session(input_fn, ModeKeys.PREDICT, mixed_policy=backend.mixed_policy)
        try:
            run.restore(path)
            predict_step = backend.predict_step(run)
            self.ready_model_dir(on_ready)
            progress = EvalProgress("predict", self.config.device, batch_count(run, max_batches))
            while max_batches is None or progress.done < max_batches:
                try:
                    batch = predict_step()
                except tf.errors.OutOfRangeError:
                    return
                progress.batch_done()
                yield from predictions_of(batch, yield_single_examples)
        finally:
            run.close()

    # --- the device --------------------------------------------------------------------

    def compile(self, input_fn: Callable, validate_only: bool = False, mode: str = ModeKeys.TRAIN) -> Any:
        """Compile ``mode``'s graph for the device: up to kernel matching when ``validate_only``
        (is every op supported?), else completely (placement, memory, performance estimate,
        report files in model_dir/compile); raises a DeviceCompileError (a UserError) listing
        every problem. ``mode``: a ModeKeys value, or a --mode name (train_and_eval, eval_all,
        predict). Returns the validation report, or the compile result."""
        from common.tf import device_run
        return device_run.compile(self, input_fn, validate_only, mode)


class SessionSteps:
    """The step backend of --device cpu and gpu: the TF session runs the graph's own ops."""

    mixed_policy = True  # a Keras mixed policy where mixed_precision asks for one

    def __init__(self, model_fn: Callable, params: Mapping):
        self.model_fn, self.params = model_fn, params

    def train_step(self, run: GraphSession) -> "CpuTrainStep":
        step = CpuTrainStep(run, self.model_fn)
        step.on = f" ({run_precision(self.params, run.built)} compute)"
        return step

    def eval_step(self, run: GraphSession) -> "SessionEvalStep":
        return SessionEvalStep(run)

    def predict_step(self, run: GraphSession) -> Callable[[], dict[str, np.ndarray]]:
        return lambda: run.session.run(run.built.predictions)


class SessionEvalStep:
    """One eval batch into the model_fn's metrics (eval_metric_ops), in the session."""

    def __init__(self, run: GraphSession):
        self.run = run
        self.reset = run.local_init
        self.values = {metric: value for metric, (value, _) in run.built.metrics.items()}

    def __call__(self) -> None:
        self.run.session.run(self.run.built.metrics_update)

    def restored(self) -> None:
        """The session holds the checkpoint's weights already."""


class CpuTrainStep:
    """One training step in the TF session: ``(loss, batch size, logged values)``; the values
    to log (lr, loss scale, the model_fn's summaries) are fetched only when ``log_now``."""

    on = ""  # where the steps run, for the log's "training ..." line: the session's device

    def __init__(self, run: GraphSession, model_fn: Callable):
        built = run.built
        self.run, self.model_fn = run, model_fn
        self.batch_size = built.batch_size
        self.plain = [built.train_op, built.spec.loss] + ([built.dynamic_batch_size] if self.batch_size is None else [])
        self.logged: dict[str, Any] = {"step": self.plain}
        for name, tensor in (("lr", built.learning_rate), ("loss_scale", built.loss_scale),
                             ("summary", built.summary)):
            if tensor is not None:
                self.logged[name] = tensor
        self.checked = False

    def __call__(self, step: int, log_now: bool) -> tuple[float, int, Mapping]:
        try:
            if log_now:
                logged = self.run.session.run(self.logged)
                values = logged["step"]
            else:
                logged, values = {}, self.run.session.run(self.plain)
        except tf.errors.InvalidArgumentError as e:  # common/tf/optim.py's check_finite stopped the step
            found = re.search(re.escape(NON_FINITE) + r"(the loss|the gradient of (\S+)) : Tensor had (NaN|Inf) values",
                              e.message)
            if found is None:
                raise
            value = float("nan" if found[3] == "NaN" else "inf")
            if found[2] is None:
                return value, 0, {}  # the loss: the loop stops on it
            raise NonFiniteGradient(found[2], value) from None
        except tf.errors.OpError as e:  # a multi-worker step whose peer is gone: one line
            from common.tf.estimator.distribute import lost_worker

            lost = lost_worker(e, self.run.built.strategy)
            if lost is None:
                raise
            raise lost from None
        if not self.checked:
            self.checked = True
            if self.run.step() != step + 1:
                raise UserError(f"{where(self.model_fn)}: train_op does not increment the global step; pass "
                                f"global_step=tf.compat.v1.train.get_or_create_global_step() to minimize "
                                f"(common.tf.optim.build_train_op does)")
        return float(values[1]), int(values[2]) if self.batch_size is None else self.batch_size, logged

    def before_save(self, step: int) -> None:
        """The session already holds the weights."""


class Evaluator:
    """One eval graph and session, evaluating checkpoint after checkpoint (eval, eval_all,
    train_and_eval) with the eval step of the estimator's backend."""

    def __init__(self, estimator: CerebrasEstimator, input_fn: Callable, steps: int | None, name: str | None = None):
        self.estimator, self.steps = estimator, steps
        self.backend = estimator.step_backend()
        self.run = estimator.open_session(input_fn, ModeKeys.EVAL, mixed_policy=self.backend.mixed_policy)
        built = self.run.built
        if steps is None and self.run.session.run(built.cardinality) == tf.data.INFINITE_CARDINALITY:
            self.run.close()
            raise UserError("the eval dataset repeats forever: do not repeat it in EVAL mode, or set "
                            "runconfig.eval_steps (--eval_steps)")
        self.eval_step = None  # at the first checkpoint: the emulator compiles with its weights
        self.logdir = os.path.join(estimator.model_dir, "eval" if not name else f"eval_{name}")
        self.writer: ScalarWriter | None = None

    def __call__(self, path: str, on_ready: Callable[[], Any] | None = None) -> dict[str, float]:
        run, device = self.run, self.estimator.config.device
        run.restore(path)
        if self.eval_step is None:
            self.eval_step = self.backend.eval_step(run)
        else:
            self.eval_step.restored()
        run.session.run([self.eval_step.reset, run.built.iterator.initializer])
        step = run.step()
        if self.writer is None:
            self.estimator.ready_model_dir(on_ready)
            self.writer = ScalarWriter(self.logdir)
        batches = 0
        progress = EvalProgress("eval", device, batch_count(run, self.steps))
        while self.steps is None or batches < self.steps:
            try:
                self.eval_step()
            except tf.errors.OutOfRangeError:
                break
            except tf.errors.DataLossError as e:
                raise damaged_input("eval", batches + 1, e, None) from None
            batches += 1
            progress.batch_done()
        if batches == 0:
            raise UserError("the eval dataset yielded no batch (fewer examples than eval_input.batch_size with "
                            "drop_last: true?)")
        metrics = {name: float(value) for name, value in run.session.run(self.eval_step.values).items()}
        logger.info(eval_line(device, step, metrics))
        self.writer.scalars(step, metrics)
        self.writer.flush()
        return {**metrics, "global_step": step}

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.run.close()


def _scalar_summaries(serialized: bytes) -> dict[str, float]:
    """The simple_value scalars of a merged tf.compat.v1.summary (the model_fn's own summaries)."""
    summary = tf.compat.v1.Summary.FromString(serialized)
    return {value.tag: value.simple_value for value in summary.value if value.WhichOneof("value") == "simple_value"}


def non_finite(what: Any, step: int, kept: str | None) -> str:
    """The line of a run stopped at ``step`` on ``what`` (a loss, gradient or variable that is NaN or inf)."""
    return (f"{what} at step {step}; stopping. The last good checkpoint is kept: "
            f"{kept or 'none (no checkpoint was written yet)'} (lower the learning rate, or clip gradients with "
            f"optimizer.max_gradient_norm)")


class VariablesFinite:
    """Whether each floating-point variable of ``graph`` is all finite: one boolean per
    variable, built once, so that the check before a save fetches bytes, not the weights."""

    def __init__(self, graph: tf.Graph):
        with graph.as_default():
            self.variables = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                              if v.dtype.base_dtype.is_floating]
            self.flags = [tf.reduce_all(tf.math.is_finite(v)) for v in self.variables]

    def first_not_finite(self, session) -> tuple[str, float] | None:
        """(name, a NaN or inf value) of the first variable that is not finite, or None."""
        for v, finite in zip(self.variables, session.run(self.flags)):
            if not finite:
                value = np.asarray(session.run(v))
                return v.op.name, float(value[~np.isfinite(value)].flat[0])
        return None


def damaged_input(what: str, step: int, error: Exception, kept: str | None) -> UserError:
    """A damaged input record (tf.data reports a TFRecord record whose CRC does not match, or a
    file cut inside a record) as one line; tf.data does not say which file."""
    at = f"at step {step}" if what == "training" else f"in eval batch {step}"
    saved = f"; the newest checkpoint is kept: {kept}" if kept else ""
    return UserError(f"the {what} data holds a damaged record {at} ({checkpoints.op_error_line(error)}): one of its "
                     f"input files is corrupt or was cut short; write it again{saved}")
