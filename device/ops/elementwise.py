"""Elementwise math: numpy broadcasting; the gradients sum back over the broadcast axes."""

from __future__ import annotations

import math

import numpy as np

from device.ops.arrays import binary, erfc, no_gradient, unary
from device.ops.record import (ANY, FLOAT, NUMBERS, OpRecord, broadcast_shapes, per_element, reads_nothing,
                               reads_numerator_unless_weights, reads_unless_scaled_by_weights, same_shape)


def _maximum_weight(a, b, dtype):
    # ties split the gradient in halves, as torch.maximum does (TF gives it all to a;
    # ties have measure zero for real data)
    return np.where(a == b, dtype.type(0.5), (a > b).astype(dtype))


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
)
