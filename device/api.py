"""The device API the runners call: the one door into device/.

    validate_graph(graph, mode=..., profile_name=...) -> ValidationReport
    validate_and_match(graph, mode=..., profile_name=...) -> (ValidationReport, kernels)   (--validate_only)
    compile_graph(graph, mode=..., profile_name=..., execution_mode=..., out_dir=...)
        -> CompileResult                                                   (--compile_only, emulator)
    render_report(result) -> str                                           the report's text
    build_program(graph, weights, state, seed=...) -> Program              the emulator's steps

    capture_torch(step_fn, module, batch, ...) -> Graph                    PyTorch's step as the IR
    torch_batch(batch) -> {input name: tensor}                             a batch as the graph's inputs
    capture_tf(tf_graph, inputs=..., loss=..., ...) -> Graph              a TF graph as the IR
    torch_weights / torch_state / load_torch_weights                      torch module <-> arrays
    tf_read_* / tf_write_*                                                 TF session <-> arrays
    tf_learning_rate(tf_graph, train_op, graph) -> tensor or None          a schedule, read every step
    refused_op(framework, framework_op, form="") -> suggestion or None     what a frontend cannot lower

compile_graph runs the stages in pipeline order: validate -> match -> place -> cost, and
writes the report files (device/report.py) only once every stage has succeeded.

What the runners share with the device is here too: the IR ``Graph`` the frontends
capture (device.capture.torch, device.capture.tf, reached through the capture functions
below, which import their framework on first use: importing device.api imports neither),
the op records ``OPS``, the compute ``PRECISIONS`` (``HALF_PRECISIONS``: the 16-bit ones
mixed_precision.dtype may name), and the optimizer semantics (``OptimizerSpec``, its
``KINDS``, the framework classes the frontends read (``FRAMEWORK_OPTIMIZERS``),
``excluded_from_weight_decay``, the loss-scale bounds and defaults).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from device.capture import refused_tf, refused_torch
from device.cost import CostReport, estimate
from device.dtypes import HALF_PRECISIONS, PRECISIONS
from device.errors import DeviceCompileError
from device.ir import Graph
from device.ops import OPS
from device.optimizer import (DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, FRAMEWORK_OPTIMIZERS, KINDS,
                              MAX_LOSS_SCALE, MIN_LOSS_SCALE, OptimizerSpec, excluded_from_weight_decay)
from device.passes import Finding, Kernel, ValidationReport, match, validate
from device.passes.validate import dtype_suggestion
from device.place import EXECUTION_MODES, Placement, activation_sizes, place
from device.profiles import Profile, get_profile
from device.report import render_text, write_report
from device.runtime.program import Program
from zoo_base.errors import UserError

__all__ = ["DEFAULT_INITIAL_LOSS_SCALE", "DEFAULT_STEPS_PER_INCREASE", "EXECUTION_MODES", "FRAMEWORK_OPTIMIZERS",
           "HALF_PRECISIONS", "KINDS",
           "MAX_LOSS_SCALE", "MIN_LOSS_SCALE", "OPS", "PRECISIONS", "CompileResult", "DeviceCompileError", "Graph",
           "OptimizerSpec", "Program", "build_program", "capture_tf", "capture_torch", "compile_graph",
           "dtype_suggestion", "excluded_from_weight_decay", "load_torch_weights", "refused_op", "render_report",
           "tf_learning_rate", "tf_read_optimizer_state", "tf_read_state", "tf_read_variables", "tf_read_weights",
           "tf_write_optimizer_state", "tf_write_variables", "tf_write_weights", "torch_batch", "torch_state",
           "torch_weights", "validate_and_match", "validate_graph"]


@dataclass
class CompileResult:
    graph: Graph
    mode: str
    execution_mode: str
    profile: Profile
    validation: ValidationReport
    kernels: list[Kernel]
    placement: Placement
    cost: CostReport
    out_dir: Path | None = None  # where the report files were written, if anywhere
    report_files: tuple[str, ...] = ()  # their names (device/report.py: systems.svg in weight streaming only)

    @property
    def training(self) -> bool:
        return self.mode == "train"

    def to_dict(self) -> dict[str, Any]:
        """Everything but the graph (which goes to ir.json), JSON-ready."""
        return {"mode": self.mode, "execution_mode": self.execution_mode, "profile": self.profile.name,
                "frontend": self.graph.frontend, "precision": self.graph.precision,
                "num_params": self.graph.num_params(), "validation": self.validation.to_dict(),
                "performance": self.cost.to_dict(), "placement": self.placement.to_dict(),
                "kernels": [k.to_dict() for k in self.kernels]}


def validate_graph(graph: Graph, *, mode: str, profile_name: str) -> ValidationReport:
    """Validation only; problems are in the report, nothing is raised (an unknown profile is a finding too)."""
    try:
        profile = get_profile(profile_name)
    except UserError as e:
        report = validate(graph, mode=mode, profile=None)
        report.profile = str(profile_name)
        report.errors.append(Finding("profile", str(e)))
        return report
    return validate(graph, mode=mode, profile=profile)


def compile_graph(graph: Graph, *, mode: str, profile_name: str, execution_mode: str = "pipelined",
                  out_dir: str | Path | None = None, micro_batch_size: int | None = None) -> CompileResult:
    """validate -> match -> place -> cost (-> report files in ``out_dir``); raises DeviceCompileError.

    ``micro_batch_size`` (device.micro_batch_size, weight streaming only): None takes the largest that fits.
    """
    profile = get_profile(profile_name)
    if execution_mode not in EXECUTION_MODES:
        raise UserError(f"unknown device.execution_mode {execution_mode!r}; "
                        f"valid modes: {', '.join(EXECUTION_MODES)}")
    report = validate(graph, mode=mode, profile=profile)
    if not report.ok:
        raise DeviceCompileError(f"{report.summary()}\n{report.to_text()}")
    training = mode == "train"
    kernels = match(graph)
    placement = place(kernels, profile, execution_mode, graph.optimizer, training=training,
                      precision=graph.precision, micro_batch_size=micro_batch_size,
                      value_bytes=activation_sizes(graph) if execution_mode == "weight_streaming" else None)
    cost = estimate(graph, kernels, placement, profile, training=training)
    result = CompileResult(graph, mode, execution_mode, profile, report, kernels, placement, cost)
    if out_dir is not None:
        result.out_dir = Path(out_dir)
        result.report_files = tuple(write_report(result, result.out_dir))
    return result


def validate_and_match(graph: Graph, *, mode: str, profile_name: str) -> tuple[ValidationReport, list[Kernel]]:
    """What --validate_only runs: validation, then kernel matching once validation passes."""
    report = validate_graph(graph, mode=mode, profile_name=profile_name)
    return report, (match(graph) if report.ok else [])


def render_report(result: CompileResult) -> str:
    """The text of model_dir/compile/report.txt (what the runners print after --compile_only)."""
    return render_text(result)


def build_program(graph: Graph, weights: dict[str, np.ndarray], state: dict[str, np.ndarray] | None = None, *,
                  seed: int = 0) -> Program:
    """The emulator's training, eval and predict steps of ``graph``, with its own fp32 copy of
    ``weights`` and ``state`` (framework names, as device.capture.* read them)."""
    return Program(graph, weights, state, seed=seed)


# --- capture: each frontend is imported on its first use, so that device.api imports no framework

def capture_torch(step_fn, module, batch, **options) -> Graph:
    """``step_fn(batch)`` of the torch ``module`` as the IR (device/capture/torch/export.py: capture)."""
    from device.capture import torch as frontend
    return frontend.capture(step_fn, module, batch, **options)


def torch_batch(batch) -> dict[str, Any]:
    """A torch batch (a tuple, list or dict of tensors) as capture_torch makes it the graph's inputs:
    its tensors by input name, in ``graph.inputs``' order (device/capture/torch/step.py: batch_tensors);
    a batch the device does not take is a UserError naming where in it the fault is."""
    from device.capture import torch as frontend
    return frontend.batch_tensors(batch)


def torch_weights(module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """The module's trainable parameters by state_dict key (those of ``graph`` when given)."""
    from device.capture import torch as frontend
    return frontend.weights_of(module, graph)


def torch_state(module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """The module's buffers and frozen parameters by state_dict key (those of ``graph`` when given)."""
    from device.capture import torch as frontend
    return frontend.state_of(module, graph)


def load_torch_weights(module, values: dict[str, np.ndarray]) -> None:
    """Arrays into the module's parameters or buffers, by state_dict key."""
    from device.capture import torch as frontend
    frontend.load_weights(module, values)


def capture_tf(tf_graph, **options) -> Graph:
    """A TF graph's forward pass (and optimizer) as the IR (device/capture/tf: capture)."""
    from device.capture import tf as frontend
    return frontend.capture(tf_graph, **options)


def refused_op(framework: str, framework_op: str, form: str = "") -> str | None:
    """What the ``framework`` frontend ("torch" or "tf") tells the user to use in place of
    ``framework_op`` (an aten op such as ``aten.sort.default``, a TF op type such as ``TopKV2``),
    or in place of its refused ``form`` where the frontend lowers the op in other forms; None
    where the frontend does not refuse it. The frontends' own tables answer
    (device/capture/refused_torch.py, refused_tf.py), so a tool that asks never keeps a copy."""
    tables = {"torch": refused_torch, "tf": refused_tf}
    if framework not in tables:
        raise ValueError(f"refused_op: framework {framework!r} is not one of {', '.join(tables)}")
    return tables[framework].suggestion(framework_op, form) or None


def tf_learning_rate(tf_graph, train_op, graph: Graph):
    """The tensor of train_op's learning rate when it is not a constant (a schedule: the
    runner evaluates it at every step), else None: it is ``graph.optimizer.hyper["lr"]``."""
    from device.capture import tf as frontend
    return frontend.learning_rate(tf_graph, train_op, graph)


def tf_loop_source(tf_graph) -> str | None:
    """Where the user's code builds the first tf.while_loop of ``tf_graph`` ("file:line"), or
    None: a graph without loops (a refusal of a generating loop names the line)."""
    from device.capture.tf.tensors import source_loc
    for op in tf_graph.get_operations():
        if op.type in ("LoopCond", "While", "StatelessWhile"):
            loc = source_loc(op)
            return f"{loc.file}:{loc.line}" if loc.line else None
    return None


def tf_read_weights(session, graph: Graph) -> dict[str, np.ndarray]:
    from device.capture import tf as frontend
    return frontend.read_weights(session, graph)


def tf_read_state(session, graph: Graph) -> dict[str, np.ndarray]:
    from device.capture import tf as frontend
    return frontend.read_state(session, graph)


def tf_write_weights(session, graph: Graph, weights: dict[str, np.ndarray]) -> None:
    from device.capture import tf as frontend
    frontend.write_weights(session, graph, weights)


def tf_read_optimizer_state(session, graph: Graph) -> dict:
    from device.capture import tf as frontend
    return frontend.read_optimizer_state(session, graph)


def tf_write_optimizer_state(session, graph: Graph, state: dict) -> None:
    from device.capture import tf as frontend
    frontend.write_optimizer_state(session, graph, state)


def tf_read_variables(session, names: list[str]) -> dict[str, np.ndarray]:
    from device.capture import tf as frontend
    return frontend.read_variables(session, names)


def tf_write_variables(session, values: dict[str, np.ndarray]) -> None:
    from device.capture import tf as frontend
    frontend.write_variables(session, values)
