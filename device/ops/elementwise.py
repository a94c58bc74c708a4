"""Elementwise math: numpy broadcasting; the gradients sum back over the broadcast axes.

Comparisons and logical ops give bool values (padding and causal masks) and carry no
gradient; ``where`` selects between two values with a bool condition, and its gradient
goes to the branch each element came from.
"""

from __future__ import annotations

import math

import numpy as np

from device.ops.arrays import binary, erfc, no_gradient, unary, unbroadcast
from device.ops.record import (ANY, FLOAT, NUMBERS, OpRecord, broadcast_shapes, per_element, reads_nothing,
                               reads_numerator_unless_weights, reads_unless_scaled_by_weights, same_shape)

BOOL = ("bool",)


def _maximum_weight(a, b, dtype):
    # ties split the gradient in halves, as torch.maximum does (TF gives it all to a;
    # ties have measure zero for real data)
    return np.where(a == b, dtype.type(0.5), (a > b).astype(dtype))


def _minimum_weight(a, b, dtype):
    # the share of the gradient that goes to a: ties split in halves, as torch.minimum
    return np.where(a == b, dtype.type(0.5), (a < b).astype(dtype))


def _where_forward(inputs, attrs, ctx):
    condition, a, b = inputs
    return [np.where(condition, a, b)], (condition, np.shape(a), np.shape(b))


def _where_backward(saved, grads, attrs, needs):
    condition, a_shape, b_shape = saved
    g = grads[0]
    zero = g.dtype.type(0)
    return [None,
            unbroadcast(np.where(condition, g, zero), a_shape) if needs[1] else None,
            unbroadcast(np.where(condition, zero, g), b_shape) if needs[2] else None]


def _predicate(name: str, summary: str, fn, dtypes=ANY, arity: int = 2) -> OpRecord:
    """A comparison or logical op: bool values out, no gradient, no backward work."""
    inputs = ("a", "b") if arity == 2 else ("x",)
    return OpRecord(name, summary, inputs, (), "elementwise", (dtypes,) * arity, broadcast_shapes,
                    dtype=lambda dtypes, attrs: ["bool"], **no_gradient(lambda inputs, attrs: fn(*inputs)),
                    cost=per_element(1), backward_ratio=0.0, backward_reads=reads_nothing)


def _binary_op(name: str, summary: str, kernel: dict, dtypes=NUMBERS, **kw) -> OpRecord:
    return OpRecord(name, summary, ("a", "b"), (), "elementwise", (dtypes, dtypes), broadcast_shapes,
                    cost=per_element(1), **kernel, **kw)


def _unary_op(name: str, summary: str, kernel: dict, dtypes=FLOAT, **kw) -> OpRecord:
    return OpRecord(name, summary, ("x",), (), "elementwise", (dtypes,), same_shape, cost=per_element(1),
                    **kernel, **kw)


RECORDS = (
    _binary_op("add", "a + b", binary(np.add, lambda g, a, b, y: g, lambda g, a, b, y: g),
               backward_reads=reads_nothing),
    _binary_op("sub", "a - b", binary(np.subtract, lambda g, a, b, y: g, lambda g, a, b, y: -g),
               backward_reads=reads_nothing),
    _binary_op("mul", "a * b", binary(np.multiply, lambda g, a, b, y: g * b, lambda g, a, b, y: g * a),
               backward_reads=reads_unless_scaled_by_weights),
    _binary_op("div", "a / b (floats: true division)",
               binary(np.divide, lambda g, a, b, y: g / b, lambda g, a, b, y: -g * y / b), dtypes=FLOAT,
               backward_reads=reads_numerator_unless_weights),
    _binary_op("maximum", "max(a, b); ties share the gradient",
               binary(np.maximum, lambda g, a, b, y: g * _maximum_weight(a, b, g.dtype),
                      lambda g, a, b, y: g * (1 - _maximum_weight(a, b, g.dtype)))),
    _unary_op("neg", "-x", unary(lambda x, at: -x, lambda x, y, at: -1), dtypes=NUMBERS,
              backward_reads=reads_nothing),
    _unary_op("exp", "e ** x", unary(lambda x, at: np.exp(x), lambda x, y, at: y)),
    _unary_op("erf", "the error function",
              unary(lambda x, at: 1 - erfc(x), lambda x, y, at: (2 / math.sqrt(math.pi)) * np.exp(-x * x))),
    _unary_op("log", "natural logarithm", unary(lambda x, at: np.log(x), lambda x, y, at: 1 / x)),
    _unary_op("sqrt", "square root", unary(lambda x, at: np.sqrt(x), lambda x, y, at: 0.5 / y)),
    _unary_op("rsqrt", "1 / sqrt(x)", unary(lambda x, at: 1 / np.sqrt(x), lambda x, y, at: -0.5 * y * y * y)),
    _unary_op("square", "x * x", unary(lambda x, at: x * x, lambda x, y, at: 2 * x), dtypes=NUMBERS),
    # an eval helper: no gradient, and no backward work
    OpRecord("equal", "a == b, elementwise (bool)", ("a", "b"), (), "elementwise", (ANY, ANY), broadcast_shapes,
             dtype=lambda dtypes, attrs: ["bool"],
             **no_gradient(lambda inputs, attrs: np.equal(inputs[0], inputs[1])),
             cost=per_element(1), backward_ratio=0.0, backward_reads=reads_nothing),
    # language ops: masks, padding and the integer arithmetic of relative-position buckets
    _binary_op("minimum", "min(a, b); ties share the gradient",
               binary(np.minimum, lambda g, a, b, y: g * _minimum_weight(a, b, g.dtype),
                      lambda g, a, b, y: g * (1 - _minimum_weight(a, b, g.dtype)))),
    # integer (or float) division rounded down, as Python's //; no gradient (torch's is zero)
    _binary_op("floor_div", "floor(a / b), as Python's // (ints: b must not be 0)",
               no_gradient(lambda inputs, attrs: np.floor_divide(inputs[0], inputs[1])),
               backward_ratio=0.0, backward_reads=reads_nothing),
    _unary_op("abs", "abs(x) (gradient sign(x), 0 at 0)",
              unary(lambda x, at: np.abs(x), lambda x, y, at: np.sign(x)), dtypes=NUMBERS),
    _unary_op("log1p", "log(1 + x), exact for small x", unary(lambda x, at: np.log1p(x), lambda x, y, at: 1 / (1 + x))),
    _unary_op("floor", "the largest integer not above x (gradient 0)",
              unary(lambda x, at: np.floor(x), lambda x, y, at: np.zeros_like(x))),
    OpRecord("where", "a where condition, else b (bool condition, broadcast)", ("condition", "a", "b"), (),
             "elementwise", (BOOL, ANY, ANY), broadcast_shapes, _where_forward, _where_backward,
             dtype=lambda dtypes, attrs: [dtypes[1]], cost=per_element(1),
             backward_reads=lambda index, others_are_weights: index == 0),  # the condition picks the branch
    _predicate("not_equal", "a != b, elementwise (bool)", np.not_equal),
    _predicate("less", "a < b, elementwise (bool)", np.less, NUMBERS),
    _predicate("less_equal", "a <= b, elementwise (bool)", np.less_equal, NUMBERS),
    _predicate("greater", "a > b, elementwise (bool)", np.greater, NUMBERS),
    _predicate("greater_equal", "a >= b, elementwise (bool)", np.greater_equal, NUMBERS),
    _predicate("logical_and", "a and b (bool)", np.logical_and, BOOL),
    _predicate("logical_or", "a or b (bool)", np.logical_or, BOOL),
    _predicate("logical_not", "not x (bool)", np.logical_not, BOOL, arity=1),
)
