"""The device IR: one framework-neutral graph of a model's forward pass and loss.

Both capture frontends (``device/capture/torch/``, ``device/capture/tf/``) lower a
framework graph to this IR; every later stage (validate, match, place, cost, runtime)
reads only this. Every value has a static shape and a dtype; every node keeps the
framework op it came from and the user's source location, so that a report can point
at the line the user wrote.

The backward pass is not captured: the runtime differentiates the forward IR with the
gradient in each op's record, which keeps the frontends thin (see device/README.md).

The op vocabulary is the records of ``device/ops/`` (inputs, attributes, shape and dtype
rules, kernels); an op without a record is "unsupported" and the validator reports it.
Value dtypes are those of ``device/dtypes.py`` (IR_DTYPES), or a framework dtype the IR
lacks kept under its framework name for validation to name.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from device.optimizer import OptimizerSpec  # a Graph's optimizer (device/optimizer.py)


@dataclass(frozen=True)
class SourceLoc:
    """Where a node came from: the framework op, the user's file and line, and the call the
    user wrote there when the frontend knows it (``nn.BCEWithLogitsLoss``, ``torch.cumprod``)."""

    framework_op: str
    file: str = "<unknown>"
    line: int = 0
    call: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.framework_op})"


@dataclass
class Value:
    name: str
    shape: tuple[int | None, ...]  # None marks a dynamic dimension (rejected by validate)
    dtype: str


@dataclass
class Node:
    name: str
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    loc: SourceLoc = SourceLoc("<unknown>")


@dataclass
class Graph:
    """A captured training step: forward ops up to a scalar loss."""

    frontend: str  # "torch" or "tf"
    values: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)  # topological order
    inputs: list[str] = field(default_factory=list)  # batch inputs, in feed order
    params: dict[str, str] = field(default_factory=dict)  # value name -> framework variable name (trainable)
    state: dict[str, str] = field(default_factory=dict)  # value name -> framework name (non-trainable, e.g. BN stats)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    loss: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # e.g. {"logits": value name}
    optimizer: OptimizerSpec | None = None
    precision: str = "float32"  # compute format: one of device.dtypes.PRECISIONS
    # findings of the frontend that validation reports (unsupported ops, metrics in a
    # training graph, ...): each {"kind", "message", "loc"}
    issues: list[dict[str, Any]] = field(default_factory=list)

    def add_value(self, name: str, shape, dtype: str) -> str:
        if name in self.values:
            raise ValueError(f"IR value {name!r} defined twice")
        self.values[name] = Value(name, tuple(shape), dtype)
        return name

    def add_node(self, op: str, inputs: list[str], outputs: list[str], attrs=None, loc=None, name=None) -> Node:
        node = Node(name or f"{op}_{len(self.nodes)}", op, list(inputs), list(outputs), dict(attrs or {}),
                    loc or SourceLoc(op))
        self.nodes.append(node)
        return node

    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        result: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                result.setdefault(i, []).append(n)
        return result

    def num_params(self) -> int:
        return sum(int(np.prod(self.values[v].shape)) for v in self.params)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dump (the IR file in model_dir/compile/)."""
        return {
            "frontend": self.frontend,
            "precision": self.precision,
            "inputs": self.inputs,
            "loss": self.loss,
            "outputs": self.outputs,
            "params": self.params,
            "state": self.state,
            "optimizer": dataclasses.asdict(self.optimizer) if self.optimizer else None,
            "values": {k: {"shape": list(v.shape), "dtype": v.dtype} for k, v in self.values.items()},
            "constants": {k: {"shape": list(np.shape(c)), "dtype": str(np.asarray(c).dtype)}
                          for k, c in self.constants.items()},
            "nodes": [{"name": n.name, "op": n.op, "inputs": n.inputs, "outputs": n.outputs,
                       "attrs": _jsonable(n.attrs), "loc": str(n.loc)} for n in self.nodes],
        }


def _jsonable(obj):
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj
