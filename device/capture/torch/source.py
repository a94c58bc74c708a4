"""The user's line: which frames of a stack are the user's code, and the call written there.

A node's source line is the innermost frame of its stack trace outside torch and the zoo's
own folders (device/capture/frames.py); the call is the torch.nn layer, torch function,
Tensor method or Python operator the user wrote. A failure of torch.export is told in one
line at the user's frame, with what it means for the device.
"""

from __future__ import annotations

import functools
import os
import re
import traceback

import torch
import torch.fx

from device.capture.frames import ZOO_DIRS
from device.capture.torch.recurrent import packed_sequence_hint
from device.ir import SourceLoc


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _internal_dirs() -> tuple[str, ...]:
    """Folders whose frames are never the user's line: torch, the emulator, the runners."""
    return (os.path.realpath(os.path.dirname(torch.__file__)), *ZOO_DIRS)


_INTERNAL_DIRS = _internal_dirs()


def _source_loc(node: torch.fx.Node) -> SourceLoc:
    """The innermost frame of the node's stack trace that is the user's own code, and the call
    the user wrote there."""
    op, call = str(node.target), _user_call(node)
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    for path, line in reversed(frames):
        if _is_user_file(path):
            return SourceLoc(op, path, int(line), call)
    return SourceLoc(op, call=call)


@functools.lru_cache(maxsize=4096)
def _is_user_file(path: str) -> bool:
    """Whether a frame's file is the user's: once per file (a model's nodes share a few files, and
    resolving links costs system calls)."""
    # "<eval_with_key>" is code torch generated (the branches of torch.cond)
    real = os.path.realpath(path)
    return not path.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS)


# Python operators on tensors, as the user wrote them
_OPERATORS = {"__and__": "&", "__rand__": "&", "__or__": "|", "__ror__": "|", "__xor__": "^", "__rxor__": "^",
              "__invert__": "~", "__lshift__": "<<", "__rshift__": ">>", "__mod__": "%", "__rmod__": "%",
              "__floordiv__": "//", "__rfloordiv__": "//", "__pow__": "**", "__rpow__": "**", "__matmul__": "@",
              "__getitem__": "tensor[...]", "__setitem__": "tensor[...] = ...", "__add__": "+", "__radd__": "+",
              "__sub__": "-", "__rsub__": "-", "__mul__": "*", "__rmul__": "*", "__truediv__": "/",
              "__rtruediv__": "/", "__neg__": "-", "__abs__": "abs", "__lt__": "<", "__le__": "<=", "__gt__": ">",
              "__ge__": ">=", "__eq__": "==", "__ne__": "!="}


def _user_call(node: torch.fx.Node) -> str:
    """The call the user wrote that made this node: the torch.nn layer it runs in
    (``nn.BCEWithLogitsLoss``), else the torch function, Tensor method or Python operator
    (``torch.cumprod``, ``F.pad``, ``Tensor.sort``, ``&``); empty if export recorded neither."""
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        _, kind = list(stack.values())[-1]
        kind = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
        if kind.startswith("torch.nn.modules."):
            return "nn." + kind.rsplit(".", 1)[-1]
    fn = node.meta.get("torch_fn")
    if not (isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[1], str) and "." in fn[1]):
        return ""
    kind, name = fn[1].split(".", 1)
    if name in _OPERATORS:
        return _OPERATORS[name]
    if kind in ("method_descriptor", "method", "getset_descriptor"):
        return f"Tensor.{name}"
    if kind in ("builtin_function_or_method", "function"):
        return f"F.{name}" if hasattr(torch.nn.functional, name) else f"torch.{name}"
    return name


def _user_frame() -> tuple[str, int, str]:
    """The innermost frame of the running Python stack that is the user's code: (file, line, its text)."""
    for frame in reversed(traceback.extract_stack()):
        real = os.path.realpath(frame.filename)
        if not frame.filename.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS):
            return frame.filename, frame.lineno or 0, (frame.line or "").strip()
    return "<unknown>", 0, ""


# what torch.export's refusals mean, in the user's words
_EXPORT_HINTS = (
    ("data-dependent", "control flow or a size that depends on a tensor's values (if on a tensor, .item(), "
                       ".tolist(), a slice bound read from a tensor): the device runs one static graph; use "
                       "torch.where or a mask instead of branching, and sizes known from the input shapes"),
    ("sparse", "sparse tensors are not device data: use dense tensors"),
)


def _export_failure(error: Exception) -> str:
    """One line: the user's file and line where tracing stopped, what stopped it, and what to do."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else type(error).__name__
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        real = os.path.realpath(frame.filename)
        if not frame.filename.startswith("<") and not any(real.startswith(d + os.sep) for d in _INTERNAL_DIRS):
            where = f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}: "
            break
    hint = packed_sequence_hint(error) or next(
        (h for key, h in _EXPORT_HINTS if key in text.lower() or key in type(error).__name__.lower()), "")
    return f"{where}torch.export could not capture the training step: {first}" + (f" ({hint})" if hint else "")
