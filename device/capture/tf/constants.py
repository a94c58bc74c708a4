"""Constant folding: the value of a tensor that constants alone determine, computed once.

A shape, an axis, a permutation or a pattern's number (gelu's 1/sqrt(2), dropout's rate)
is often a small stateless subgraph of constants rather than a Const op. ``ConstantFolder``
evaluates such a subgraph (``tf.get_static_value``, else one run in a private session) so
that the lowering can read it as a number, and the IR holds it as a constant.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from device.capture.tf.tensors import shortest

# ops whose value is never folded into a constant even when their inputs are constant
_NOT_FOLDABLE = {"Placeholder", "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "ReadVariableOp"}

# how far a pattern's constant may be from its exact value: rounding in the tensor's dtype
# (Keras' mixed precision writes gelu's 1/sqrt(2) and dropout's 1/(1 - rate) in 16 bits)
_CONST_RTOL = {"float16": 2e-3, "bfloat16": 1e-2}


class ConstantFolder:
    """Folds the constant subgraphs of ``tf_graph``; the batch inputs are never constant."""

    def __init__(self, tf_graph: tf.Graph, inputs: list[tf.Tensor]):
        self.tf_graph = tf_graph
        self.inputs = {t.name for t in inputs}
        self.foldable: dict[str, bool] = {}  # op name -> stateless and fed by constants only
        self.cache: dict[str, np.ndarray | None] = {}  # tensor name -> its value, or None
        self._session = None  # for folding constant subgraphs that get_static_value cannot

    def close(self):
        if self._session is not None:
            self._session.close()

    def value(self, tensor: tf.Tensor) -> np.ndarray | None:
        """The value of a tensor computable from constants alone (folded), else None."""
        if tensor.name in self.cache:
            return self.cache[tensor.name]
        value = None
        if tensor.name not in self.inputs and tensor.dtype not in (tf.resource, tf.variant):
            if tensor.op.type in ("Const", "Shape", "Size", "Rank"):
                value = tf.get_static_value(tensor)
            elif tensor.op.type in ("ZerosLike", "OnesLike") and tensor.shape.is_fully_defined():
                # depends on its input's shape only, which is static
                fill = np.zeros if tensor.op.type == "ZerosLike" else np.ones
                value = fill(tensor.shape.as_list(), tensor.dtype.as_numpy_dtype)
            if value is None and tensor.op.type != "Const" and self._is_foldable(tensor.op):
                value = tf.get_static_value(tensor)
                if value is None:
                    value = self._fold_session().run(tensor)
        value = None if value is None else np.asarray(value)
        self.cache[tensor.name] = value
        return value

    def scalar(self, tensor: tf.Tensor) -> float | None:
        """A one-element constant as a number (the shortest decimal of a float), else None."""
        value = self.value(tensor)
        if value is None or value.size != 1:
            return None
        if not (tensor.dtype.is_floating or tensor.dtype.is_integer or tensor.dtype.is_bool):
            return None  # a complex or string constant: no pattern's number, and validation names its dtype
        if tensor.dtype.is_floating:
            return shortest(value.reshape(()), tensor.dtype.as_numpy_dtype)
        return float(value.reshape(()))

    def is_const(self, tensor: tf.Tensor, expected: float, rtol: float | None = None) -> bool:
        """Whether ``tensor`` is the constant ``expected`` up to rounding in its dtype."""
        value = self.scalar(tensor)
        rtol = rtol if rtol is not None else _CONST_RTOL.get(tensor.dtype.base_dtype.name, 1e-4)
        return value is not None and bool(np.isclose(value, expected, rtol=rtol, atol=0.0))

    def _is_foldable(self, op: tf.Operation) -> bool:
        """Stateless and fed by constants only (iterative: constant subgraphs can be long)."""
        stack = [op]
        while stack:
            current = stack[-1]
            if current.name in self.foldable:
                stack.pop()
                continue
            # control inputs are ignored: they order execution, a stateless op's value does not depend on them
            if (current.type in _NOT_FOLDABLE or current.op_def.is_stateful
                    or any(t.name in self.inputs or t.dtype in (tf.resource, tf.variant) for t in current.inputs)):
                self.foldable[current.name] = False
                stack.pop()
                continue
            pending = [t.op for t in current.inputs if t.op.name not in self.foldable]
            if pending:
                stack.extend(pending)
                continue
            self.foldable[current.name] = all(self.foldable[t.op.name] for t in current.inputs)
            stack.pop()
        return self.foldable[op.name]

    def _fold_session(self):
        if self._session is None:
            self._session = tf.compat.v1.Session(graph=self.tf_graph)
        return self._session
