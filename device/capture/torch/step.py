"""What torch.export traces: the batch's tensors by input name, the wrapper module around the
user's ``step_fn``, and the host's checks on the data that the step makes.

``batch_tensors`` names a batch's tensors as the graph's inputs; ``_Step`` is the module
whose ``forward(*batch)`` rebuilds the batch in its own form and calls ``step_fn``; an
``assert`` or raising ``if`` on a tensor's value is kept as a host check (``_HostChecks``).
"""

from __future__ import annotations

import ast
import contextlib
import linecache
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
import torch.fx

from device.capture.torch.source import _export_failure, _user_frame
from device.ir import SourceLoc
from zoo_base.errors import UserError


def batch_tensors(batch) -> dict[str, torch.Tensor]:
    """The tensors of a batch by the name each takes as a graph input, in the order they become
    ``graph.inputs``: a tuple's or list's are ``batch_0``, ``batch_1``, ...; a dict's are its keys,
    in its order (a DataLoader over dicts collates a dict of tensors, the habit of Hugging Face:
    ``{"input_ids": ..., "attention_mask": ..., "labels": ...}``). A value may itself be a tuple,
    list or dict of tensors, one level deep: its tensors are ``key.0``, ``key.1``, ... or
    ``key.subkey``, as ``state_dict()`` names a module's children.

    Anything else (a list of strings, a number, deeper nesting, a key that is not a str) is one
    ``UserError`` naming where in the batch it is.
    """
    if not isinstance(batch, (tuple, list, Mapping)):
        raise UserError(f"the device takes a batch that is a tuple, list or dict of tensors; the batch is "
                        f"{_kind(batch)}")
    tensors: dict[str, torch.Tensor] = {}
    for name, where, value in _items(batch, "batch", "" if isinstance(batch, Mapping) else "batch_"):
        leaves = [(name, where, value)]
        if isinstance(value, (tuple, list, Mapping)):  # one level of tuple, list or dict in the batch
            leaves = _items(value, where, f"{name}.")
        if not all(isinstance(tensor, torch.Tensor) for _, _, tensor in leaves):
            raise UserError(f"{where} is {_kind(value)}; the device takes a batch whose values are tensors, or "
                            "tuples, lists or dicts of tensors")
        for leaf, leaf_where, tensor in leaves:
            if leaf in tensors:
                raise UserError(f"{leaf_where} would be the device's input {leaf!r}, as another tensor of the batch "
                                "is: rename one of their keys")
            tensors[leaf] = tensor
    if not tensors:
        raise UserError("the batch holds no tensor; the device takes a batch that is a tuple, list or dict of "
                        "tensors")
    return tensors


def _items(container, where: str, prefix: str) -> list[tuple[str, str, Any]]:
    """(input name, where in the batch, value) of each item of a tuple, list or dict."""
    if not isinstance(container, Mapping):
        return [(f"{prefix}{i}", f"{where}[{i}]", value) for i, value in enumerate(container)]
    for key in container:
        if not isinstance(key, str):
            raise UserError(f"{where} has the key {key!r}, {_kind(key)}; the keys of a dict in the batch name the "
                            "device's inputs: they must be str")
    return [(f"{prefix}{key}", f"{where}[{key!r}]", value) for key, value in container.items()]


def _kind(value) -> str:
    """'a str', 'an int', 'a list of str': the type of a value the device does not take, and of
    the first item in it that is not a tensor."""
    name = type(value).__name__
    described = f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"
    items = value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else ()
    first = next((item for item in items if not isinstance(item, torch.Tensor)), None)
    return described if first is None else f"{described} of {type(first).__name__}"


def _rebuilt(template, tensors):
    """A batch of the form of ``template`` (a batch, or its form: None where each tensor goes), its
    tensors taken in ``batch_tensors``' order from the iterator ``tensors``."""
    if template is None or isinstance(template, torch.Tensor):
        return next(tensors)
    if isinstance(template, Mapping):
        return type(template)({key: _rebuilt(value, tensors) for key, value in template.items()})
    values = [_rebuilt(value, tensors) for value in template]
    return type(template)(*values) if hasattr(template, "_fields") else type(template)(values)  # a namedtuple


class _Step(torch.nn.Module):
    """The module torch.export traces: forward(*batch) -> (loss, {name: output tensor}), the step
    called with the batch's tensors (``batch_tensors``) in the batch's own form (a tuple, list or dict)."""

    _PREFIX = "module."  # the user's module is the attribute ``module``: state_dict keys get this prefix

    def __init__(self, step_fn: Callable, module: torch.nn.Module, batch, input_names: list[str]):
        super().__init__()
        self.module = module
        # not a submodule even when it is an nn.Module: names come from `module` alone
        object.__setattr__(self, "step_fn", step_fn)
        # the form of the batch (tuple, list or dict, its keys; None for each tensor) forward gives its
        # tensors: the first batch's tensors themselves stay out of the traced module's attributes
        self.form = _rebuilt(batch, iter([None] * len(input_names)))
        self.input_names = input_names  # what the graph names each of forward's tensors (batch_tensors)
        self.checks = _HostChecks()
        # export keeps only `forward` frames in node stack traces, plus registered anchors;
        # annotate_fn registers its function as one (the wrapper it returns only tags
        # metadata and is not needed), so that a loss written in step_fn gets its own line
        function = step_fn if hasattr(step_fn, "__code__") else getattr(type(step_fn), "__call__", None)
        if hasattr(function, "__code__"):
            torch.fx.traceback.annotate_fn({})(function)

    def forward(self, *batch):  # the batch's tensors (export names them batch_0, batch_1, ...)
        result = self.step_fn(_rebuilt(self.form, iter(batch)))
        outputs: dict = {}
        if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[1], dict):
            result, outputs = result
        if not isinstance(result, torch.Tensor):
            raise UserError("step_fn(batch) must return the loss tensor or a pair (loss, dict of tensors); "
                            f"got {type(result).__name__}")
        for key, value in outputs.items():
            if not isinstance(value, torch.Tensor):
                raise UserError(f"step_fn output {key!r} must be a tensor; got {type(value).__name__}")
        checked = {f"{_CHECK_KEY}{i}": condition for i, (condition, _, _) in enumerate(self.checks.conditions)}
        return result, {**{str(k): v for k, v in outputs.items()}, **checked}


# ---- the host's checks on the data ----

_CHECK_KEY = "\0host_check:"  # the step's outputs under this prefix are the checks' conditions, not outputs


class _NeedsTheBatch(Exception):
    """An if or assert on a tensor's value met while tracing: the step must run on the batch first."""


class _HostChecks:
    """``bool(tensor)`` on the data in the step (``if labels.max() >= vocab: raise ...``,
    ``assert (lengths > 0).all()``), which torch.export cannot trace.

    Such a check belongs to the host. The step runs once eagerly on the capture's batch, recording
    each such bool by the user's line; the export then takes the branch that batch took, and each
    condition becomes a ``host_check`` node that refuses, at the user's line, a later batch on which
    the condition has the other value. The eager run leaves the module's buffers and the random
    generators as it found them.
    """

    def __init__(self):
        self.values: dict[tuple[str, int], list[bool]] | None = None  # the eager run's, per user line
        self.conditions: list[tuple[torch.Tensor, bool, SourceLoc]] = []  # (traced condition, value, line)

    def run_eagerly(self, wrapper: _Step, batch) -> None:
        buffers = [(b, b.detach().clone()) for b in wrapper.module.buffers()]
        rng, np_rng = torch.get_rng_state(), np.random.get_state()
        values: dict[tuple[str, int], list[bool]] = {}
        original = torch.Tensor.__bool__

        def recorded(tensor):
            value = original(tensor)
            file, line, _ = _user_frame()
            values.setdefault((file, line), []).append(value)
            return value

        torch.Tensor.__bool__ = recorded
        try:
            with torch.no_grad():
                wrapper(*batch)
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - the step fails on its own batch: the user's line, one line
            raise UserError(_export_failure(e).replace("torch.export could not capture the training step",
                                                       "the step fails on the batch it is captured with")) from e
        finally:
            torch.Tensor.__bool__ = original
            torch.set_rng_state(rng)
            np.random.set_state(np_rng)
            with torch.no_grad():
                for buffer, value in buffers:
                    buffer.copy_(value)
        self.values = values

    @contextlib.contextmanager
    def tracing(self):
        original = torch.Tensor.__bool__
        seen: dict[tuple[str, int], int] = {}
        self.conditions = []

        def traced(tensor):
            from torch._subclasses.fake_tensor import is_fake
            if not is_fake(tensor) or getattr(tensor, "constant", None) is not None:
                return original(tensor)  # a value known while tracing
            file, line, code = _user_frame()
            if not _is_check(file, line):
                return original(tensor)  # a branch of the computation: refused as torch.export refuses it
            if self.values is None:
                raise _NeedsTheBatch()
            index = seen[(file, line)] = seen.get((file, line), -1) + 1
            taken = self.values.get((file, line), [])
            if index >= len(taken):
                raise UserError(f"{file}:{line}: {code}: the step tests a tensor's value here more often while being "
                                "captured than it did on the batch: it cannot be captured as one static graph")
            self.conditions.append((tensor, taken[index], SourceLoc("bool(Tensor)", file, line, code)))
            return taken[index]

        torch.Tensor.__bool__ = traced
        try:
            yield
        finally:
            torch.Tensor.__bool__ = original


def _is_check(file: str, line: int) -> bool:
    """Is the test at ``file:line`` an ``assert``, or an ``if`` whose whole body raises (and has no else)?
    Only such a test is the host's: any other branch on the data changes what the step computes."""
    try:
        tree = ast.parse("".join(linecache.getlines(file)))
    except (SyntaxError, ValueError):
        return False
    for statement in ast.walk(tree):
        if isinstance(statement, ast.Assert) or (
                isinstance(statement, ast.If) and not statement.orelse
                and all(isinstance(s, ast.Raise) for s in statement.body)):
            if statement.test.lineno <= line <= (statement.test.end_lineno or statement.test.lineno):
                return True
    return False
