"""What every part of the TF frontend reads of a TF graph: shapes, dtypes, operands, names, source lines."""

from __future__ import annotations

import functools
import os
import sysconfig

import numpy as np
import tensorflow as tf

from device import ir
from device.capture import refused_tf
from device.capture.frames import ZOO_DIRS

# TF dtype name -> IR dtype; any other dtype keeps its TF name, which validation rejects
DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16", "float64": "float64",
          "int32": "int32", "int64": "int64", "bool": "bool"}

# frames in these folders are library code; a node's source line is the innermost frame outside them
_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep for p in {
        sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
        os.path.dirname(tf.__file__), *ZOO_DIRS,
    })


def static_shape(tensor: tf.Tensor) -> tuple:
    """Static shape; None marks an unknown dimension (an unknown rank is one unknown dimension)."""
    if tensor.shape.rank is None:
        return (None,)
    return tuple(tensor.shape.as_list())


def ir_dtype(dtype: tf.DType) -> str:
    return DTYPES.get(dtype.base_dtype.name, dtype.base_dtype.name)


def source_loc(op: tf.Operation, framework_op: str | None = None) -> ir.SourceLoc:
    """The op's innermost stack frame in the user's code (outside TF, Keras, common/ and device/),
    and the call the user wrote for an op type refused_tf.CALLS names."""
    framework_op = framework_op or op.type
    call = refused_tf.CALLS.get(framework_op, "")
    for frame in reversed(op.traceback):
        if not _is_library(frame.filename):
            return ir.SourceLoc(framework_op, frame.filename, frame.lineno, call)
    return ir.SourceLoc(framework_op, call=call)


@functools.lru_cache(maxsize=None)
def _is_library(filename: str) -> bool:
    return filename.startswith("<") or os.path.realpath(filename).startswith(_LIBRARY_DIRS)


def operand_pairs(op: tf.Operation):
    """Both orders of a binary op's operands (for commutative patterns)."""
    a, b = op.inputs[0], op.inputs[1]
    return ((a, b), (b, a))


def is_type(tensor: tf.Tensor, *types: str) -> bool:
    return tensor.op.type in types


def same(a: tf.Tensor, b: tf.Tensor) -> bool:
    return a.name == b.name


def same_op(a: tf.Operation | None, b: tf.Operation | None) -> bool:
    return a is not None and b is not None and a.name == b.name


def unwrap_reshape(tensor: tf.Tensor) -> tf.Tensor:
    """The tensor behind reshapes / identities (Keras reshapes gamma to broadcast)."""
    while (is_type(tensor, "Reshape", "Identity")
           or (is_type(tensor, "Cast") and tensor.op.inputs[0].dtype == tensor.dtype)):
        tensor = tensor.op.inputs[0]
    return tensor


def read_handle(tensor: tf.Tensor):
    """The VarHandleOp that ``tensor`` reads (through Identity / Cast / ReadVariableOp), else None."""
    tensor = unwrap_reshape(tensor)
    if is_type(tensor, "ReadVariableOp") and tensor.op.inputs[0].op.type == "VarHandleOp":
        return tensor.op.inputs[0].op
    return None


def variable_name(var_or_tensor) -> str:
    """``dense/kernel`` for a variable, its handle tensor or a read of it."""
    op = var_or_tensor.op
    if op.type == "ReadVariableOp":
        op = op.inputs[0].op
    return op.name


def reachable(roots: list) -> list[tf.Operation]:
    """Every op the roots depend on, through data and control inputs."""
    seen: set[str] = set()
    order: list[tf.Operation] = []
    stack = [r.op if isinstance(r, tf.Tensor) else r for r in roots]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        order.append(op)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
    return order


def f32(value) -> float:
    """A float32 number as the shortest decimal that rounds to it (0.001, not 0.0010000000474974513)."""
    return shortest(value, np.float32)


def shortest(value, dtype) -> float:
    """The shortest decimal that rounds to the same ``dtype`` number as ``value``
    (0.1 for bfloat16's 0.10009765625: the number the user wrote)."""
    target = np.asarray(value).astype(dtype)
    for digits in range(1, 18):
        short = float(f"{float(target):.{digits}g}")
        if np.asarray(short).astype(dtype) == target:
            return short
    return float(target)
