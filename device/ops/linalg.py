"""Linear algebra: batched matmul with numpy's rules, and einsum."""

from __future__ import annotations

import math
import string

import numpy as np

from device.ops.arrays import unbroadcast
from device.ops.record import FLOAT, OpRecord, Shape, Work, broadcast, contraction


def _matmul_forward(inputs, attrs, ctx):
    a, b = inputs  # (..., M, K) @ (..., K, N) -> (..., M, N), numpy's rules
    return [np.matmul(a, b)], (a, b)


def _matmul_backward(saved, grads, attrs, needs):
    a, b = saved
    g = grads[0]
    # numpy promotes a 1-D a (K,) to (1, K) and a 1-D b (K,) to (K, 1), then drops the dim
    if a.ndim == 1:
        g = np.expand_dims(g, -1 if b.ndim == 1 else -2)
    if b.ndim == 1:
        g = np.expand_dims(g, -1)
    a2 = a[None, :] if a.ndim == 1 else a  # (..., M, K)
    b2 = b[:, None] if b.ndim == 1 else b  # (..., K, N)
    ga = gb = None
    if needs[0]:
        if b2.ndim == 2 and a2.ndim > 2:  # one weight for every batch: a single GEMM
            ga = (g.reshape(-1, g.shape[-1]) @ b2.T).reshape(a2.shape)
        else:
            ga = unbroadcast(np.matmul(g, np.swapaxes(b2, -1, -2)), a2.shape)
        ga = ga.reshape(a.shape)
    if needs[1]:
        if b2.ndim == 2:  # sum over the batch folded into the GEMM's inner dimension
            a_rows, g_rows = a2.reshape(-1, a2.shape[-1]), g.reshape(-1, g.shape[-1])  # (R, K), (R, N)
            if b2.flags.f_contiguous and not b2.flags.c_contiguous:
                # b is a transposed view of an (N, K) weight (torch's Linear): give the
                # gradient that weight's layout, so the optimizer reads it contiguously
                gb = (g_rows.T @ a_rows).T
            else:
                gb = a_rows.T @ g_rows
        else:
            gb = unbroadcast(np.matmul(np.swapaxes(a2, -1, -2), g), b2.shape)
        gb = gb.reshape(b.shape)
    return [ga, gb]


def _einsum_specs(equation: str, shapes: list[tuple[int, ...]]) -> tuple[list[str], str]:
    """Explicit subscripts, one letter per dimension: '...' and implicit outputs resolved."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    specs = lhs.split(",")
    unused = [c for c in string.ascii_letters if c not in eq]
    counts = [len(shape) - (len(s) - 3) for s, shape in zip(specs, shapes) if "..." in s]
    ellipsis = "".join(unused[: max(counts, default=0)])
    # an operand with k ellipsis dims takes the last k letters (numpy aligns them right)
    specs = [s.replace("...", ellipsis[len(ellipsis) - (len(shape) - (len(s) - 3)):]) if "..." in s else s
             for s, shape in zip(specs, shapes)]
    if arrow:
        out = rhs.replace("...", ellipsis)
    else:  # numpy's implicit mode: ellipsis dims, then letters seen once, sorted
        letters = "".join(specs)
        out = ellipsis + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ellipsis))
    return specs, out


def _einsum_forward(inputs, attrs, ctx):
    specs, out = _einsum_specs(attrs["equation"], [x.shape for x in inputs])
    y = np.einsum(",".join(specs) + "->" + out, *inputs, optimize=True)
    return [y], (inputs, specs, out)


def _einsum_backward(saved, grads, attrs, needs):
    inputs, specs, out = saved
    g = grads[0]
    result = []
    for i, (x, spec) in enumerate(zip(inputs, specs)):
        if not needs[i]:
            result.append(None)
            continue
        others = [s for j, s in enumerate(specs) if j != i]
        target = "".join(dict.fromkeys(spec))  # repeated letters (a diagonal) once
        size = {c: n for c, n in zip(spec, x.shape)}
        # letters summed away inside this operand alone get a constant gradient
        known = "".join(c for c in target if c in out or any(c in s for s in others))
        grad = np.einsum(",".join([out] + others) + "->" + known, g,
                         *[x_j for j, x_j in enumerate(inputs) if j != i], optimize=True)
        # size-1 dims numpy broadcast against other operands: sum back
        squeeze = tuple(k for k, c in enumerate(known) if size[c] == 1 and grad.shape[k] != 1)
        if squeeze:
            grad = grad.sum(axis=squeeze, keepdims=True)
        grad = np.broadcast_to(grad.reshape([size[c] if c in known else 1 for c in target]),
                               [size[c] for c in target])
        if len(target) < len(spec):  # scatter onto the diagonal of a zero operand
            full = np.zeros(x.shape, dtype=grad.dtype)
            np.einsum(spec + "->" + target, full)[...] = grad  # a writeable diagonal view
            grad = full
        result.append(grad)
    return result


def _matmul_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    """numpy's matmul: a 1-D operand is a row (a) or a column (b) whose dimension is dropped."""
    a, b = (tuple(s) for s in shapes)
    if len(a) == 1 and len(b) == 1:
        return [()]
    if len(a) == 1:
        return [b[:-2] + b[-1:]]
    if len(b) == 1:
        return [a[:-1]]
    return [broadcast(a[:-2], b[:-2]) + (a[-2], b[-1])]


def _matmul_macs(work: Work) -> float:
    # (..., M, K) @ (..., K, N) -> (..., M, N): K multiply-accumulates per output
    k = work.inputs[0][-1]
    return float(math.prod(work.outputs[0]) * k)


def _einsum_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    specs, out = _einsum_specs(attrs["equation"], shapes)
    size: dict[str, int | None] = {}
    for spec, shape in zip(specs, shapes):
        for letter, n in zip(spec, shape):
            if letter not in size or size[letter] == 1 or (size[letter] is None and n is not None and n != 1):
                size[letter] = n  # a letter of size 1 broadcasts against the others
    return [tuple(size[c] for c in out)]


def _einsum_macs(equation: str, shapes: list[tuple[int, ...]]) -> int:
    """Product of the sizes of all index letters: outputs times the contracted indices."""
    lhs = equation.replace(" ", "").split("->")[0]
    sizes: dict[str, int] = {}
    for term, shape in zip(lhs.split(","), shapes):
        if "..." in term:
            left, right = term.split("...")
            for letter, size in zip(left, shape):
                sizes[letter] = size
            for letter, size in zip(right, shape[len(shape) - len(right):]):
                sizes[letter] = size
            ellipsis = shape[len(left):len(shape) - len(right)]
            sizes["..."] = max(sizes.get("...", 1), math.prod(ellipsis))
        else:
            for letter, size in zip(term, shape):
                sizes[letter] = size
    return math.prod(sizes.values())


RECORDS = (
    # contractions: backward computes two products, d(input) and d(weight)
    OpRecord("matmul", "a @ b, numpy's batched and 1-D rules", ("a", "b"), (), "matmul", (FLOAT, FLOAT),
             _matmul_shape, _matmul_forward, _matmul_backward, cost=contraction(_matmul_macs), backward_ratio=2.0),
    OpRecord("einsum", "numpy.einsum(equation, *operands), '...' and implicit outputs included", ("*operands",),
             ("equation",), "matmul", (FLOAT,), _einsum_shape, _einsum_forward, _einsum_backward,
             cost=contraction(lambda work: float(_einsum_macs(work.attrs["equation"], work.inputs))),
             backward_ratio=2.0),
)
