"""What one op of the device IR is: the ``OpRecord``, and the rules records are built from.

A record holds, side by side (as JAX registers a primitive with its implementation, shape
rule and derivative):

    inputs, attrs          the node's inputs (in order; "*operands" is variadic) and attributes
    shape, dtype           output shapes and dtypes from the inputs' (the frontends take them
                           from the framework; validation checks that the two agree)
    dtypes                 per input, the dtypes the device takes there
    forward, backward      the numpy kernel, the op's living definition, and its vector-Jacobian product
    category               which kernel-matching rules see it (device/passes/match.py), and so
                           which library kernel, and which rectangle of PEs, it runs in
    cost                   forward (flops, SRAM bytes); backward as a ratio, or its own rule
    backward_reads         which inputs the backward pass reads (kept from forward to backward)

Kernel conventions (every record's forward and backward):

    forward(inputs, attrs, ctx) -> (outputs, saved)
        inputs: the node's input arrays, in the order ``inputs`` names them; ctx: a
        KernelContext (training flag and the random generator dropout draws from).
        ``saved`` is whatever the gradient needs; the program keeps it until backward.
    backward(saved, grads, attrs, needs) -> one gradient per input
        grads: one array per output (None where no gradient flows); needs: one bool per
        input, False where nobody wants that gradient, so that an expensive kernel can
        skip it (the first layer's input gradient is a third of an MLP's backward).
        A gradient is None for inputs without one (integer ids and labels, skipped
        inputs). ``backward`` is None for ops no gradient flows through (argmax, equal).

numpy broadcasting for elementwise ops (their gradients sum back over the broadcast
axes); a kernel keeps its inputs' float dtype (python scalars only, never a numpy float64
scalar, which would promote float32 arrays); gradients never write into their inputs,
because one gradient array may be shared by several consumers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from device.dtypes import DEVICE_DTYPES, FLOATS, INTEGERS

Shape = tuple  # of int, or None for a dimension unknown until run time


@dataclass
class KernelContext:
    training: bool = False
    rng: np.random.Generator | None = None


Forward = Callable[[list[np.ndarray], dict, KernelContext], tuple[list[np.ndarray], Any]]
Backward = Callable[[Any, list, dict, tuple[bool, ...]], list]
ShapeRule = Callable[[list[Shape], dict], list[Shape]]
DTypeRule = Callable[[list[str], dict], list[str]]


@dataclass(frozen=True)
class Work:
    """What a cost rule sees of one node: shapes for the captured batch, attributes, element size."""

    inputs: list[Shape]
    outputs: list[Shape]
    attrs: dict
    elem: int  # bytes of one floating element in the compute format

    def numel(self, shape: Shape) -> int:
        return math.prod(d or 0 for d in shape)

    @property
    def out(self) -> int:
        """Elements of the first output."""
        return self.numel(self.outputs[0]) if self.outputs else 0

    @property
    def moved(self) -> float:
        """SRAM bytes of a pass that reads every input once and writes the output."""
        return (sum(self.numel(s) for s in self.inputs) + self.out) * self.elem


CostRule = Callable[[Work], tuple[float, float]]  # -> (flops, SRAM bytes) for the captured batch

# fp32 partial sums: the device accumulates in fp32 (wafer-facts.md, number formats)
ACCUMULATOR_BYTES = 4

# categories, in the order the README's op table lists them; each names the kernel-matching
# rules (device/passes/match.py) that take an op of that category
CATEGORIES: dict[str, str] = {
    "elementwise": "fused into elementwise chains, or into the kernel whose output it alone reads",
    "activation": "elementwise; also the activation step of dense, conv and batch_norm kernels",
    "layout": "layout kernel: no PEs, only routing; on a weight, laid out once where the weight lives",
    "matmul": "dense (with a weight), attention (scores, softmax, values), or matmul",
    "conv": "conv, with its bias, batch norm and activation",
    "pool": "pool",
    "reduction": "reduce, or the reduction of a softmax loss",
    "softmax": "softmax, or the start of a hand-written softmax loss",
    "layer_norm": "layer_norm",
    "batch_norm": "batch_norm, or the batch-norm step of a conv",
    "embedding": "embedding",
    "loss": "softmax_loss",
}

# per-input dtype groups
ANY = DEVICE_DTYPES
NUMBERS = (*FLOATS, *INTEGERS)
FLOAT = FLOATS
INTEGER = INTEGERS


# ------------------------------------------------------------------ shape and dtype rules


def same_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[0])]


def same_dtype(dtypes: list[str], attrs: dict) -> list[str]:
    return [dtypes[0]]


def broadcast(*shapes: Shape) -> Shape:
    """numpy broadcasting of shapes; an unknown dimension (None) wins over 1."""
    rank = max(len(s) for s in shapes)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    result = []
    for dims in zip(*padded):
        known = [d for d in dims if d is not None and d != 1]
        if known:
            result.append(known[0])
        elif any(d is None for d in dims):
            result.append(None)
        else:
            result.append(1)
    return tuple(result)


def broadcast_shapes(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [broadcast(*shapes)]


def reduction_axes(axes, rank: int) -> tuple[int, ...]:
    """Reduction axes as non-negative ints; None means all."""
    if axes is None:
        return tuple(range(rank))
    if isinstance(axes, int):
        axes = [axes]
    return tuple(sorted(int(a) % rank for a in axes))


def reduced_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    shape = shapes[0]
    axes = reduction_axes(attrs.get("axes"), len(shape))
    if attrs.get("keepdims", False):
        return [tuple(1 if i in axes else d for i, d in enumerate(shape))]
    return [tuple(d for i, d in enumerate(shape) if i not in axes)]


# ------------------------------------------------------------------------- cost rules


def free(work: Work) -> tuple[float, float]:
    """Layout: no arithmetic, and nothing moves inside PE memory."""
    return 0.0, 0.0


def per_element(flops: int) -> CostRule:
    """``flops`` per output element (one per elementary operation of the numpy definition);
    a pass that reads every input once and writes the output."""
    def cost(work: Work) -> tuple[float, float]:
        return float(flops * work.out), work.moved
    return cost


def per_input_element(flops: int) -> CostRule:
    """``flops`` per element of the first input (a reduction, a loss over its logits)."""
    def cost(work: Work) -> tuple[float, float]:
        return float(flops * work.numel(work.inputs[0])), work.moved
    return cost


def contraction(macs: Callable[[Work], float]) -> CostRule:
    """2 flops per multiply-accumulate; each reads an operand and a partial sum and writes the
    partial sum back: the 2 reads + 1 write per cycle of wafer-facts.md, with fp32 partial sums."""
    def cost(work: Work) -> tuple[float, float]:
        n = macs(work)
        return 2.0 * n, n * (work.elem + 2 * ACCUMULATOR_BYTES)
    return cost


# ---------------------------------------------------------------- backward_reads rules


def reads_everything(index: int, others_are_weights: bool) -> bool:
    """The default: the backward reads every input (a nonlinear op, a contraction)."""
    return True


def reads_nothing(index: int, others_are_weights: bool) -> bool:
    """A backward linear in the activations (add, a layout op, a reduction to a sum): it
    reads none of them. Dropout keeps only a 1-bit mask (not counted)."""
    return False


def reads_unless_scaled_by_weights(index: int, others_are_weights: bool) -> bool:
    """mul: d(x * w)/dx reads only w, so x is kept only when w is an activation too."""
    return not others_are_weights


def reads_numerator_unless_weights(index: int, others_are_weights: bool) -> bool:
    """div: x / w as mul for the numerator; the denominator's gradient reads everything."""
    return index != 0 or not others_are_weights


# --------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class OpRecord:
    name: str
    summary: str  # one line: what the op computes
    inputs: tuple[str, ...]
    attrs: tuple[str, ...]  # "name?" marks an optional attribute
    category: str  # a key of CATEGORIES
    dtypes: tuple[tuple[str, ...], ...]  # per input (a variadic input: one entry for all)
    shape: ShapeRule
    forward: Forward
    backward: Backward | None
    cost: CostRule
    dtype: DTypeRule = same_dtype  # default: every output has the first input's dtype
    backward_ratio: float = 1.0  # backward work (flops and bytes) over forward work
    backward_cost: CostRule | None = None  # the backward's own (flops, bytes), instead of the ratio
    # does the backward read input ``index``, given whether all the other inputs are weights
    # or constants? (then a kernel stashes that input from forward to backward)
    backward_reads: Callable[[int, bool], bool] = reads_everything
    # (output index, input index): in training, that output is the new value of that
    # (non-trainable state) input: batch_norm's running statistics
    state_updates: tuple[tuple[int, int], ...] = ()
    fresh_state: dict = field(default_factory=dict)  # state input index -> value a fresh layer starts at
    loss: bool = False  # computes a loss: it and every node after it stay in fp32 under mixed precision

    def __post_init__(self):
        if self.category not in CATEGORIES:
            raise ValueError(f"op {self.name!r}: category {self.category!r} is not one of {', '.join(CATEGORIES)}")

    @property
    def variadic(self) -> bool:
        return any(name.startswith("*") for name in self.inputs)

    def input_dtypes(self, index: int) -> tuple[str, ...]:
        """The dtypes the device takes at input ``index``."""
        return self.dtypes[min(index, len(self.dtypes) - 1)]

    def required_attrs(self) -> tuple[str, ...]:
        return tuple(a for a in self.attrs if not a.endswith("?"))
