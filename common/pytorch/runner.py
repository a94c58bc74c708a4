"""The PyTorch runner's loops: train, eval, eval_all and predict, once, around a step backend.

A run's mode (common/pytorch/run.py parses the command line and picks the backend):

    train           train to runconfig.max_steps (or runconfig.steps more), resuming from the
                    latest checkpoint in model_dir or from --checkpoint_path
    eval            evaluate the latest checkpoint (or --checkpoint_path) on the eval set
    eval_all        evaluate every checkpoint in model_dir, in step order
    train_and_eval  train, evaluating at each checkpoint and at the end
    predict         write the model's outputs over the eval set to model_dir/predictions.npz

A model that generates (greedy decoding: pytorch/transformer) defines, beside ``__call__``,
``predict_step(batch) -> {name: numpy array}``: predict writes its arrays instead of the eval
step's outputs (over the eval set, or over ``predict_dataloader()`` where the model has one,
as a Lightning module may: pytorch/gpt2's prompts), on the torch device (generation runs in
torch: ``--device emulator`` refuses such a predict with one line); and optionally
``predictions_done(arrays, model_dir) -> {name: float}``, called with the concatenated arrays
once predictions.npz is written: it writes its own files and returns its summary figures,
which land as TensorBoard scalars in model_dir/predict.

The loops (batches in order, log lines, TensorBoard scalars, checkpoints, the run lock,
Ctrl-C) are the same on every device; only the step differs, and a step backend gives it:

    train(batch) -> loss              one training step
    eval(batch) -> (loss, outputs)    one forward pass (eval and predict), outputs as numpy
    loss_scale() -> float | None      the dynamic loss scale, for the log
    state() -> dict                   the model's part of a checkpoint (the torch model's state)
    restored()                        a checkpoint was loaded into the torch model (eval_all)

FrameworkSteps (here) runs them on the CPU or a GPU with torch; EmulatorSteps
(common/pytorch/device_run.py) on the numpy emulator.
"""

from __future__ import annotations

import logging
import math
import os
import random
import time
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader

from common import runlock
from common.errors import NonFiniteGradient, NonFiniteLossError, UserError, where
from common.interrupt import Interrupted, stop_between_steps
from common.io import atomic_open
from common.log import EvalProgress, TrainMeter, eval_line
from common.params import report_unused, save_params
from common.precision import check_precision, compute_precision
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.checkpoint import (UnreadableCheckpoint, describe_mismatch, last_readable, list_checkpoints,
                                       load_checkpoint, optimizer_mismatch, rng_state, save_checkpoint,
                                       set_rng_state)
from common.pytorch import dropout_off
from common.pytorch.data_order import TrainOrder, eval_shard
from common.pytorch.distributed import SINGLE, World, mean_across, sum_across, wrap
from common.pytorch.metrics import cb_metrics_of, set_summed_state, summed_state
from common.summaries import ScalarWriter

logger = logging.getLogger("zoo")

ModelFn = Callable[[Mapping, torch.device], PyTorchBaseModel]
DataFn = Callable[[Mapping], DataLoader]

TRAINS = ("train", "train_and_eval")
EVALUATES = ("eval", "eval_all", "train_and_eval", "predict")
# a log window in which waiting for input takes more than this share of the time is input-bound
INPUT_BOUND_SHARE = 0.3


def torch_device(flag: str, world: World = SINGLE) -> torch.device:
    if flag == "gpu":
        if not torch.cuda.is_available():
            raise UserError(f"--device gpu: no CUDA device is available to torch {torch.__version__}")
        return torch.device("cuda", world.local_rank) if world.distributed else torch.device("cuda")
    return torch.device("cpu")


def data_loader(data_fn: DataFn, params: Mapping) -> DataLoader:
    """``data_fn(params)``, which must be a torch DataLoader: the runner replays its sampler and
    settings in the order (seed, epoch) fixes, so that a resumed run reads what an unbroken one
    would (common/pytorch/data_order.py)."""
    loader = data_fn(params)
    if not isinstance(loader, DataLoader):
        raise UserError(f"{where(data_fn)} returned {type(loader).__name__}; the runner takes a "
                        f"torch.utils.data.DataLoader (it replays the loader's order to resume exactly)")
    return loader


def built_model(model_fn: ModelFn, params: Mapping, device: torch.device) -> PyTorchBaseModel:
    """``model_fn(params, device)``, which must be a PyTorchBaseModel: the runner trains,
    saves and restores through it (its model, optimizer, schedule and loss scale)."""
    model = model_fn(params, device)
    if not isinstance(model, PyTorchBaseModel):
        raise UserError(f"{where(model_fn)} returned {type(model).__name__}; the runner takes a PyTorchBaseModel "
                        f"(common/pytorch/base_model.py), which wraps the torch module with its optimizer")
    if params["runconfig"].get("disable_dropout"):
        changed = dropout_off.switch_off(model.model)
        logger.info("%s: %d dropout rate%s set to 0%s", dropout_off.KEY, len(changed), "" if len(changed) == 1 else "s",
                    f" ({', '.join(changed[:4])}{', ...' if len(changed) > 4 else ''})" if changed else "")
    return model


def seed_everything(seed: int) -> None:
    """The global RNGs (weights init, dropout, user code); the data order has its own (data_order.py)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, Mapping):
        return {k: to_numpy(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    return value


def batch_size(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor (or array)."""
    if hasattr(batch, "shape"):
        return int(batch.shape[0]) if len(batch.shape) else 1
    if not isinstance(batch, (Mapping, list, tuple)):  # a string (collated text is a list of them), a number
        return 0
    for value in batch.values() if isinstance(batch, Mapping) else batch:
        size = batch_size(value)
        if size:
            return size
    return 0


def non_finite_weight(weights: Mapping[str, torch.Tensor]) -> tuple[str, float] | None:
    """(name, a NaN or inf value) of the first floating-point tensor of ``weights`` that is not finite."""
    for name, w in weights.items():
        if w.is_floating_point() and not bool(torch.isfinite(w).all()):
            return name, float(w[~torch.isfinite(w)].flatten()[0])
    return None


def last_step(runconfig: Mapping, global_step: int) -> int:
    """runconfig.steps (more steps from here) wins over runconfig.max_steps (a global step)."""
    return global_step + runconfig["steps"] if runconfig["steps"] is not None else runconfig["max_steps"]


def eval_batches(loader: DataLoader, seed: int, eval_steps: int | None, world: World = SINGLE):
    """The eval set in a fixed order (a shuffled eval loader is shuffled the same way every time);
    in a data-parallel run, this process's share of its batches (data_order.eval_shard)."""
    return eval_shard(loader, seed, eval_steps, world)


def eval_batch_count(loader: DataLoader, eval_steps: int | None, world: World = SINGLE) -> int | None:
    """How many batches ``eval_batches`` gives this process, for the progress lines: None where
    the loader has no length and no eval_steps bounds it (an iterable dataset)."""
    try:
        count = len(loader)
    except TypeError:  # an IterableDataset without __len__
        count = None
    if eval_steps is not None:
        count = eval_steps if count is None else min(count, eval_steps)
    return None if count is None else len(range(world.rank, count, world.size))


class StepWindow:
    """Samples, step time and time spent waiting for input over one log window.

    The rate counts the time of training steps only (fetching the batch included), not
    checkpoints or evals in between. A window in which waiting for the next batch takes
    more than INPUT_BOUND_SHARE of the step time is input-bound: the first such window
    logs one warning (the first window of a run is skipped: workers are starting up).
    """

    def __init__(self):
        self.samples, self.waiting, self.total = 0, 0.0, 0.0
        self.windows = 0
        self.warned = False

    def add(self, samples: int, waiting: float, total: float) -> None:
        self.samples += samples
        self.waiting += waiting
        self.total += total

    def end(self, step: int) -> float:
        """Close the window at ``step``; returns its samples/s."""
        rate = self.samples / self.total if self.total > 0 else 0.0
        share = self.waiting / self.total if self.total > 0 else 0.0
        self.windows += 1
        if self.windows > 1 and not self.warned and share > INPUT_BOUND_SHARE:
            self.warned = True
            logger.warning("input pipeline is the bottleneck: %.0f%% of the step time up to step %d went to "
                           "waiting for data; raise train_input.num_workers, make the dataset's __getitem__ "
                           "cheaper or prepare the data ahead", 100 * share, step)
        self.samples, self.waiting, self.total = 0, 0.0, 0.0
        return rate


def check_runconfig(runconfig: Mapping) -> None:
    """Counts the loop divides by or counts down must make sense (the types are checked already)."""
    for key, least in (("log_steps", 1), ("checkpoint_steps", 0), ("keep_checkpoint_max", 0), ("max_steps", 0),
                       ("steps", 1), ("eval_steps", 1)):
        value = runconfig[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < least):
            raise UserError(f"runconfig.{key} must be an integer of at least {least}, got {value!r}")


class FrameworkSteps:
    """The steps on the CPU or a GPU: the model's own train_step and eval_step, in torch
    (in a data-parallel run, the torch model in DistributedDataParallel)."""

    def __init__(self, runner: "Runner"):
        self.model, self.device, self.world = runner.model, runner.device, runner.world
        if self.world.distributed:
            self.model.model = wrap(self.model.model, self.device)
        # runconfig.disable_dropout: the first step watches for a dropout the switch did not reach
        self.watch_dropout = bool(getattr(runner, "params", {}).get("runconfig", {}).get("disable_dropout"))

    def train(self, batch: Any) -> float:
        """One training step on ``batch`` (as the DataLoader gives it); the loss (of the global batch)."""
        if self.watch_dropout:
            self.watch_dropout = False
            with dropout_off.DropoutWatch():
                return mean_across(self.model.train_step(to_device(batch, self.device)).item(), self.world)
        return mean_across(self.model.train_step(to_device(batch, self.device)).item(), self.world)

    def eval(self, batch: Any) -> tuple[float, dict[str, np.ndarray]]:
        """The loss and the named outputs (numpy; float32 where the model computed bfloat16)."""
        loss, outputs = self.model.eval_step(to_device(batch, self.device))
        return loss.item(), {k: to_numpy(v.float() if v.is_floating_point() else v) for k, v in outputs.items()}

    def loss_scale(self) -> float | None:
        return self.model.loss_scale()

    def state(self) -> dict[str, Any]:
        """The model's part of a checkpoint: PyTorchBaseModel.get_state()."""
        return self.model.get_state()

    def restored(self) -> None:
        """The torch model holds the checkpoint's weights already."""


StepsFn = Callable[["Runner"], Any]


class Runner:
    """One run of one mode; everything is loaded before model_dir is touched. ``steps_fn(runner)``
    gives the step backend once the model holds its starting weights (FrameworkSteps, or
    device_run.EmulatorSteps, which compiles the model there)."""

    def __init__(self, args, params: Mapping, model_fn: ModelFn, train_data_fn: DataFn, eval_data_fn: DataFn,
                 steps_fn: StepsFn = FrameworkSteps, world: World = SINGLE):
        self.args, self.params, self.mode = args, params, args.mode
        self.world = world  # a data-parallel run's processes (common/pytorch/distributed.py): rank 0 writes
        self.steps = None  # below, once the starting checkpoint is loaded
        check_runconfig(params["runconfig"])
        self.runconfig = params["runconfig"]
        self.model_dir = self.runconfig["model_dir"]
        self.device_name = args.device
        self.device = torch_device(args.device, world)
        check_precision(params, args.device)
        if self.mode == "eval_all" and args.checkpoint_path:
            raise UserError("--checkpoint_path does not go with --mode eval_all, which evaluates every "
                            "checkpoint in model_dir")
        seed_everything(self.runconfig["seed"])
        self.train_loader = data_loader(train_data_fn, params) if self.mode in TRAINS else None
        self.eval_loader = data_loader(eval_data_fn, params) if self.mode in EVALUATES else None
        self.model = built_model(model_fn, params, self.device)
        self.global_step = 0
        self.data_state = None
        if self.mode == "predict" and args.device == "emulator" and hasattr(self.model, "predict_step"):
            raise UserError(f"--mode predict --device emulator: {type(self.model).__name__} predicts by generating "
                            f"(predict_step), which runs on the CPU or a GPU; drop --device emulator")
        self.checkpoint = self._starting_checkpoint()
        self._eval_writer = None
        # the vendor's metric objects on the model (AccuracyMetric, ...), by the key they report as
        self.cb_metrics = cb_metrics_of(self.model, taken=("loss", *self.model.metrics))
        self._uncalled_warned: set[str] = set()
        self.steps = steps_fn(self)

    # --- loading ------------------------------------------------------------------------

    def _starting_checkpoint(self) -> str | None:
        """Find and load the checkpoint this mode starts from (before model_dir is written).

        Without --checkpoint_path: the newest in model_dir that reads (a damaged newer one is
        skipped with a warning); an explicit --checkpoint_path that does not read is an error.
        """
        # a run that holds model_dir may rotate away the checkpoint this one is about to read (in a
        # data-parallel run, rank 0 takes the lock for every process: the others do not check it)
        if self.world.is_main:
            runlock.check_free(self.model_dir)
        if self.mode == "eval_all":
            checkpoints = list_checkpoints(self.model_dir)
            if not checkpoints:
                raise UserError(f"{self.model_dir}: no checkpoint_<step>.mdl to evaluate; train first")
            # one must read, or the run fails before anything is written; evaluate_all skips the others
            # that do not, with a warning each
            errors = []
            for _, path in reversed(checkpoints):  # the newest first
                try:
                    load_checkpoint(path)
                    return None
                except UnreadableCheckpoint as e:
                    errors.append(e)
            raise UserError(f"{self.model_dir}: no checkpoint reads, nothing to evaluate ({len(errors)} tried; the "
                            f"newest: {errors[0]})")
        if self.args.checkpoint_path:
            self._restore(self.args.checkpoint_path, weights_only=self.mode not in TRAINS)
            return self.args.checkpoint_path
        found = last_readable(list_checkpoints(self.model_dir), self.model_dir)
        if found is None:
            if self.mode in TRAINS:
                return None
            raise UserError(f"{self.model_dir}: no checkpoint to {self.mode}; train first or pass --checkpoint_path")
        path, state = found
        self._restore(path, weights_only=self.mode not in TRAINS, state=state)
        return path

    def _restore(self, path: str, weights_only: bool, state: dict | None = None) -> dict:
        """Load ``path`` (``state``: already read from it) into the model."""
        if state is None:
            state = load_checkpoint(path)
        other = None if weights_only else optimizer_mismatch(state["optimizer"], self.model.optimizer.state_dict())
        if other:
            raise UserError(f"{path}: does not fit this run: {other}")
        try:
            self.model.set_state(state, weights_only=weights_only)
        except (RuntimeError, KeyError, ValueError) as e:
            detail = describe_mismatch(state["model"], self.model.model.state_dict(), e)
            raise UserError(f"{path}: does not fit this model: {detail} (a checkpoint of another model or "
                            f"config?)") from None
        self.global_step = int(state["global_step"])
        if not weights_only:
            if state.get("rng") is not None:
                set_rng_state(state["rng"])
            self.data_state = state.get("data_order")
        if self.steps is not None:  # eval_all: the next checkpoint's weights into the backend
            self.steps.restored()
        return state

    # --- modes --------------------------------------------------------------------------

    def execute(self) -> dict | None:
        # the first write into model_dir: another run there is refused here, before anything is written
        lock = runlock.RunLock(self.model_dir, self.mode) if self.world.is_main else None
        if lock is not None:
            lock.acquire()
        try:
            if self.world.is_main:
                save_params(self.params, self.model_dir, self.mode)
            if self.checkpoint:
                logger.info("starting from %s (step %d)", self.checkpoint, self.global_step)
            if self.mode in TRAINS:
                return self.train()
            if self.mode == "eval":
                return self.evaluate()
            if self.mode == "eval_all":
                return self.evaluate_all()
            return self.predict()
        finally:
            if self._eval_writer is not None:
                self._eval_writer.close()
            if lock is not None:
                lock.release()

    def train(self) -> dict | None:
        final = last_step(self.runconfig, self.global_step)
        with_eval = self.mode == "train_and_eval"
        if self.global_step >= final:
            logger.info("already at step %d (max_steps %d): nothing to train", self.global_step, final)
            return self.evaluate() if with_eval else None
        rc = self.runconfig
        started_at = self.global_step
        logger.info("training on %s from step %d to %d (%s compute)", self.device_name, self.global_step, final,
                    compute_precision(self.params))
        order = TrainOrder(self.train_loader, rc["seed"], self.data_state, self.world)
        batches = iter(order)
        meter = TrainMeter(self.device_name, self.global_step, final, self.checkpoint,
                           explicit_start=bool(self.args.checkpoint_path))
        window = StepWindow()
        writer = ScalarWriter(os.path.join(self.model_dir, "train")) if self.world.is_main else None
        metrics = None

        def stopped(step: int, what) -> str:
            return (f"step {step}: {what}; training stopped, the last good checkpoint is "
                    f"{meter.checkpoint or 'none (none was written)'}")

        def save(step: int) -> None:
            if not self.world.is_main:  # rank 0 writes the checkpoint of every process (the same weights)
                return
            state = {**self.steps.state(), "global_step": step, "rng": rng_state(),
                     "data_order": order.state()}
            # finite gradients can still overflow a weight (a learning rate far too large): never saved
            weight = non_finite_weight(state["model"])
            if weight is not None:
                raise NonFiniteLossError(stopped(step, f"the weight {weight[0]} is {weight[1]}, not saved"))
            path = save_checkpoint(state, self.model_dir, step, rc["keep_checkpoint_max"])
            meter.saved(path, step)
            logger.info("saved %s", path)

        try:
            # Ctrl-C / SIGTERM: the step under way finishes, is saved, and the run stops (common/interrupt.py)
            with stop_between_steps() as stop:
                while self.global_step < final and not stop.requested:
                    started = time.perf_counter()
                    try:
                        batch = next(batches)
                    except Exception:
                        if stop.requested:  # DataLoader workers got the terminal's Ctrl-C as well, and quit
                            break
                        raise
                    fetched = time.perf_counter()
                    try:
                        loss = self.steps.train(batch)
                    except NonFiniteGradient as e:  # not applied: the weights are the last step's
                        raise NonFiniteLossError(stopped(self.global_step + 1, e)) from None
                    step = self.global_step = self.global_step + 1
                    if step == started_at + 1:
                        report_unused(self.params)  # by the end of the first step, model and data code read their keys
                    # samples of the global batch: every process's slice (common/pytorch/distributed.py)
                    window.add(batch_size(batch) * self.world.size, fetched - started, time.perf_counter() - started)
                    if not math.isfinite(loss):
                        raise NonFiniteLossError(stopped(step, f"the loss is {loss}"))
                    if step % rc["log_steps"] == 0 or step == final:
                        rate = window.end(step)
                        logger.info(meter.line(step, loss, rate))
                        # the learning rate this step used: the schedule at the step count before it
                        values = {"loss": loss, "lr": self.model.schedule(step - 1), "samples_per_sec": rate}
                        if self.steps.loss_scale() is not None:
                            values["loss_scale"] = self.steps.loss_scale()
                        if writer is not None:
                            writer.scalars(step, values)
                            writer.flush()
                    if (rc["checkpoint_steps"] and step % rc["checkpoint_steps"] == 0) or step == final:
                        save(step)
                        if with_eval:
                            metrics = self.evaluate()
                if stop.requested and self.global_step < final:
                    if meter.checkpoint_step != self.global_step:
                        save(self.global_step)
                    raise Interrupted(stop.signum, meter.interrupted(stop.signum, self.global_step))
        except Interrupted as e:
            if str(e):
                raise
            # a second signal, mid-step: the newest complete checkpoint is where the same command resumes
            raise Interrupted(e.signum, meter.interrupted(e.signum, self.global_step)) from None
        finally:
            if writer is not None:
                writer.close()
        return metrics

    def _eval_scalars(self) -> ScalarWriter:
        if self._eval_writer is None:
            self._eval_writer = ScalarWriter(os.path.join(self.model_dir, "eval"))
        return self._eval_writer

    def evaluate(self) -> dict[str, float]:
        """Loss (mean over examples) and every metric of the model over the eval set.

        The model's own metrics (``model.metrics``) are fed each batch's outputs here; the
        vendor's (``self.cb_metrics``) are fed by the model's ``__call__`` itself (on the
        emulator, by EmulatorSteps.eval) and reported under their name without its
        "eval/" prefix (one whose compute() gives several scores by name, such as
        RougeScoreMetric's, as prefix/score each). A vendor metric that no eval batch called is
        left out, with a warning.
        """
        model = self.model
        for metric in (*model.metrics.values(), *self.cb_metrics.values()):
            metric.reset()  # calls made while training (if the model makes any) do not count
            if self.world.distributed:
                summed_state(metric)  # a metric the processes cannot add up is refused before the eval
        total_loss, examples = 0.0, 0
        eval_steps = self.runconfig["eval_steps"]
        progress = EvalProgress("eval", self.device_name, eval_batch_count(self.eval_loader, eval_steps, self.world))
        for batch in eval_batches(self.eval_loader, self.runconfig["seed"], eval_steps, self.world):
            loss, outputs = self.steps.eval(batch)
            size = batch_size(batch)
            total_loss += loss * size
            examples += size
            if model.metrics:
                batch = to_numpy(batch)
                for metric in model.metrics.values():
                    metric.update(outputs, batch)
            progress.batch_done()
        if self.world.distributed:
            total_loss, examples = self._sum_across_processes(total_loss, examples)
        if examples == 0:
            raise UserError("eval data yielded no batches (is the eval set smaller than eval_input.batch_size "
                            "with drop_last?)")
        metrics = {"loss": total_loss / examples, **{name: m.result() for name, m in model.metrics.items()},
                   **self._cb_results()}
        logger.info(eval_line(self.device_name, self.global_step, metrics))
        if self.world.is_main:
            writer = self._eval_scalars()
            writer.scalars(self.global_step, metrics)
            writer.flush()
        return metrics

    def _sum_across_processes(self, total_loss: float, examples: int) -> tuple[float, int]:
        """The eval sums of every process, added up (each process evaluated its share of the eval set)."""
        metrics = [*self.model.metrics.values(), *self.cb_metrics.values()]
        states = [summed_state(metric) for metric in metrics]
        names = [(i, name) for i, state in enumerate(states) for name in state]
        sums = sum_across([np.asarray(total_loss), np.asarray(examples)] +
                          [np.asarray(states[i][name]) for i, name in names], self.world)
        added: list[dict[str, Any]] = [{} for _ in metrics]
        for (i, name), value in zip(names, sums[2:]):
            added[i][name] = value
        for metric, state in zip(metrics, added):
            set_summed_state(metric, state)
        examples = int(round(float(sums[1])))
        logger.info("eval over %d examples, shared by %d processes", examples, self.world.size)
        return float(sums[0]), examples

    def _cb_results(self) -> dict[str, float]:
        results = {}
        for key, metric in self.cb_metrics.items():
            if metric.num_updates:
                value = metric.compute()
                if isinstance(value, Mapping):  # several scores (the vendor's RougeScoreMetric): key/score each
                    results.update({f"{key}/{name}": float(v) for name, v in value.items()})
                else:
                    results[key] = float(value)
            elif key not in self._uncalled_warned:
                self._uncalled_warned.add(key)
                logger.warning("metric %r (%s) was not called during eval: not reported (is it called in __call__ "
                               "when not self.model.training?)", metric.name, type(metric).__name__)
        return results

    def evaluate_all(self) -> dict[int, dict[str, float]]:
        results = {}
        for step, path in list_checkpoints(self.model_dir):
            try:
                self._restore(path, weights_only=True)
            except UnreadableCheckpoint as e:
                logger.warning("%s; skipped", e)
                continue
            results[self.global_step] = self.evaluate()
        return results

    def predict(self) -> str:
        """The model's outputs over the eval set, concatenated per name, in model_dir/predictions.npz
        (the model's ``predict_step`` outputs where it has one; the module docstring)."""
        predict_step = getattr(self.model, "predict_step", None)
        collected: dict[str, list[np.ndarray]] = {}
        predict_dataloader = getattr(self.model, "predict_dataloader", None)
        loader = predict_dataloader() if predict_dataloader is not None else self.eval_loader
        limit = None if predict_dataloader is not None else self.runconfig["eval_steps"]  # every prompt
        progress = EvalProgress("predict", self.device_name, eval_batch_count(loader, limit))
        for batch in eval_batches(loader, self.runconfig["seed"], limit):
            if predict_step is not None:
                outputs = predict_step(to_device(batch, self.device))
            else:
                _, outputs = self.steps.eval(batch)
            if not outputs:
                raise UserError("predict: the model's __call__ returned the loss alone; return "
                                "(loss, {name: tensor}) to have outputs to write")
            for name, value in outputs.items():
                collected.setdefault(name, []).append(value)
            progress.batch_done()
        if not collected:
            raise UserError("eval data yielded no batches to predict on")
        arrays = {name: np.concatenate(values) for name, values in collected.items()}  # (N, ...) each
        path = os.path.join(self.model_dir, "predictions.npz")
        if not self.world.is_main:  # every process predicted the whole eval set; rank 0 writes it
            return path
        with atomic_open(path, "wb") as f:
            np.savez(f, **arrays)
        examples = len(next(iter(arrays.values())))
        logger.info("wrote the predictions of step %d over %d examples to %s", self.global_step, examples, path)
        predictions_done = getattr(self.model, "predictions_done", None)
        if predictions_done is not None:
            figures = predictions_done(arrays, self.model_dir)
            if figures:
                writer = ScalarWriter(os.path.join(self.model_dir, "predict"))
                writer.scalars(self.global_step, figures)
                writer.close()
        return path
