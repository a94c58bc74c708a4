"""The PyTorch runner on the device: --validate_only, --compile_only and --device emulator.

The model's training step (``PyTorchBaseModel.__call__`` over one batch, with its
torch.optim optimizer) is captured as the device IR (device/capture/torch/), then:

    --validate_only     validated and matched to kernels; the report is printed, exit 0
                        when the model will compile (a failed validation is one error line
                        per finding, exit 2)
    --compile_only      compiled completely; the report (text, JSON, IR, placement picture)
                        goes to model_dir/compile/
    --device emulator   compiled, then run on the numpy emulator: EmulatorSteps is the step
                        backend the runner's loops (common/pytorch/runner.py: Runner) call, so
                        the batches, their order, log lines, TensorBoard files and checkpoints
                        are a CPU run's; only the step itself runs on the emulator

The batch is what the DataLoader gives: a tuple, list or dict of tensors (a dict's, as Hugging
Face collates them, become graph inputs named by its keys; device.api: torch_batch).

The device is reached through device/api.py alone.

Checkpoints stay in the runner's .mdl format: before each save the emulator's weights,
optimizer slots and loss scale go back into the torch model, optimizer and GradScaler, and
on start the torch state (fresh, or loaded from a checkpoint) goes into the emulator. So a
model trained on the emulator evaluates or resumes on the CPU, and the other way round.

The vendor's metric classes (common/pytorch/metrics.py: AccuracyMetric, ...) stay on the
host: in an eval capture, each metric call's tensors become extra outputs of the eval
graph, and after each eval step the emulator's values of them go to the metric
(ModelStep), which the runner then reports as on the CPU.

The captured graph is fp32; ``mixed_precision.dtype`` (float16, bfloat16 or cb16) is the
compute format the emulator rounds each kernel's inputs and outputs to (fp32 weights). The
emulator draws its dropout masks from its own numpy RNG (seeded from runconfig.seed and the
starting step), not torch's.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Mapping

import numpy as np
import torch
import torch.fx.traceback

from common.errors import UserError
from common.precision import compute_precision, loss_scaling
from common.pytorch import dropout_off
from common.pytorch.base_model import PyTorchBaseModel, split_result
from common.pytorch.data_order import epoch_batches, peek_first_batch, start_of
from common.pytorch.metrics import CapturedMetricCalls, recording_metric_calls
from common.pytorch.runner import TRAINS, DataFn, ModelFn, Runner, built_model, data_loader, seed_everything
from device.api import (DeviceCompileError, Graph, build_program, capture_torch, compile_graph,
                        load_torch_weights, render_report, torch_batch, torch_state, torch_weights,
                        validate_and_match)

logger = logging.getLogger("zoo")


def first_batch(loader, seed: int, keep: bool = False, start: tuple[int, int] = (0, 0)) -> Any:
    """The first batch of epoch 0, drawn as training would (without touching the global torch RNG).

    With ``keep``, the first batch training from ``start`` (epoch, batch: a resumed run's) draws,
    and the training loop (or eval) that follows continues this very draw, starting with this
    batch (data_order.peek_first_batch): a dataset or sampler that draws another order on each
    pass (the vendor's shuffle in place, persistent workers that carry on their stream) then
    trains on the emulator on the batches it trains on on the CPU."""
    batch = peek_first_batch(loader, seed, *start) if keep else next(iter(epoch_batches(loader, seed, epoch=0)),
                                                                       None)
    if batch is not None:
        return batch
    raise UserError("the data yielded no batch to capture the model with (is the dataset smaller than "
                    "batch_size with drop_last?)")


class ModelStep:
    """What capture traces: ``model(batch)``, with the model's metric calls kept on the host.

    In an eval capture ``model.model.training`` reads False, as in an eval on the CPU, so
    that the vendor's guard (``if not self.model.training: self.accuracy_metric(...)``)
    calls the metric; the layers below stay in train form, as capture() traces them (the
    emulator's eval step runs dropout and batch norm as inference). A metric call records
    the tensors it was given (common/pytorch/metrics.py) and adds no op of its own; those
    tensors become extra outputs of the eval graph, whose values ``metric_calls`` hands to
    the metrics after each step. A training capture drops the calls: a training step
    reports no metrics.
    """

    def __init__(self, model: PyTorchBaseModel, training: bool):
        self.model, self.training = model, training
        self.metric_calls = CapturedMetricCalls([])
        # capture keeps the stack frames of the step function it is given (this __call__), as
        # the anchor for the user's lines (device/capture/torch/step.py, _Step); the model's own
        # __call__ below it is the user's code: anchor it too, so that its ops keep their lines
        torch.fx.traceback.annotate_fn({})(type(model).__call__)

    def __call__(self, batch: Any) -> Any:
        module = self.model.model
        was_training = module.training
        with recording_metric_calls() as calls:
            module.training = self.training
            try:
                result = self.model(batch)
            finally:
                module.training = was_training
        loss, outputs = split_result(result, self.model)  # a wrong return named at the model's line
        if self.training or not calls:
            return result
        self.metric_calls = CapturedMetricCalls(calls)
        return loss, {**outputs, **self.metric_calls.outputs}


def capture_step(model: PyTorchBaseModel, batch: Any, training: bool,
                 params: Mapping) -> tuple[Graph, CapturedMetricCalls]:
    """The device IR of ``model(batch)`` (its loss and outputs, and with ``training`` the
    optimizer), and the metric calls its eval outputs feed.

    ``batch`` is as the DataLoader gives it: a tuple or list of tensors (inputs ``batch_0``,
    ``batch_1``, ...), or a dict of them (``{"input_ids": ..., "labels": ...}``: inputs named by
    its keys), a value of either possibly a tuple, list or dict of tensors (device.api: torch_batch);
    anything else is one line naming where in the batch it is."""
    optimizer = params["optimizer"]
    step = ModelStep(model, training)
    precision = compute_precision(params)
    if not training:
        return capture_torch(step, model.model, batch, precision=precision), step.metric_calls
    graph = capture_torch(step, model.model, batch, optimizer=model.optimizer, precision=precision,
                          max_gradient_norm=optimizer["max_gradient_norm"],
                          max_gradient_value=optimizer["max_gradient_value"], loss_scale=loss_scaling(params),
                          initial_loss_scale=optimizer["initial_loss_scale"],
                          steps_per_increase=optimizer["steps_per_increase"])
    if params["runconfig"].get("disable_dropout"):
        dropout_off.refuse_captured(graph)
    return graph, step.metric_calls


def mark_dynamic_batch(graph: Graph, loader) -> Graph:
    """A DataLoader that can end an epoch on a smaller batch (drop_last=False and a dataset
    that batch_size does not divide) feeds the device a batch dimension that changes: mark
    it None, so that validation reports it and points at drop_last."""
    size = getattr(loader, "batch_size", None)
    try:
        partial = size is not None and not loader.drop_last and len(loader.dataset) % size != 0
    except TypeError:  # an iterable dataset has no length: its last batch may be partial
        partial = size is not None and not loader.drop_last
    if partial:
        for name in graph.inputs:
            value = graph.values[name]
            value.shape = (None, *value.shape[1:])
    return graph


def available_memory() -> int:
    """Bytes of memory this machine can still give (MemAvailable; None where /proc/meminfo is absent)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@contextlib.contextmanager
def _quiet(log: logging.Logger):
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def model_for_capture(model_fn: ModelFn, params: Mapping, memory: int | None = None) -> PyTorchBaseModel:
    """The model --validate_only and --compile_only capture: built on the CPU, unless its
    weights would take more than half of ``memory`` (default: what this machine has
    available), as GPT-3 6.7B's 27 GB of fp32 weights on a 24 GB machine.

    Such a model is built on torch's meta device (shapes, no memory), then each parameter
    is replaced by a CPU stand-in of its shape and dtype whose elements all share one
    zero (a stride-0 view of a single element: 4 bytes), tied parameters staying one: the
    capture traces with fake tensors and reads no weight's values, so the graph, and the
    compile, are those of the real model. A buffer has no value on the meta device, and a
    buffer the step reads becomes a constant of the graph: a model with buffers is refused.
    """
    try:
        with torch.device("meta"), _quiet(logger):  # its log lines are those of the build that follows
            model = built_model(model_fn, params, torch.device("meta"))
    except UserError:
        raise
    except Exception:  # noqa: BLE001 - a model_fn that needs real tensors (a checkpoint it loads): build it on the CPU
        return built_model(model_fn, params, torch.device("cpu"))
    weights = {id(p): p for p in model.model.parameters()}
    needed = sum(p.numel() * p.element_size() for p in weights.values())
    memory = available_memory() if memory is None else memory
    if memory is None or needed <= memory // 2:
        return built_model(model_fn, params, torch.device("cpu"))
    buffers = [name for name, _ in model.model.named_buffers()]
    if buffers:
        raise UserError(f"the model's weights need {needed / 2**30:.1f} GiB, more than half of the "
                        f"{memory / 2**30:.1f} GiB this machine has available, and built without them (torch's "
                        f"meta device) its buffer {buffers[0]!r} would have no value; compile it on a machine "
                        f"with {2 * needed / 2**30:.0f} GiB")
    stand_ins: dict[int, torch.nn.Parameter] = {}
    for module in model.model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in stand_ins:
                    stand_ins[id(p)] = torch.nn.Parameter(torch.zeros((), dtype=p.dtype).expand(p.shape),
                                                          requires_grad=p.requires_grad)
                module._parameters[name] = stand_ins[id(p)]
    metrics = model.metrics
    PyTorchBaseModel.__init__(model, params, model.model, "cpu")  # the optimizer over the stand-ins
    model.metrics = metrics
    logger.info("the model's %.1f GiB of weights exceed half of the %.1f GiB this machine has available: built "
                "without them (shapes only) for the compile", needed / 2**30, memory / 2**30)
    return model


def compile_for_device(args, params: Mapping, model_fn: ModelFn, train_data_fn: DataFn,
                       eval_data_fn: DataFn) -> Any:
    """--validate_only (up to kernel matching) or --compile_only (everything, report in model_dir/compile)."""
    if args.device == "gpu":
        raise UserError("--device gpu does not go with --validate_only / --compile_only, which compile for the "
                        "device (drop --device, or use --device emulator)")
    rc, device = params["runconfig"], params["device"]
    training = args.mode in TRAINS
    seed_everything(rc["seed"])
    loader = data_loader(train_data_fn if training else eval_data_fn, params)
    model = model_for_capture(model_fn, params)
    graph, _ = capture_step(model, first_batch(loader, rc["seed"]), training, params)
    graph = mark_dynamic_batch(graph, loader)
    if args.validate_only:
        report, kernels = validate_and_match(graph, mode=args.mode, profile_name=device["profile"])
        if not report.ok:
            raise DeviceCompileError(f"{report.summary()}\n{report.to_text()}")
        print(f"{report.summary()}; {len(kernels)} kernels matched")
        if report.to_text():
            print(report.to_text())
        return report
    out_dir = os.path.join(rc["model_dir"], "compile")
    result = compile_graph(graph, mode=args.mode, profile_name=device["profile"],
                           execution_mode=device["execution_mode"], out_dir=out_dir,
                           micro_batch_size=device["micro_batch_size"])
    print(render_report(result), end="", flush=True)
    logger.info("compile report: %s (%s)", out_dir, ", ".join(result.report_files))
    return result


# --- the optimizer's state between torch and the emulator --------------------------------

# torch.optim state key -> the emulator's slot name, per update rule
_SLOTS = {"sgd": {}, "momentum": {"momentum_buffer": "momentum"},
          "adam": {"exp_avg": "m", "exp_avg_sq": "v"}, "adamw": {"exp_avg": "m", "exp_avg_sq": "v"}}


def _named_params(model: PyTorchBaseModel) -> list[tuple[str, torch.nn.Parameter]]:
    """The optimizer's parameters by state_dict key, in its state_dict's index order."""
    names = {id(p): name for name, p in model.model.named_parameters()}
    return [(names[id(p)], p) for group in model.optimizer.param_groups for p in group["params"]]


def emulator_optimizer_state(model: PyTorchBaseModel, kind: str) -> dict | None:
    """The torch optimizer's (and GradScaler's) state as Program.set_optimizer_state takes it; None when fresh."""
    torch_state = model.optimizer.state
    if not any(torch_state.get(p) for _, p in _named_params(model)):
        return None
    state: dict[str, Any] = {"step": 0}
    for name, p in _named_params(model):
        saved = torch_state.get(p, {})
        state[name] = {slot: saved[key].detach().cpu().numpy() for key, slot in _SLOTS[kind].items() if key in saved}
        if "step" in saved:
            state["step"] = max(state["step"], int(saved["step"]))
    if model.scaler is not None:
        scaler = model.scaler.state_dict()
        state["loss_scale"], state["loss_scale_good_steps"] = scaler["scale"], scaler["_growth_tracker"]
    return state


def load_torch_optimizer_state(model: PyTorchBaseModel, state: dict, kind: str) -> None:
    """The emulator's optimizer state (Program.get_optimizer_state) into the torch optimizer and GradScaler."""
    keys = {slot: key for key, slot in _SLOTS[kind].items()}
    torch_state: dict[int, dict[str, torch.Tensor]] = {}
    for index, (name, _) in enumerate(_named_params(model)):
        entry = {keys[slot]: torch.from_numpy(np.array(array, dtype=np.float32))
                 for slot, array in state.get(name, {}).items() if slot in keys}
        if kind in ("adam", "adamw") and entry:
            entry["step"] = torch.tensor(float(state["step"]))  # torch keeps Adam's step per parameter
        if entry:
            torch_state[index] = entry
    model.optimizer.load_state_dict({"state": torch_state,
                                     "param_groups": model.optimizer.state_dict()["param_groups"]})
    if model.scaler is not None and "loss_scale" in state:
        model.scaler.load_state_dict({**model.scaler.state_dict(), "scale": float(state["loss_scale"]),
                                      "_growth_tracker": int(state.get("loss_scale_good_steps", 0))})


# --- the steps ------------------------------------------------------------------------------

class EmulatorSteps:
    """The step backend on the emulator (common/pytorch/runner.py: FrameworkSteps is the
    CPU's): built once the runner's torch model holds its starting weights, it captures the
    model's step from the first batch and compiles it (a model that will not compile, or
    train_and_eval, which the device refuses, stops here, before model_dir is written)."""

    def __init__(self, runner: Runner):
        self.runner, self.model = runner, runner.model
        rc, device = runner.params["runconfig"], runner.params["device"]
        training = runner.mode in TRAINS
        loader = runner.train_loader if training else runner.eval_loader
        # the loop's own first batch (see first_batch): a resumed run's, where it resumes
        start = start_of(loader, getattr(runner, "data_state", None))[:2] if training else (0, 0)
        first = first_batch(loader, rc["seed"], keep=True, start=start)
        self.graph, self.metric_calls = capture_step(self.model, first, training, runner.params)
        # the first batch's tensors by input name, in the graph's order (a dict batch: its keys)
        self.inputs = list(torch_batch(first))
        self.graph = mark_dynamic_batch(self.graph, loader)
        compiled = compile_graph(self.graph, mode=runner.mode, profile_name=device["profile"],
                                 execution_mode=device["execution_mode"], micro_batch_size=device["micro_batch_size"])
        module = self.model.model
        # a resumed run draws other dropout masks than the run's start did
        seed = int(np.random.SeedSequence([rc["seed"], runner.global_step]).generate_state(1)[0])
        self.program = build_program(self.graph, torch_weights(module, self.graph), torch_state(module, self.graph),
                                     seed=seed)
        if training:
            state = emulator_optimizer_state(self.model, self.graph.optimizer.kind)
            if state is not None:
                self.program.set_optimizer_state(state)
        logger.info("compiled for the emulator: %d kernels, %s, profile %s, %s compute (estimated %.0f samples/s "
                    "on the device)", len(compiled.kernels), compiled.execution_mode, compiled.profile.name,
                    self.graph.precision, compiled.cost.samples_per_s)

    def restored(self) -> None:
        """eval_all: the next checkpoint's weights, loaded into the torch model, into the emulator."""
        self.program.set_weights(torch_weights(self.model.model, self.graph))
        self.program.set_state(torch_state(self.model.model, self.graph))

    def _arrays(self, batch: Any) -> list[np.ndarray]:
        """The batch's tensors in the graph's input order: a dict's by key, whatever its order."""
        tensors = torch_batch(batch)
        if sorted(tensors) != sorted(self.inputs):
            raise UserError(f"a batch holds the tensors {', '.join(tensors)}; the first batch, which the model was "
                            f"compiled for, held {', '.join(self.inputs)}: every batch must hold the same")
        return [tensors[name].numpy() for name in self.inputs]

    def train(self, batch: Any) -> float:
        # the learning rate of this step: the schedule at the number of steps taken
        return self.program.train_step(self._arrays(batch), self.model.schedule(self.runner.global_step))

    def eval(self, batch: Any) -> tuple[float, dict[str, np.ndarray]]:
        outputs = self.program.eval_step(self._arrays(batch))
        loss = float(outputs.pop("loss"))
        return loss, self.metric_calls.replay(outputs)  # the metrics' tensors to the metrics, the rest to the runner

    def loss_scale(self) -> float | None:
        optimizer = self.program.optimizer
        return optimizer.loss_scale if optimizer is not None and optimizer.scaler is not None else None

    def state(self) -> dict[str, Any]:
        """The emulator's weights, state and optimizer back into the torch model, then its state."""
        model = self.model
        load_torch_weights(model.model, {**self.program.get_weights(), **self.program.get_state()})
        load_torch_optimizer_state(model, self.program.get_optimizer_state(), self.graph.optimizer.kind)
        model.lr_scheduler.set_step(self.runner.global_step)
        return model.get_state()
