"""The device API the runners call: validate a captured graph, or compile it all the way.

    validate_graph(graph, mode=..., profile_name=...) -> ValidationReport      (--validate_only)
    compile_graph(graph, mode=..., profile_name=..., execution_mode=..., out_dir=...)
        -> CompileResult                                                        (--compile_only, emulator)

compile_graph runs the stages in pipeline order: validate -> match -> place -> cost, and
writes the report files (device/report.py) only once every stage has succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device.cost import CostReport, estimate
from device.errors import DeviceCompileError
from device.ir import Graph
from device.passes import Finding, Kernel, ValidationReport, match, validate
from device.place import EXECUTION_MODES, Placement, place
from device.profiles import Profile, get_profile
from device.report import write_report
from zoo_base.errors import UserError

__all__ = ["CompileResult", "DeviceCompileError", "EXECUTION_MODES", "compile_graph", "validate_graph"]


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
                  out_dir: str | Path | None = None) -> CompileResult:
    """validate -> match -> place -> cost (-> report files in ``out_dir``); raises DeviceCompileError."""
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
                      precision=graph.precision)
    cost = estimate(graph, kernels, placement, profile, training=training)
    result = CompileResult(graph, mode, execution_mode, profile, report, kernels, placement, cost)
    if out_dir is not None:
        result.out_dir = Path(out_dir)
        write_report(result, result.out_dir)
    return result
