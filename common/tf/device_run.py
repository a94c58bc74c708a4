"""The TF runner on the device: --validate_only, --compile_only and --device emulator.

The graph the Estimator builds from ``model_fn`` is captured as the device IR, validated,
compiled and run on the numpy emulator, all through device/api.py. EmulatorSteps is the
step backend the Estimator's loops call (common/tf/estimator/cs_estimator.py: the train,
eval and predict loops, once). The TF session stays the host: it feeds the batches
(the same tf.data pipeline and order as a CPU run), computes the learning rate of
each step, runs host_call's metrics over what the device computed, and writes
checkpoints in TF's own format from the emulator's weights and optimizer state. So a
model trained on the emulator evaluates or resumes on the CPU, and the other way round.

The device's graph is built in fp32 and captured with the compute format params ask for
(mixed_precision.dtype): the device rounds its kernels' inputs and outputs to that
format itself (fp32 weights, 16-bit compute), where a CPU run uses a Keras policy.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable, Mapping

import numpy as np
import tensorflow as tf

from common.errors import UserError
from common.tf.estimator.graph import ModelGraph, run_precision
from common.tf.estimator.mode_keys import ModeKeys
from common.tf.estimator.session import GraphSession
from common.precision import loss_scaling
from common.tf.optim import LOSS_SCALE_STEPS_COLLECTION
from device import api
from device.api import DeviceCompileError, Program, build_program, compile_graph, render_report

logger = logging.getLogger("zoo")

# a --mode name or a ModeKeys value -> (the graph to build, the mode the device compiles for)
_MODES = {
    ModeKeys.TRAIN: (ModeKeys.TRAIN, "train"), "train_and_eval": (ModeKeys.TRAIN, "train_and_eval"),
    ModeKeys.EVAL: (ModeKeys.EVAL, "eval"), "eval_all": (ModeKeys.EVAL, "eval_all"),
    ModeKeys.PREDICT: (ModeKeys.PREDICT, "predict"), "predict": (ModeKeys.PREDICT, "predict"),
}


def _batch_tensors(built: ModelGraph) -> list[tf.Tensor]:
    """What the host feeds the device each step, in feed order: features then labels."""
    if built.mode == ModeKeys.PREDICT:
        return tf.nest.flatten(built.features)
    return tf.nest.flatten((built.features, built.labels))


def _host_call_tensors(built: ModelGraph) -> tuple[Callable | None, list[tf.Tensor], list[str] | None]:
    """(fn, tensors, keyword names or None) of an EVAL spec's host_call."""
    spec = built.spec
    if spec.eval_metric_ops is not None:
        raise UserError("eval metrics on the device go through host_call=(fn, [tensors]), not eval_metric_ops: "
                        "the device computes the tensors and the host runs fn")
    host_call = getattr(spec, "host_call", None)
    if host_call is None:
        return None, [], None
    fn, args = host_call
    if isinstance(args, Mapping):
        return fn, list(args.values()), list(args)
    return fn, list(args), None


def capture(estimator, run: GraphSession) -> Any:
    """The device IR of ``run``'s graph: the TRAIN step with its optimizer, or the forward
    pass with the loss and host_call's tensors (EVAL) or the predictions (PREDICT)."""
    built, params = run.built, estimator.params
    optimizer = params["optimizer"]
    kwargs: dict[str, Any] = {}
    outputs: dict[str, tf.Tensor] = {}
    batch = _batch_tensors(built)
    if built.mode == ModeKeys.TRAIN:
        kwargs = {"train_op": built.spec.train_op, "max_gradient_norm": optimizer["max_gradient_norm"],
                  "max_gradient_value": optimizer["max_gradient_value"], "loss_scale": loss_scaling(params),
                  "initial_loss_scale": optimizer["initial_loss_scale"],
                  "steps_per_increase": optimizer["steps_per_increase"],
                  "max_loss_scale": optimizer.get("max_loss_scale", api.MAX_LOSS_SCALE)}
    elif built.mode == ModeKeys.EVAL:
        _, tensors, _ = _host_call_tensors(built)
        outputs = {f"host_call_{i}": t for i, t in enumerate(tensors) if not any(t is b for b in batch)}
    else:
        outputs = dict(built.predictions)
    graph_ir = api.capture_tf(built.graph, inputs=batch, loss=built.spec.loss if built.mode != ModeKeys.PREDICT
                                  else None, outputs=outputs, precision=run_precision(params, built), session=run.session,
                                  **kwargs)
    spec = graph_ir.optimizer
    if spec is not None and spec.kind != "adamw" and optimizer["weight_decay"]:
        # build_train_op adds coupled L2 to the gradients, which the capture (forward + Apply ops) does not see
        spec.hyper["weight_decay"] = optimizer["weight_decay"]
        spec.weight_decay_exclude = tuple(optimizer["weight_decay_exclude"])
    return graph_ir


def compile(estimator, input_fn: Callable, validate_only: bool, mode: str) -> Any:
    """--validate_only: the validation report, kernels matched (DeviceCompileError when it fails); --compile_only:
    the full compile, with its report in model_dir/compile."""
    if mode not in _MODES:
        raise UserError(f"compile: unknown mode {mode!r}; valid: {', '.join(_MODES)}")
    graph_mode, device_mode = _MODES[mode]
    cfg = estimator.config
    # the capture and the compile read shapes only: no weight is initialised (allocated), so a
    # model larger than this machine's memory compiles (GraphSession, weights=False)
    run = estimator.open_session(input_fn, graph_mode, mixed_policy=False, weights=False)
    try:
        graph_ir = capture(estimator, run)
    finally:
        run.close()
    if validate_only:
        report, kernels = api.validate_and_match(graph_ir, mode=device_mode, profile_name=cfg.device_profile)
        if not report.ok:
            raise DeviceCompileError(f"{report.summary()}\n{report.to_text()}")
        logger.info("%s; %d kernels matched", report.summary(), len(kernels))
        for line in report.to_text().splitlines():
            logger.info("  %s", line)
        return report
    out_dir = os.path.join(estimator.model_dir, "compile")
    result = compile_graph(graph_ir, mode=device_mode, profile_name=cfg.device_profile,
                           execution_mode=cfg.execution_mode, out_dir=out_dir,
                           micro_batch_size=cfg.micro_batch_size)
    print(render_report(result), end="", flush=True)
    logger.info("compile report: %s (%s)", out_dir, ", ".join(result.report_files))
    return result


def _compiled_program(estimator, run: GraphSession, device_mode: str) -> tuple[Any, Program]:
    """Capture and compile ``run``'s graph (a DeviceCompileError stops here, before anything is
    written), and a Program holding the session's weights and state."""
    graph_ir = capture(estimator, run)
    compile_graph(graph_ir, mode=device_mode, profile_name=estimator.config.device_profile,
                  execution_mode=estimator.config.execution_mode, micro_batch_size=estimator.config.micro_batch_size)
    program = build_program(graph_ir, api.tf_read_weights(run.session, graph_ir),
                            api.tf_read_state(run.session, graph_ir), seed=estimator.config.tf_random_seed)
    return graph_ir, program


class EmulatorSteps:
    """The step backend of --device emulator: each step captures and compiles its mode's
    graph (with the session's weights) and runs on the emulator, the session feeding it."""

    mixed_policy = False  # the device's graph is fp32; the emulator rounds to mixed_precision.dtype itself

    def __init__(self, estimator):
        self.estimator = estimator

    def train_step(self, run: GraphSession) -> "EmulatorTrainStep":
        graph_ir, program = _compiled_program(self.estimator, run, "train")
        step = EmulatorTrainStep(run, graph_ir, program)
        step.on = f" on the emulator ({self.estimator.config.device_profile}, {graph_ir.precision} compute)"
        return step

    def eval_step(self, run: GraphSession) -> "EmulatorEvalStep":
        graph_ir, program = _compiled_program(self.estimator, run, "eval")
        return EmulatorEvalStep(run, graph_ir, program)

    def predict_step(self, run: GraphSession) -> Callable[[], dict[str, np.ndarray]]:
        try:
            _, program = _compiled_program(self.estimator, run, "predict")
        except DeviceCompileError as error:
            loop = api.tf_loop_source(run.built.graph)
            if loop is None:
                raise
            # a model that predicts by generating (greedy decoding in a tf.while_loop) feeds each
            # step's output back as the next input: a host loop, as PyTorch's predict_step
            raise UserError(f"--mode predict --device emulator: the model predicts by generating in a "
                            f"tf.while_loop ({loop}), which runs on the CPU or a GPU; drop --device emulator "
                            f"(--validate_only --mode predict lists what the device refuses in it)") from error
        batch_tensors, predictions = _batch_tensors(run.built), run.built.predictions

        def step() -> dict[str, np.ndarray]:
            outputs = program.eval_step(run.session.run(batch_tensors))
            return {k: outputs[k] for k in predictions}
        return step


# --- train ---------------------------------------------------------------------------

class EmulatorTrainStep:
    """One training step on the emulator, fed by the TF session: the batch and the learning
    rate of this step come from the session (the global step kept in step), the update is
    the Program's; before a checkpoint, the Program's weights and optimizer state go back into
    the session, whose Saver writes them in TF's format."""

    def __init__(self, run: GraphSession, graph_ir, program: Program):
        built = run.built
        self.run, self.ir, self.program = run, graph_ir, program
        self.batch = _batch_tensors(built)
        self.lr = built.learning_rate
        if self.lr is None and "lr" not in graph_ir.optimizer.hyper:  # a schedule of the user's optimizer
            self.lr = api.tf_learning_rate(built.graph, built.spec.train_op, graph_ir)
        if self.lr is None and "lr" not in graph_ir.optimizer.hyper:
            raise UserError("the learning rate is neither a constant of the optimizer, a tensor of the graph nor "
                            "registered by common.tf.optim.build_train_op; the emulator cannot tell it per step")
        self.global_step = built.global_step.op.name
        scale_steps = built.graph.get_collection(LOSS_SCALE_STEPS_COLLECTION)
        # dynamic loss scaling keeps its scale and counter in variables of the TF graph
        self.scale_vars = ((built.loss_scale.op.name, scale_steps[0].op.name)
                           if scale_steps and built.loss_scale is not None else None)
        state = api.tf_read_optimizer_state(run.session, graph_ir)
        if self.scale_vars:
            values = api.tf_read_variables(run.session, list(self.scale_vars))
            state["loss_scale"], state["loss_scale_good_steps"] = (float(values[self.scale_vars[0]]),
                                                                   int(values[self.scale_vars[1]]))
        program.set_optimizer_state(state)

    def __call__(self, step: int, log_now: bool) -> tuple[float, int, Mapping]:
        session = self.run.session
        if self.lr is not None:
            api.tf_write_variables(session, {self.global_step: np.int64(step)})  # the schedule's step
            *batch, lr = session.run(self.batch + [self.lr])
        else:
            batch, lr = session.run(self.batch), self.ir.optimizer.hyper["lr"]
        loss = self.program.train_step(batch, float(lr))
        logged = {}
        if log_now:
            logged["lr"] = float(lr)
            if self.program.optimizer.scaler is not None:
                logged["loss_scale"] = self.program.optimizer.loss_scale
        return loss, len(batch[0]), logged

    def before_save(self, step: int) -> None:
        session, program = self.run.session, self.program
        api.tf_write_weights(session, self.ir, {**program.get_weights(), **program.get_state()})
        state = program.get_optimizer_state()
        api.tf_write_optimizer_state(session, self.ir, state)
        values: dict[str, Any] = {self.global_step: np.int64(step)}
        if self.scale_vars:
            values[self.scale_vars[0]] = np.float32(state["loss_scale"])
            values[self.scale_vars[1]] = np.int64(state["loss_scale_good_steps"])
        api.tf_write_variables(session, values)


# --- evaluate and predict ------------------------------------------------------------

class _HostMetrics:
    """host_call's fn over placeholders in the eval graph: the host's half of the metrics,
    fed each batch with what the device computed (and the labels the host already has)."""

    def __init__(self, built: ModelGraph):
        fn, tensors, names = _host_call_tensors(built)
        self.sources = tensors
        with built.graph.as_default():
            self.placeholders = [tf.compat.v1.placeholder(t.dtype, t.shape) for t in tensors]
            self.loss = tf.compat.v1.placeholder(tf.float32, [])
            before = set(built.graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES))
            metrics = {}
            if fn is not None:
                metrics = dict(fn(**dict(zip(names, self.placeholders))) if names else fn(*self.placeholders))
            if "loss" not in metrics:
                metrics["loss"] = tf.compat.v1.metrics.mean(self.loss)
            self.values = {name: pair[0] for name, pair in metrics.items()}
            self.update = tf.group(*[pair[1] for pair in metrics.values()])
            created = [v for v in built.graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
                       if v not in before]
            self.reset = tf.compat.v1.variables_initializer(created)

    def feed(self, batch_tensors: list[tf.Tensor], batch: list[np.ndarray], outputs: Mapping) -> dict:
        feed = {self.loss: outputs["loss"]}
        for i, (source, placeholder) in enumerate(zip(self.sources, self.placeholders)):
            fed = next((array for t, array in zip(batch_tensors, batch) if t is source), None)
            feed[placeholder] = fed if fed is not None else outputs[f"host_call_{i}"]
        return feed


class EmulatorEvalStep:
    """One eval batch: the session feeds it, the emulator computes the loss and host_call's
    tensors, and host_call's metrics (_HostMetrics) take them in the session."""

    def __init__(self, run: GraphSession, graph_ir, program: Program):
        self.run, self.ir, self.program = run, graph_ir, program
        self.host = _HostMetrics(run.built)
        self.batch = _batch_tensors(run.built)
        self.reset, self.values = self.host.reset, self.host.values

    def __call__(self) -> None:
        session = self.run.session
        batch = session.run(self.batch)
        session.run(self.host.update, self.host.feed(self.batch, batch, self.program.eval_step(batch)))

    def restored(self) -> None:
        """The next checkpoint, restored into the session, into the emulator."""
        self.program.set_weights(api.tf_read_weights(self.run.session, self.ir))
        self.program.set_state(api.tf_read_state(self.run.session, self.ir))
