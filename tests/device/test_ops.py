"""Every op record (device/ops/), walked: kernel against torch autograd, rules, cost, matching.

One table of cases, at least one per record; a record without a case fails
test_every_record_has_a_case. For every case:

- forward and gradient against torch autograd in float64 (tight tolerances), and again in
  float32 to check that no kernel promotes to float64 (these need torch; the TF-specific
  semantics are checked against TensorFlow in test_kernels_tf.py, conv2d against a loop
  reference in test_kernels_numpy.py);
- the record's shape and dtype rules give what its kernel returns;
- its cost rule gives figures, and the op alone is matched into a library kernel.

The op table of device/README.md is generated from the records and must be current
(``python -m device.ops --write-readme`` rewrites it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pytest

from device.dtypes import EMULATOR_STORAGE, round_to
from device.ir import Graph
from device.ops import CATEGORIES, OPS, KernelContext
from device.ops.table import readme_table_is_current
from device.ops.record import Work
from device.passes.match import match
from zoo_base.errors import UserError

try:  # the cases' references call torch only when they run: the rest of the walk needs no framework
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def T(name: str) -> Callable:
    """torch.<name>, looked up when the case runs."""
    return lambda *args: getattr(torch, name)(*args)


def Fn(name: str) -> Callable:
    """torch.nn.functional.<name>, looked up when the case runs."""
    return lambda *args, **kw: getattr(F, name)(*args, **kw)

RNG = np.random.default_rng(1234)


def randn(*shape):
    return RNG.standard_normal(shape)


def positive(*shape):
    return RNG.uniform(0.5, 2.0, shape)


def ints(high, *shape):
    return RNG.integers(0, high, shape)


def nchw(t):  # NHWC tensor -> NCHW
    return t.permute(0, 3, 1, 2)


def nhwc(t):  # NCHW tensor -> NHWC
    return t.permute(0, 2, 3, 1)


@dataclass
class Case:
    op: str
    inputs: list[np.ndarray]
    attrs: dict
    reference: Callable  # torch tensors -> torch tensor (the kernel's first output)
    name: str = ""
    training: bool = True
    rtol: float = 1e-7
    atol: float = 1e-10
    tags: dict = field(default_factory=dict)

    @property
    def id(self):
        return f"{self.op}-{self.name}" if self.name else self.op


def bn_reference(axis_last: bool, training: bool, momentum=0.1, eps=1e-5):
    def reference(x, gamma, beta, mean, var):
        mean, var = mean.detach().clone(), var.detach().clone()
        if axis_last:
            return nhwc(F.batch_norm(nchw(x), mean, var, gamma, beta, training, momentum, eps))
        return F.batch_norm(x, mean, var, gamma, beta, training, momentum, eps)

    return reference


CASES = [
    # elementwise
    Case("add", [randn(2, 3, 4), randn(3, 1)], {}, lambda a, b: a + b, "broadcast"),
    Case("sub", [randn(4), randn(2, 3, 4)], {}, lambda a, b: a - b, "broadcast"),
    Case("mul", [randn(2, 3, 4), randn(2, 1, 4)], {}, lambda a, b: a * b),
    Case("div", [randn(2, 3), positive(3)], {}, lambda a, b: a / b),
    Case("maximum", [randn(2, 3), randn(3)], {}, T("maximum")),
    Case("neg", [randn(3, 4)], {}, T("neg")),
    Case("exp", [randn(3, 4)], {}, T("exp")),
    Case("erf", [randn(3, 4) * 2], {}, T("erf"), rtol=1e-6, atol=1e-6),
    Case("log", [positive(3, 4)], {}, T("log")),
    Case("sqrt", [positive(3, 4)], {}, T("sqrt")),
    Case("rsqrt", [positive(3, 4)], {}, T("rsqrt")),
    Case("square", [randn(3, 4)], {}, T("square")),
    Case("identity", [randn(3, 4)], {}, lambda x: x.clone()),
    Case("cast", [randn(3, 4)], {"dtype": "float32"}, lambda x: x.float(), "float32"),
    Case("cast", [randn(3, 4)], {"dtype": "bfloat16"}, lambda x: x.to(torch.bfloat16).float(), "bfloat16"),
    Case("cast", [randn(3, 4) * 5], {"dtype": "int64"}, lambda x: x.to(torch.int64), "int64"),
    # activations
    Case("relu", [randn(3, 4)], {}, T("relu")),
    Case("tanh", [randn(3, 4)], {}, T("tanh")),
    Case("sigmoid", [randn(3, 4) * 4], {}, T("sigmoid")),
    Case("elu", [randn(3, 4)], {"alpha": 0.7}, lambda x: F.elu(x, alpha=0.7)),
    Case("selu", [randn(3, 4)], {}, Fn("selu")),
    Case("gelu", [randn(4, 5) * 2], {"approximate": "none"}, Fn("gelu"), "erf", rtol=1e-6, atol=1e-6),
    Case("gelu", [randn(4, 5) * 2], {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh"), "tanh"),
    Case("softplus", [randn(4, 5) * 8], {"beta": 2.0, "threshold": 10.0},
         lambda x: F.softplus(x, beta=2.0, threshold=10.0), "threshold"),  # both sides of the threshold
    Case("softplus", [randn(4, 5) * 3], {}, Fn("softplus"), "tf"),  # beta 1, no threshold: TF's form
    Case("dropout", [randn(3, 4)], {"rate": 0.3}, lambda x: F.dropout(x, 0.3, training=False), "eval",
         training=False),
    Case("dropout", [randn(3, 4)], {"rate": 0.0}, lambda x: F.dropout(x, 0.0, training=True), "rate0"),
    # linear algebra
    Case("matmul", [randn(2, 3, 4), randn(4, 5)], {}, T("matmul"), "shared-weight"),
    Case("matmul", [randn(3, 4), randn(2, 4, 5)], {}, T("matmul"), "broadcast-a"),
    Case("matmul", [randn(2, 1, 3, 4), randn(5, 4, 2)], {}, T("matmul"), "batch-broadcast"),
    Case("matmul", [randn(4), randn(2, 4, 5)], {}, T("matmul"), "vector-a"),
    Case("matmul", [randn(2, 3, 4), randn(4)], {}, T("matmul"), "vector-b"),
    Case("matmul", [randn(4), randn(4)], {}, T("matmul"), "dot"),
    Case("einsum", [randn(2, 3, 4), randn(2, 4, 5)], {"equation": "bij,bjk->bik"},
         lambda a, b: torch.einsum("bij,bjk->bik", a, b), "batched"),
    Case("einsum", [randn(2, 3, 4, 5), randn(2, 3, 6, 5)], {"equation": "bhqd, bhkd -> bhqk"},
         lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), "attention"),
    Case("einsum", [randn(3, 3)], {"equation": "ii->"}, lambda a: torch.einsum("ii->", a), "trace"),
    Case("einsum", [randn(3, 4), randn(5, 6)], {"equation": "ij,kl->ik"},
         lambda a, b: torch.einsum("ij,kl->ik", a, b), "summed-alone"),
    Case("einsum", [randn(2, 3, 4), randn(4, 5)], {"equation": "...ij,jk->...ik"},
         lambda a, b: torch.einsum("...ij,jk->...ik", a, b), "ellipsis"),
    Case("einsum", [randn(3, 4), randn(4, 5), randn(5, 2)], {"equation": "ij,jk,kl"},
         lambda a, b, c: torch.einsum("ij,jk,kl", a, b, c), "implicit-three"),
    # shape
    Case("reshape", [randn(2, 3, 4)], {"shape": [4, -1]}, lambda x: x.reshape(4, -1)),
    Case("transpose", [randn(2, 3, 4)], {"perm": [2, 0, 1]}, lambda x: x.permute(2, 0, 1)),
    Case("concat", [randn(2, 1, 3), randn(2, 4, 3), randn(2, 2, 3)], {"axis": 1}, lambda *xs: torch.cat(xs, 1)),
    Case("slice", [randn(6, 4, 3)], {"begin": [1, -3], "end": [5, 4], "step": [2, 1]}, lambda x: x[1:5:2, -3:4]),
    Case("broadcast_to", [randn(3, 1)], {"shape": [2, 3, 4]}, lambda x: x.expand(2, 3, 4)),
    # reductions
    Case("reduce_sum", [randn(2, 3, 4)], {"axes": [0, 2], "keepdims": False}, lambda x: x.sum((0, 2)), "axes"),
    Case("reduce_sum", [randn(2, 3, 4)], {"axes": None, "keepdims": False}, lambda x: x.sum(), "all"),
    Case("reduce_sum", [randn(2, 3, 4)], {"axes": [1], "keepdims": True}, lambda x: x.sum(1, keepdim=True), "keepdims"),
    Case("reduce_mean", [randn(2, 3, 4)], {"axes": [0, 2], "keepdims": False}, lambda x: x.mean((0, 2)), "drop"),
    Case("reduce_mean", [randn(2, 3, 4)], {"axes": [-1], "keepdims": True}, lambda x: x.mean(-1, keepdim=True)),
    Case("reduce_max", [randn(2, 3, 4)], {"axes": [1], "keepdims": False}, lambda x: torch.amax(x, 1)),
    Case("reduce_max", [ints(3, 4, 5).astype(float)], {"axes": [0, 1], "keepdims": True},
         lambda x: torch.amax(x, (0, 1), keepdim=True), "ties"),
    # normalisation and softmax
    Case("softmax", [randn(2, 3, 4)], {"axis": 1}, lambda x: F.softmax(x, 1)),
    Case("log_softmax", [randn(2, 3, 4) * 3], {"axis": -1}, lambda x: F.log_softmax(x, -1)),
    Case("layer_norm", [randn(2, 3, 5), randn(5), randn(5)], {"axes": [-1], "eps": 1e-5},
         lambda x, g, b: F.layer_norm(x, (5,), g, b, 1e-5), "last"),
    Case("layer_norm", [randn(2, 3, 4), randn(3, 4), randn(3, 4)], {"axes": [1, 2], "eps": 1e-3},
         lambda x, g, b: F.layer_norm(x, (3, 4), g, b, 1e-3), "two-axes"),
    Case("layer_norm", [randn(3, 4), randn(3, 4), randn(3, 4)], {"axes": [0, 1], "eps": 1e-5},
         lambda x, g, b: F.layer_norm(x, (3, 4), g, b, 1e-5), "every-axis"),
    # over a middle axis (torch normalises trailing axes only: by hand)
    Case("layer_norm", [randn(2, 3, 4), randn(3), randn(3)], {"axes": [1], "eps": 1e-3},
         lambda x, g, b: (x - x.mean(1, keepdim=True)) / torch.sqrt(x.var(1, unbiased=False, keepdim=True) + 1e-3)
         * g[:, None] + b[:, None], "middle-axis"),
    Case("batch_norm", [randn(4, 3, 2, 2), randn(3), randn(3), randn(3), positive(3)],
         {"axis": 1, "eps": 1e-5, "momentum": 0.1}, bn_reference(False, True), "nchw"),
    Case("batch_norm", [randn(4, 2, 2, 3), randn(3), randn(3), randn(3), positive(3)],
         {"axis": -1, "eps": 1e-3, "momentum": 0.01}, bn_reference(True, True, 0.01, 1e-3), "nhwc"),
    Case("batch_norm", [randn(5, 3), randn(3), randn(3), randn(3), positive(3)],
         {"axis": 1, "eps": 1e-5, "momentum": 0.1}, bn_reference(False, False), "eval", training=False),
    Case("batch_norm", [randn(2, 3, 4, 5), randn(3), randn(3), randn(3), positive(3)],
         {"axis": 1, "eps": 1e-5, "momentum": 0.1}, bn_reference(False, False), "eval-nchw", training=False),
    # vision
    Case("conv2d", [randn(2, 3, 7, 6), randn(4, 3, 3, 2)],
         {"strides": [2, 1], "padding": [[1, 0], [2, 1]], "dilations": [1, 2], "layout": "NCHW",
          "weight_layout": "OIHW"},
         lambda x, w: F.conv2d(F.pad(x, (2, 1, 1, 0)), w, stride=(2, 1), dilation=(1, 2)), "nchw-explicit"),
    Case("conv2d", [randn(2, 8, 8, 3), randn(3, 3, 3, 4)],
         {"strides": [2, 2], "padding": "SAME", "dilations": [1, 1], "layout": "NHWC", "weight_layout": "HWIO"},
         # TensorFlow's SAME for 8 pixels, kernel 3, stride 2: 4 outputs, pad 0 before, 1 after
         lambda x, w: nhwc(F.conv2d(F.pad(nchw(x), (0, 1, 0, 1)), w.permute(3, 2, 0, 1), stride=2)), "nhwc-same"),
    Case("conv2d", [randn(2, 5, 5, 3), randn(2, 2, 3, 4)],
         {"strides": 1, "padding": "VALID", "dilations": 1, "layout": "NHWC", "weight_layout": "HWIO"},
         lambda x, w: nhwc(F.conv2d(nchw(x), w.permute(3, 2, 0, 1))), "nhwc-valid"),
    Case("conv2d", [randn(2, 6, 5, 5), randn(4, 3, 3, 3)],
         {"strides": [1, 2], "padding": [[1, 1], [0, 1]], "layout": "NCHW", "weight_layout": "OIHW", "groups": 2},
         lambda x, w: F.conv2d(F.pad(x, (0, 1, 1, 1)), w, stride=(1, 2), groups=2), "nchw-grouped"),
    Case("conv2d", [randn(2, 6, 6, 3), randn(3, 3, 1, 6)],
         {"strides": [2, 2], "padding": "SAME", "dilations": [1, 1], "layout": "NHWC", "weight_layout": "HWIO",
          "groups": 3},
         # depthwise with a channel multiplier of 2 (TF's DepthwiseConv2dNative, its filter reshaped to HWIO)
         lambda x, w: nhwc(F.conv2d(F.pad(nchw(x), (0, 1, 0, 1)), w.permute(3, 2, 0, 1), stride=2, groups=3)),
         "nhwc-depthwise"),
    Case("max_pool2d", [randn(2, 3, 7, 7)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW"},
         lambda x: F.max_pool2d(x, 3, 2, padding=1), "nchw-padded"),
    Case("max_pool2d", [randn(2, 6, 6, 3)], {"kernel": [3, 3], "strides": [2, 2], "padding": "SAME", "layout": "NHWC"},
         lambda x: nhwc(F.max_pool2d(F.pad(nchw(x), (0, 1, 0, 1), value=-np.inf), 3, 2)), "nhwc-same"),
    # tied maxima (0, 1 or 2 everywhere), overlapping windows: torch gives the gradient to the first
    Case("max_pool2d", [ints(3, 2, 3, 7, 7).astype(float)],
         {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW"},
         lambda x: F.max_pool2d(x, 3, 2, padding=1), "ties"),
    Case("avg_pool2d", [randn(2, 3, 7, 7)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW"},
         lambda x: F.avg_pool2d(x, 3, 2, padding=1), "nchw-count-pad"),
    Case("avg_pool2d", [randn(2, 7, 7, 3)], {"kernel": 3, "strides": 2, "padding": "SAME", "layout": "NHWC"},
         lambda x: nhwc(F.avg_pool2d(nchw(x), 3, 2, padding=1, count_include_pad=False)), "nhwc-same"),
    # height and width padded differently; a batch of 3 (the count of the input pixels per window is one map)
    Case("max_pool2d", [randn(2, 3, 7, 6)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [0, 0]], "layout": "NCHW"},
         lambda x: F.max_pool2d(x, 3, 2, padding=(1, 0)), "padded-one-axis"),
    Case("avg_pool2d", [randn(3, 6, 5, 2)], {"kernel": 3, "strides": 2, "padding": "SAME", "layout": "NHWC"},
         # TF's SAME for 6 x 5 pixels: pads (0, 1) and (1, 1); the mean of the input pixels only
         lambda x: nhwc(F.avg_pool2d(F.pad(nchw(x), (1, 1, 0, 1)), 3, 2)
                        / F.avg_pool2d(F.pad(torch.ones_like(nchw(x)), (1, 1, 0, 1)), 3, 2)), "same-uneven"),
    Case("avg_pool2d", [randn(2, 3, 7, 7)],
         {"kernel": [3, 2], "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW"},
         lambda x: F.avg_pool2d(x, (3, 2), 2, padding=1), "count-pad-3x2"),
    Case("avg_pool2d", [randn(2, 3, 7, 7)],
         {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW", "count_include_pad": False},
         lambda x: F.avg_pool2d(x, 3, 2, padding=1, count_include_pad=False), "count-inputs-only"),
    # language
    Case("embedding", [randn(7, 4), np.array([[1, 3, 1], [6, 0, 1]])], {}, lambda t, ids: F.embedding(ids, t)),
    # language ops: torch's padding_idx, on a table whose padding row is not zero
    Case("embedding", [randn(7, 4), np.array([[1, 3, 1], [6, 0, 1]])], {"padding_idx": 1},
         lambda t, ids: F.embedding(ids, t, padding_idx=1), "padding_idx"),
    # losses
    Case("sparse_softmax_cross_entropy", [randn(5, 4) * 3, ints(4, 5)], {},
         lambda z, y: F.cross_entropy(z, y, reduction="none"), "2d"),
    Case("sparse_softmax_cross_entropy", [randn(2, 3, 4), ints(4, 2, 3)], {},
         lambda z, y: F.cross_entropy(z.reshape(-1, 4), y.reshape(-1), reduction="none").reshape(2, 3), "3d"),
    # eval helpers
    Case("argmax", [randn(3, 5)], {"axis": 1}, lambda x: torch.argmax(x, 1)),
    Case("equal", [ints(3, 3, 4), ints(3, 3, 4)], {}, T("eq")),
    # language ops: masks, integer arithmetic of position buckets, gathers, one-hot, cumsum
    Case("minimum", [randn(2, 3), randn(3)], {}, T("minimum")),
    Case("minimum", [ints(3, 3, 4).astype(float), ints(3, 4).astype(float)], {}, T("minimum"), "ties"),
    Case("floor_div", [ints(20, 3, 4) - 10, ints(3, 4) + 1], {}, lambda a, b: torch.div(a, b, rounding_mode="floor")),
    Case("abs", [randn(3, 4)], {}, T("abs")),
    Case("log1p", [positive(3, 4) - 0.4], {}, T("log1p")),
    Case("floor", [randn(3, 4) * 3], {}, T("floor")),
    Case("where", [RNG.random((2, 3, 4)) > 0.5, randn(2, 3, 4), randn(3, 1)], {}, T("where"), "broadcast"),
    Case("where", [RNG.random((2, 1, 4)) > 0.5, randn(2, 3, 4), np.array(-1e9)], {}, T("where"), "fill"),
    Case("not_equal", [ints(3, 3, 4), ints(3, 3, 4)], {}, T("ne")),
    Case("less", [randn(3, 4), randn(4)], {}, T("lt")),
    Case("less_equal", [ints(3, 3, 4), ints(3, 4)], {}, T("le")),
    Case("greater", [randn(3, 4), randn(3, 1)], {}, T("gt")),
    Case("greater_equal", [ints(3, 3, 4), ints(3, 3, 4)], {}, T("ge")),
    Case("logical_and", [RNG.random((3, 4)) > 0.5, RNG.random(4) > 0.5], {}, T("logical_and")),
    Case("logical_or", [RNG.random((3, 4)) > 0.5, RNG.random(4) > 0.5], {}, T("logical_or")),
    Case("logical_not", [RNG.random((3, 4)) > 0.5], {}, T("logical_not")),
    Case("cumsum", [randn(2, 5, 3)], {"axis": 1}, lambda x: torch.cumsum(x, 1)),
    Case("cumsum", [randn(2, 5)], {"axis": -1, "exclusive": True, "reverse": True},
         lambda x: torch.flip(torch.cumsum(torch.flip(x, [1]), 1), [1]) - x, "exclusive-reverse"),
    Case("cumsum", [ints(2, 2, 5)], {"axis": 1}, lambda x: torch.cumsum(x, 1), "int"),
    Case("cumsum", [randn(2, 1, 3)], {"axis": 1, "exclusive": True}, lambda x: x * 0.0, "exclusive-one"),
    Case("gather", [randn(5, 4), np.array([[1, 4], [0, 1]])], {"axis": 0}, lambda x, i: x[i], "axis0"),
    Case("gather", [randn(2, 6, 4), np.array([[1, 5, 1], [0, 2, 3]])], {"axis": 1, "batch_dims": 1},
         lambda x, i: x[torch.arange(2)[:, None], i], "mlm-positions"),
    Case("gather", [randn(2, 3, 6), np.array([5, 0, 5])], {"axis": 2}, lambda x, i: x.index_select(2, i), "last-axis"),
    Case("take_along_axis", [randn(3, 5, 4), ints(5, 3, 2, 4)], {"axis": 1}, lambda x, i: torch.gather(x, 1, i)),
    Case("take_along_axis", [randn(3, 5), ints(5, 2, 3)], {"axis": 1}, lambda x, i: torch.gather(x, 1, i), "smaller"),
    Case("one_hot", [ints(4, 2, 3)], {"depth": 4, "dtype": "float32"}, lambda i: F.one_hot(i, 4).float()),
    Case("one_hot", [ints(4, 5)], {"depth": 3, "dtype": "float32", "on_value": 0.9, "off_value": 0.05},
         lambda i: torch.where(F.one_hot(i, 4)[:, :3].bool(), 0.9, 0.05).double(), "on-off-out-of-range"),
]

# ---- integer arithmetic (exact in the int dtype, no gradient) and ceil-mode pools ----

_BIG = np.array([[2**62 + 3, -(2**62) - 5, 7], [-9, 2**53 + 1, 0]])  # beyond float64's 53 bits

CASES += [
    # a QA head's start and end positions: clamp(0, ignored_index) on int64
    Case("clamp", [np.array([-3, 0, 5, 8, 11, 2**40 + 1])], {"min": 0, "max": 8}, lambda x: torch.clamp(x, 0, 8),
         "int64-positions", rtol=0, atol=0),
    Case("clamp", [np.array([2**62 + 3, 2**62, -(2**62) - 1, 5])], {"min": -(2**62), "max": 2**62 + 1},
         lambda x: torch.clamp(x, -(2**62), 2**62 + 1), "int64-wide", rtol=0, atol=0),
    Case("clamp", [np.array([[-(2**31), 2**31 - 1, 5]], np.int32)], {"max": 6},
         lambda x: torch.clamp(x, max=6), "int32-max-only", rtol=0, atol=0),
    Case("add", [_BIG, np.array([1, -1, 2**40])], {}, lambda a, b: a + b, "int64", rtol=0, atol=0),
    Case("sub", [_BIG, np.array([1, -1, 2**40])], {}, lambda a, b: a - b, "int64", rtol=0, atol=0),
    Case("mul", [_BIG // 8, np.array([3, -3, 2**20])], {}, lambda a, b: a * b, "int64", rtol=0, atol=0),
    Case("maximum", [_BIG, np.array([5, -(2**62), 7])], {}, T("maximum"), "int64", rtol=0, atol=0),
    Case("minimum", [_BIG, np.array([5, -(2**62), 7])], {}, T("minimum"), "int64", rtol=0, atol=0),
    # 8x8, kernel 3, stride 2: 4 windows a side in ceil mode (3 without); the last starts at 6, inside
    Case("max_pool2d", [randn(2, 3, 8, 8)], {"kernel": 3, "strides": 2, "padding": [[0, 0], [0, 0]], "layout": "NCHW",
                                             "ceil_mode": True},
         lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), "ceil"),
    # 7x7: ceil mode changes nothing (the windows end at the input's end)
    Case("max_pool2d", [randn(2, 3, 7, 7)], {"kernel": 3, "strides": 2, "layout": "NCHW", "ceil_mode": True},
         lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), "ceil-same-size"),
    # 6x7 padded 1, kernel 2, stride 2: height 4 (a window would start in the bottom padding: dropped),
    # width 5 in ceil mode against 4
    Case("max_pool2d", [randn(2, 3, 6, 7)], {"kernel": 2, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW",
                                             "ceil_mode": True},
         lambda x: F.max_pool2d(x, 2, 2, padding=1, ceil_mode=True), "ceil-padded"),
    # GoogLeNet's 3x3 / 2 pools in NHWC too
    Case("max_pool2d", [randn(2, 8, 6, 3)], {"kernel": 3, "strides": 2, "padding": [[0, 0], [0, 0]], "layout": "NHWC",
                                             "ceil_mode": True},
         lambda x: nhwc(F.max_pool2d(nchw(x), 3, 2, ceil_mode=True)), "ceil-nhwc"),
    # the divisor counts the input and the explicit padding, never what the last window runs past
    Case("avg_pool2d", [randn(2, 3, 8, 7)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW",
                                             "ceil_mode": True},
         lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True), "ceil-count-pad"),
    Case("avg_pool2d", [randn(2, 3, 8, 7)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW",
                                             "ceil_mode": True, "count_include_pad": False},
         lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), "ceil-inputs-only"),
    Case("avg_pool2d", [randn(2, 3, 8, 8)], {"kernel": 3, "strides": 2, "layout": "NCHW", "ceil_mode": True},
         lambda x: F.avg_pool2d(x, 3, 2, ceil_mode=True), "ceil-unpadded"),
    Case("avg_pool2d", [randn(2, 3, 7, 7)], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]], "layout": "NCHW",
                                             "ceil_mode": True},
         lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True), "ceil-same-size"),
]


# ---- vision and losses ----


def _labels_with(ignore, high, *shape):
    """Class ids in [0, high) with about a quarter of them ``ignore``."""
    labels = ints(high, *shape)
    labels[RNG.uniform(size=shape) < 0.25] = ignore
    return labels


CASES += [
    Case("conv_transpose2d", [randn(2, 3, 4, 5), randn(3, 2, 2, 2)],
         {"output_size": [8, 10], "strides": [2, 2], "padding": [[0, 0], [0, 0]], "layout": "NCHW",
          "weight_layout": "IOHW"},
         lambda x, w: F.conv_transpose2d(x, w, stride=2), "unet-up"),
    Case("conv_transpose2d", [randn(2, 3, 4, 4), randn(3, 2, 3, 3)],
         {"output_size": [8, 8], "strides": [2, 2], "padding": [[1, 1], [1, 1]], "dilations": [1, 1],
          "layout": "NCHW", "weight_layout": "IOHW"},
         lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1), "output-padding"),
    Case("conv_transpose2d", [randn(2, 3, 3, 2), randn(3, 3, 4, 2)],
         {"output_size": [6, 6], "strides": [2, 2], "padding": "SAME", "layout": "NHWC", "weight_layout": "HWOI"},
         # TF's SAME for 6 pixels, kernel 3, stride 2: pad 0 before, 1 after, cropped from the full output
         lambda x, w: nhwc(F.conv_transpose2d(nchw(x), w.permute(3, 2, 0, 1), stride=2)[:, :, :6, :6]),
         "nhwc-same"),
    # strides 1 by default; dilated, padded on one axis only
    Case("conv_transpose2d", [randn(2, 3, 4, 5), randn(3, 2, 3, 2)], {"output_size": [6, 6], "layout": "NCHW"},
         lambda x, w: F.conv_transpose2d(x, w), "stride-1"),
    Case("conv_transpose2d", [randn(2, 3, 4, 5), randn(3, 2, 3, 2)],
         {"output_size": [6, 6], "padding": [[1, 1], [0, 0]], "dilations": [2, 1], "layout": "NCHW"},
         lambda x, w: F.conv_transpose2d(x, w, padding=(1, 0), dilation=(2, 1)), "dilated-padded"),
    Case("resize2d", [randn(2, 3, 3, 4)], {"size": [6, 8], "method": "nearest", "layout": "NCHW"},
         lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), "nearest"),
    Case("resize2d", [randn(2, 3, 3, 4)], {"size": [6, 12], "method": "bilinear", "layout": "NCHW"},
         lambda x: F.interpolate(x, size=(6, 12), mode="bilinear", align_corners=False), "bilinear"),
    Case("resize2d", [randn(2, 4, 3, 3)], {"size": [6, 5], "method": "bilinear", "layout": "NHWC"},
         lambda x: nhwc(F.interpolate(nchw(x), size=(6, 5), mode="bilinear", align_corners=False)),
         "bilinear-nhwc-uneven"),
    Case("tile", [randn(2, 3)], {"multiples": [2, 1, 3]}, lambda x: x.repeat(2, 1, 3)),
    Case("pad", [randn(2, 3, 4)], {"pads": [[0, 0], [1, 2], [0, 3]], "value": 0.5},
         lambda x: F.pad(x, (0, 3, 1, 2), value=0.5)),
    # values on the bounds get no gradient, in torch.clamp as in hardtanh (ReLU6)
    Case("clamp", [np.array([-2.0, 0.0, 0.5, 6.0, 7.0, 3.0])], {"min": 0.0, "max": 6.0},
         lambda x: torch.clamp(x, 0.0, 6.0), "bounds"),
    Case("clamp", [np.array([-2.0, 0.0, 0.5, 6.0, 7.0, 3.0])], {"min": 0.0, "max": 6.0},
         lambda x: F.relu6(x), "relu6"),
    Case("clamp", [randn(3, 4)], {"min": -0.5}, lambda x: torch.clamp(x, min=-0.5), "min-only"),
    Case("pad", [randn(2, 3, 4, 5)], {"pads": [[0, 0], [0, 0], [1, 3], [2, 4]], "mode": "reflect"},
         lambda x: F.pad(x, (2, 4, 1, 3), mode="reflect"), "reflect"),
    Case("pad", [randn(2, 3, 4, 5)], {"pads": [[0, 0], [0, 0], [3, 1], [2, 6]], "mode": "edge"},
         lambda x: F.pad(x, (2, 6, 3, 1), mode="replicate"), "edge"),
    # an axis padded on one side only, and one padded alike on both sides
    Case("pad", [randn(2, 3, 4, 5)], {"pads": [[0, 0], [0, 0], [1, 1], [2, 0]], "mode": "reflect"},
         lambda x: F.pad(x, (2, 0, 1, 1), mode="reflect"), "reflect-one-side"),
    Case("pad", [randn(2, 3)], {"pads": [[1, 0], [0, 2]]}, lambda x: F.pad(x, (0, 2, 1, 0)), "zeros-by-default"),
    Case("slice", [randn(6, 4, 3)], {"begin": [1, 0], "end": [5, 3]}, lambda x: x[1:5, 0:3], "no-step"),
    # TF's MirrorPad SYMMETRIC: the edge repeated, then the mirror (torch has no such mode: cat of flips)
    Case("pad", [randn(2, 4, 3)], {"pads": [[0, 0], [2, 1], [0, 0]], "mode": "symmetric"},
         lambda x: torch.cat([x[:, :2].flip(1), x, x[:, -1:]], dim=1), "symmetric"),
    Case("sigmoid_cross_entropy", [randn(3, 4) * 5, RNG.uniform(size=(3, 4))], {},
         lambda x, z: F.binary_cross_entropy_with_logits(x, z, reduction="none")),
    Case("sigmoid_cross_entropy", [randn(3, 4) * 5, RNG.uniform(size=(3, 4))], {"pos_weight": [0.5, 1.0, 2.0, 3.0]},
         lambda x, z: F.binary_cross_entropy_with_logits(x, z, pos_weight=torch.tensor([0.5, 1.0, 2.0, 3.0],
                                                                                      dtype=x.dtype),
                                                         reduction="none"), "pos-weight"),
    Case("cross_entropy_loss", [randn(2, 4, 3, 3) * 3, _labels_with(-100, 4, 2, 3, 3)],
         {"axis": 1, "reduction": "mean", "ignore_index": -100},
         lambda z, y: F.cross_entropy(z, y), "nchw-default-ignore"),
    Case("cross_entropy_loss", [randn(6, 5) * 3, _labels_with(0, 5, 6)],
         {"axis": 1, "reduction": "mean", "ignore_index": 0, "label_smoothing": 0.1},
         lambda z, y: F.cross_entropy(z, y, ignore_index=0, label_smoothing=0.1), "ignore0-smoothing"),
    Case("cross_entropy_loss", [randn(2, 3, 4) * 3, _labels_with(2, 3, 2, 4)],
         {"axis": 1, "reduction": "none", "ignore_index": 2, "label_smoothing": 0.2},
         lambda z, y: F.cross_entropy(z, y, ignore_index=2, label_smoothing=0.2, reduction="none"), "none"),
    Case("cross_entropy_loss", [randn(2, 3, 3, 2) * 3, _labels_with(1, 3, 2, 3, 2)],
         {"axis": 1, "reduction": "mean", "ignore_index": 1, "label_smoothing": 0.2, "weight": [0.5, 2.0, 1.5]},
         lambda z, y: F.cross_entropy(z, y, ignore_index=1, label_smoothing=0.2,
                                      weight=torch.tensor([0.5, 2.0, 1.5], dtype=z.dtype)), "weighted-smoothed"),
    Case("cross_entropy_loss", [randn(5, 3) * 3, ints(3, 5)], {"axis": 1, "reduction": "none", "weight": [0.5, 2.0, 1.5]},
         lambda z, y: F.cross_entropy(z, y, reduction="none", weight=torch.tensor([0.5, 2.0, 1.5], dtype=z.dtype)),
         "weighted-none"),
    Case("cross_entropy_loss", [randn(2, 3, 4) * 3, ints(4, 2, 3)], {"axis": -1, "reduction": "sum"},
         lambda z, y: F.cross_entropy(z.permute(0, 2, 1), y, reduction="sum"), "sum-last-axis"),
]


# ---- audio: CTC ----


def _log_probs(steps, batch, classes):
    """(T, N, C) log-probabilities, as a log_softmax gives them (torch's CTC gradient assumes one made them)."""
    z = randn(steps, batch, classes) * 2
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def _ctc(**kw):
    """F.ctc_loss of the record's inputs: the targets as torch takes them, targets[targets_mask]."""
    return lambda lp, y, il, tl, mask: F.ctc_loss(lp, y[mask], il, tl, **kw)


_CTC_PADDED = np.array([[1, 2, 2, 3], [3, 1, 0, 0], [2, 2, 2, 0]])  # repeated labels need a blank between
_CTC_LENGTHS = np.array([4, 2, 3])
_CTC_HF = np.array([[4, 4, -100, -100], [1, 2, 3, 1], [-100, 2, -100, 5]])  # -100 anywhere: masked_select

CASES += [
    # padded targets (N, S): the frontend's mask keeps each row's first target_lengths[n]
    Case("ctc_loss", [_log_probs(9, 3, 5), _CTC_PADDED, np.array([9, 7, 6]), _CTC_LENGTHS,
                      np.arange(4)[None] < _CTC_LENGTHS[:, None]],
         {"blank": 0, "reduction": "mean"},
         lambda lp, y, il, tl, mask: F.ctc_loss(lp, y, il, tl), "padded-mean"),
    # concatenated targets, blank the last class, a target of length 0
    Case("ctc_loss", [_log_probs(6, 3, 4), np.array([0, 1, 1, 2, 0]), np.array([6, 5, 3]), np.array([3, 0, 2]),
                      np.ones(5, dtype=bool)],
         {"blank": 3, "reduction": "sum"}, _ctc(blank=3, reduction="sum"), "concatenated-sum"),
    # transformers' Wav2Vec2: labels.masked_select(labels != -100); an example too long for its input (3
    # steps cannot hold 4, 4 with a blank between) is infinite, zeroed with its gradient
    Case("ctc_loss", [_log_probs(7, 3, 6), _CTC_HF, np.array([2, 7, 5]), np.array([2, 4, 2]), _CTC_HF != -100],
         {"blank": 0, "reduction": "none", "zero_infinity": True},
         _ctc(reduction="none", zero_infinity=True), "masked-none-zero-infinity"),
    Case("ctc_loss", [_log_probs(7, 3, 6), _CTC_HF, np.array([6, 7, 5]), np.array([2, 4, 2]), _CTC_HF != -100],
         {"blank": 0, "reduction": "mean", "zero_infinity": True}, _ctc(zero_infinity=True), "masked-mean"),
    # torch's mean divides by each target length but at least 1: an empty target's loss counts whole
    Case("ctc_loss", [_log_probs(5, 2, 3), np.array([[2, 1], [0, 0]]), np.array([5, 4]), np.array([2, 0]),
                      np.array([[True, True], [False, False]])],
         {"blank": 0, "reduction": "mean"}, _ctc(), "mean-empty-target"),
]

# ---- the host's checks on the data ----

CASES += [
    Case("host_check", [np.array(False)], {"expected": False, "code": "if labels.max() >= vocab:"},
         lambda condition: condition),
]

def _is_float(x):
    return np.issubdtype(np.asarray(x).dtype, np.floating)


def _run(case: Case, dtype=np.float64):
    """Forward and backward of the kernel on ``case``; returns (outputs, grads, g)."""
    record = OPS[case.op]
    inputs = [x.astype(dtype) if _is_float(x) else x for x in case.inputs]
    snapshot = [x.copy() for x in inputs]
    ctx = KernelContext(training=case.training, rng=np.random.default_rng(0))
    outputs, saved = record.forward(inputs, case.attrs, ctx)
    g = None
    grads = None
    if record.backward is not None and _is_float(outputs[0]):
        g = np.random.default_rng(7).standard_normal(np.shape(outputs[0])).astype(outputs[0].dtype)
        grads = record.backward(saved, [g], case.attrs, tuple(True for _ in inputs))
    for x, before in zip(inputs, snapshot):  # kernels never write into their inputs
        np.testing.assert_array_equal(x, before)
    return outputs, grads, g


def _ir_dtype(x: np.ndarray) -> str:
    """The IR dtype of a case's input as the float32 run feeds it."""
    return "float32" if _is_float(x) else str(np.asarray(x).dtype)


def test_every_record_has_a_case_and_a_known_category():
    assert {case.op for case in CASES} == set(OPS)
    assert {record.category for record in OPS.values()} <= set(CATEGORIES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_record_takes_the_case_inputs_dtypes(case):
    record = OPS[case.op]
    for index, x in enumerate(case.inputs):
        assert _ir_dtype(x) in record.input_dtypes(index)
    assert set(record.required_attrs()) <= set(case.attrs)
    assert record.variadic or len(case.inputs) == len(record.inputs)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_shape_and_dtype_rules_give_what_the_kernel_returns(case):
    record = OPS[case.op]
    outputs, _, _ = _run(case, np.float32)
    shapes = record.shape([np.shape(x) for x in case.inputs], case.attrs)
    dtypes = record.dtype([_ir_dtype(x) for x in case.inputs], case.attrs)
    assert len(shapes) == len(dtypes) == len(outputs)
    for y, shape, dtype in zip(outputs, shapes, dtypes):
        assert np.shape(y) == tuple(shape)
        assert np.asarray(y).dtype == np.dtype(EMULATOR_STORAGE[dtype])


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cost_is_defined(case):
    record = OPS[case.op]
    shapes = record.shape([np.shape(x) for x in case.inputs], case.attrs)
    work = Work([np.shape(x) for x in case.inputs], shapes, case.attrs, elem=2)
    costs = [record.cost(work)] + ([record.backward_cost(work)] if record.backward_cost else [])
    for flops, sram_bytes in costs:
        assert np.isfinite(flops) and np.isfinite(sram_bytes) and flops >= 0 and sram_bytes >= 0
        if record.category == "layout":  # routing only
            assert flops == sram_bytes == 0
        else:
            assert flops + sram_bytes > 0
    assert record.backward_ratio >= 0
    assert all(isinstance(record.backward_reads(i, others_are_weights), bool)
               for i in range(len(case.inputs)) for others_are_weights in (False, True))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_op_alone_is_matched_into_a_library_kernel(case):
    record = OPS[case.op]
    graph = Graph(frontend="torch")
    for i, x in enumerate(case.inputs):
        graph.inputs.append(graph.add_value(f"in{i}", np.shape(x), _ir_dtype(x)))
    shapes = record.shape([np.shape(x) for x in case.inputs], case.attrs)
    dtypes = record.dtype([_ir_dtype(x) for x in case.inputs], case.attrs)
    outputs = [graph.add_value(f"out{j}", shape, dtype) for j, (shape, dtype) in enumerate(zip(shapes, dtypes))]
    graph.add_node(case.op, list(graph.inputs), outputs, case.attrs)
    graph.outputs = {"y": outputs[0]}
    (library_kernel,) = match(graph)
    assert library_kernel.kind != "unsupported" and library_kernel.ops == [case.op]


def test_readme_op_table_is_generated_from_the_records():
    assert readme_table_is_current(), "device/README.md's op table is stale: run python -m device.ops --write-readme"


@needs_torch
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_matches_torch(case):
    outputs, grads, g = _run(case)
    tensors = [torch.tensor(x, requires_grad=_is_float(x)) for x in case.inputs]
    expected = case.reference(*tensors)
    assert np.shape(outputs[0]) == tuple(expected.shape)
    np.testing.assert_allclose(outputs[0], expected.detach().numpy(), rtol=case.rtol, atol=case.atol)
    if not expected.requires_grad:  # integer result: no gradient on either side
        assert grads is None or all(gi is None for gi in grads)
        return
    wanted = [t for t in tensors if t.requires_grad]
    expected_grads = iter(torch.autograd.grad(expected, wanted, torch.tensor(g), allow_unused=True))
    assert len(grads) == len(case.inputs)
    for x, got in zip(case.inputs, grads):
        if not _is_float(x):
            assert got is None
            continue
        ref = next(expected_grads)
        if got is None or ref is None:  # no gradient (running statistics): zero on the other side
            assert np.all(ref.numpy() == 0) if ref is not None else (got is None or not np.any(got))
            continue
        assert got.shape == x.shape
        np.testing.assert_allclose(got, ref.numpy(), rtol=case.rtol, atol=case.atol)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_kernel_keeps_float32(case):
    outputs, grads, _ = _run(case, np.float32)
    float_out = case.attrs.get("dtype") != "float64"
    for y in outputs:
        if _is_float(y) and float_out:
            assert np.asarray(y).dtype == np.float32
    for gi in grads or []:
        if gi is not None:
            assert gi.dtype == np.float32


@needs_torch
def test_batch_norm_updates_running_statistics_like_torch():
    x, gamma, beta, mean, var = randn(6, 3, 2, 2), randn(3), randn(3), randn(3), positive(3)
    attrs = {"axis": 1, "eps": 1e-5, "momentum": 0.1}
    record = OPS["batch_norm"]
    (y, new_mean, new_var), _ = record.forward([x, gamma, beta, mean, var], attrs, KernelContext(training=True))
    t_mean, t_var = torch.tensor(mean), torch.tensor(var)
    F.batch_norm(torch.tensor(x), t_mean, t_var, torch.tensor(gamma), torch.tensor(beta), True, 0.1, 1e-5)
    np.testing.assert_allclose(new_mean, t_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(new_var, t_var.numpy(), rtol=1e-12)
    assert record.state_updates == ((1, 3), (2, 4))
    # eval mode leaves the statistics alone
    (_, m2, v2), _ = record.forward([x, gamma, beta, mean, var], attrs, KernelContext(training=False))
    assert m2 is mean and v2 is var


def test_batch_norm_can_average_the_biased_variance_as_keras_does():
    x, gamma, beta, mean, var = randn(6, 3), randn(3), randn(3), randn(3), positive(3)
    attrs = {"axis": 1, "eps": 1e-5, "momentum": 0.1, "unbiased_var": False}
    (_, _, new_var), _ = OPS["batch_norm"].forward([x, gamma, beta, mean, var], attrs, KernelContext(training=True))
    np.testing.assert_allclose(new_var, 0.9 * var + 0.1 * x.var(axis=0), rtol=1e-12)


def _batch_norm_fp32(x, gamma, beta, g, axis):
    """(y, dx, dgamma, dbeta) of batch_norm in training (eps 1e-3, Keras'), with x's dtype."""
    attrs = {"axis": axis, "eps": 1e-3, "momentum": 0.1}
    c = x.shape[axis]
    (y, _, _), saved = OPS["batch_norm"].forward([x, gamma, beta, np.zeros(c, x.dtype), np.ones(c, x.dtype)], attrs,
                                                 KernelContext(training=True))
    dx, dgamma, dbeta, _, _ = OPS["batch_norm"].backward(saved, [g], attrs, (True, True, True, False, False))
    return y, dx, dgamma, dbeta


def _rms_error(got, exact):
    got, exact = np.asarray(got, np.float64), np.asarray(exact, np.float64)
    return math.sqrt(np.mean((got - exact) ** 2) / np.mean(exact ** 2))


# a channels-last map whose statistics sum 4096 values a channel, off-centre (mean 3, std 2)
_BN_RNG = np.random.default_rng(11)
_BN_X = (_BN_RNG.standard_normal((4, 32, 32, 16)) * 2 + 3).astype(np.float32)
_BN_GAMMA, _BN_BETA = (_BN_RNG.standard_normal(16).astype(np.float32) for _ in range(2))
_BN_G = _BN_RNG.standard_normal(_BN_X.shape).astype(np.float32)


def test_batch_norm_fp32_is_as_accurate_channels_last():
    """Statistics and gradients summed over N, H, W of an NHWC map are as close to float64 as over an
    NCHW one: numpy sums one by one along a strided axis (the kernel once did: 15x the error forward)."""
    inputs = (_BN_X, _BN_GAMMA, _BN_BETA, _BN_G)
    nhwc = _batch_norm_fp32(*inputs, axis=3)
    exact = _batch_norm_fp32(*(a.astype(np.float64) for a in inputs), axis=3)
    nchw = _batch_norm_fp32(np.ascontiguousarray(_BN_X.transpose(0, 3, 1, 2)), _BN_GAMMA, _BN_BETA,
                            np.ascontiguousarray(_BN_G.transpose(0, 3, 1, 2)), axis=1)
    nchw = (nchw[0].transpose(0, 2, 3, 1), nchw[1].transpose(0, 2, 3, 1), nchw[2], nchw[3])
    for name, a, b, ref in zip(("y", "dx", "dgamma", "dbeta"), nhwc, nchw, exact):
        assert _rms_error(a, ref) <= 2 * _rms_error(b, ref), name


@needs_torch
def test_batch_norm_fp32_error_is_torchs():
    """Against float64, the kernel's fp32 error on that map is within 3x of torch's batch norm on NCHW (measured:
    1.5x at most; the kernel that summed one by one 16x forward, 3.3x to 7x backward)."""
    def torch_run(dtype):
        x = torch.tensor(np.ascontiguousarray(_BN_X.transpose(0, 3, 1, 2)), dtype=dtype, requires_grad=True)
        gamma, beta = (torch.tensor(a, dtype=dtype, requires_grad=True) for a in (_BN_GAMMA, _BN_BETA))
        y = F.batch_norm(x, None, None, gamma, beta, True, 0.1, 1e-3)
        y.backward(torch.tensor(np.ascontiguousarray(_BN_G.transpose(0, 3, 1, 2)), dtype=dtype))
        return [t.detach().double().numpy() for t in (y.permute(0, 2, 3, 1), x.grad.permute(0, 2, 3, 1),
                                                        gamma.grad, beta.grad)]

    exact, theirs = torch_run(torch.float64), torch_run(torch.float32)
    ours = _batch_norm_fp32(_BN_X, _BN_GAMMA, _BN_BETA, _BN_G, axis=3)
    for name, a, b, ref in zip(("y", "dx", "dgamma", "dbeta"), ours, theirs, exact):
        assert _rms_error(a, ref) <= 3 * _rms_error(b, ref), name


def test_dropout_in_training_drops_and_scales():
    x = np.ones((4000,), dtype=np.float32)
    record = OPS["dropout"]
    ctx = KernelContext(training=True, rng=np.random.default_rng(3))
    (y,), saved = record.forward([x], {"rate": 0.25}, ctx)
    dropped = np.mean(y == 0)
    assert 0.22 < dropped < 0.28
    assert np.allclose(y[y != 0], 1 / 0.75)
    assert y.dtype == np.float32
    g = np.random.default_rng(0).standard_normal(x.shape).astype(np.float32)
    (dx,) = record.backward(saved, [g], {"rate": 0.25}, (True,))
    np.testing.assert_allclose(dx, g * y, rtol=1e-6)  # the same mask and scale as the forward
    # the same generator state gives the same mask
    (y2,), _ = record.forward([x], {"rate": 0.25}, KernelContext(training=True, rng=np.random.default_rng(3)))
    np.testing.assert_array_equal(y, y2)
    (y3,), _ = record.forward([x], {"rate": 1.0}, ctx)
    assert not np.any(y3)


@pytest.mark.parametrize("op, inputs, attrs", [
    ("matmul", [randn(5, 3), randn(3, 4)], {}),
    ("conv2d", [randn(2, 3, 5, 5), randn(4, 3, 3, 3)],
     {"strides": 1, "padding": [[1, 1], [1, 1]], "dilations": 1, "layout": "NCHW", "weight_layout": "OIHW"}),
    ("conv2d", [randn(2, 6, 5, 5), randn(4, 3, 3, 3)], {"groups": 2, "padding": [[1, 1], [1, 1]]}),
    ("einsum", [randn(5, 3), randn(3, 4)], {"equation": "ij,jk->ik"}),
])
def test_backward_skips_unneeded_inputs(op, inputs, attrs):
    record = OPS[op]
    (y,), saved = record.forward(inputs, attrs, KernelContext())
    g = np.ones_like(y)
    full = record.backward(saved, [g], attrs, (True, True))
    partial = record.backward(saved, [g], attrs, (False, True))
    assert partial[0] is None
    np.testing.assert_array_equal(partial[1], full[1])
    partial = record.backward(saved, [g], attrs, (True, False))
    assert partial[1] is None
    np.testing.assert_array_equal(partial[0], full[0])


def test_cast_rounds_the_gradient_of_a_16_bit_value():
    x = randn(50).astype(np.float32)
    (y,), saved = OPS["cast"].forward([x], {"dtype": "float16"}, KernelContext())
    np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
    g = randn(50).astype(np.float32)
    (dx,) = OPS["cast"].backward(saved, [g], {"dtype": "float16"}, (True,))
    np.testing.assert_array_equal(dx, round_to(g, "float16"))


@pytest.mark.parametrize("op, inputs", [
    ("embedding", [randn(4, 2), np.array([0, 4])]),
    ("embedding", [randn(4, 2), np.array([-1, 2])]),
    ("sparse_softmax_cross_entropy", [randn(3, 4), np.array([0, 1, 4])]),
])
def test_out_of_range_ids_are_user_errors(op, inputs):
    with pytest.raises(UserError, match="out of range"):
        OPS[op].forward(inputs, {}, KernelContext())


def test_identity_marked_stop_gradient_passes_no_gradient():
    record = OPS["identity"]
    attrs = {"stop_gradient": True}
    (y,), saved = record.forward([randn(3)], attrs, KernelContext())
    assert record.backward(saved, [np.ones(3)], attrs, (True,)) == [None]


def test_gelu_is_accurate_in_the_negative_tail():
    # where 1 + erf(x / sqrt(2)) cancels to 0 in float32, gelu still has a relative accuracy
    x = np.array([-4.0, -7.0, -10.0], np.float32)
    (y,), _ = OPS["gelu"].forward([x], {"approximate": "none"}, KernelContext())
    expected = [v * 0.5 * math.erfc(-v / math.sqrt(2)) for v in x.tolist()]
    np.testing.assert_allclose(y, expected, rtol=1e-6)


@pytest.mark.parametrize("equation, shapes, macs", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], 2 * 3 * 4 * 5),
    ("bhqd, bhkd -> bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], 2 * 3 * 4 * 5 * 6),  # spaces ignored
    ("ij,jk", [(3, 4), (4, 5)], 3 * 4 * 5),  # implicit output
    ("ii->", [(3, 3)], 3),
    ("...ij,jk->...ik", [(2, 3, 4), (4, 5)], 2 * 3 * 4 * 5),
    # letters on both sides of '...': the ellipsis is the (7, 3) between b and j
    ("b...j,jk->b...k", [(2, 7, 3, 4), (4, 5)], 2 * 7 * 3 * 4 * 5),
    # the larger ellipsis of two operands (broadcast)
    ("...ij,...jk->...ik", [(6, 3, 4), (2, 6, 4, 5)], 2 * 6 * 3 * 4 * 5),
    ("...ij,...jk->...ik", [(2, 6, 3, 4), (6, 4, 5)], 2 * 6 * 3 * 4 * 5),  # the larger one first
    ("...ij,jk->...ik", [(3, 4), (4, 5)], 3 * 4 * 5),  # an empty ellipsis counts 1
])
def test_einsum_cost_is_two_flops_per_product_of_every_index_size(equation, shapes, macs):
    attrs = {"equation": equation}
    record = OPS["einsum"]
    work = Work(shapes, record.shape(shapes, attrs), attrs, elem=2)
    # each multiply-accumulate reads a 2-byte operand and a 4-byte partial sum and writes it back
    assert record.cost(work) == (2.0 * macs, macs * (2 + 2 * 4))


def test_matmul_gradient_of_a_transposed_weight_has_that_weights_layout():
    """torch's Linear multiplies by weight.T, an F-contiguous view of the (N, K) weight: its gradient
    comes back as that weight's C-contiguous (N, K) layout, with the values of the sum over the batch."""
    a, weight, g = randn(2, 3, 4), randn(5, 4), randn(2, 3, 5)
    record = OPS["matmul"]
    (y,), saved = record.forward([a, weight.T], {}, KernelContext())
    ga, gb = record.backward(saved, [g], {}, (True, True))
    np.testing.assert_allclose(ga, np.einsum("bmn,nk->bmk", g, weight), rtol=1e-12)
    np.testing.assert_allclose(gb, np.einsum("bmk,bmn->kn", a, g), rtol=1e-12)
    assert gb.shape == (4, 5) and gb.T.flags.c_contiguous
    (_, gb_c) = record.backward(saved[:1] + (np.ascontiguousarray(weight.T),), [g], {}, (False, True))
    np.testing.assert_allclose(gb_c, gb, rtol=1e-12)
    assert gb_c.flags.c_contiguous


@needs_torch
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_is_stable_per_row(op):
    # rows 2000 apart: each shifted by its own maximum, or one row's exp underflows to 0 (or overflows)
    x = np.array([[1000.0, 0.0, -1000.0], [-1000.0, -999.0, -1001.0]], np.float32)
    (y,), _ = OPS[op].forward([x], {"axis": -1}, KernelContext())
    expected = getattr(F, op)(torch.tensor(x), -1).numpy()
    np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-30)


def test_batch_norm_in_training_needs_two_values_per_channel():
    attrs = {"axis": 1, "eps": 1e-5, "momentum": 0.1}
    c = np.zeros(3)
    x = np.array([[1.0, 2.0, 3.0], [3.0, 6.0, -1.0]])  # each channel's variance 1 or 4, far above eps
    (y, _, _), _ = OPS["batch_norm"].forward([x, np.ones(3), c, c, np.ones(3)], attrs, KernelContext(training=True))
    np.testing.assert_allclose(y, [[-1, -1, 1], [1, 1, -1]], rtol=1e-5)  # two values: -1 and +1 once normalised
    with pytest.raises(UserError) as caught:
        OPS["batch_norm"].forward([randn(1, 3), np.ones(3), c, c, np.ones(3)], attrs, KernelContext(training=True))
    assert str(caught.value) == "batch_norm in training needs more than one value per channel, got input (1, 3)"


# -- the records' factories (elementwise, reductions, arrays, record): what each record they build gets


@pytest.mark.parametrize("op, shapes, attrs, flops", [
    ("exp", [(3, 4)], {}, 12),  # one flop per output element
    ("neg", [(3, 4)], {}, 12),
    ("add", [(3, 1), (1, 4)], {}, 12),  # per element of the broadcast output
    ("equal", [(3, 1), (1, 4)], {}, 12),
    ("less", [(3, 1), (1, 4)], {}, 12),
    ("reduce_sum", [(3, 4)], {"axes": [1]}, 12),  # one flop per input element: 3 outputs
    ("reduce_max", [(3, 4)], {"axes": [0, 1]}, 12),
])
def test_elementwise_and_reduction_cost_one_flop_per_element_and_one_pass(op, shapes, attrs, flops):
    record = OPS[op]
    work = Work(shapes, record.shape(shapes, attrs), attrs, elem=2)
    assert record.cost(work) == (float(flops), work.moved)


def _stash_bytes(op: str, shapes: list, attrs: dict | None = None) -> int:
    """The bytes the op's kernel keeps from its forward pass for its backward (the compile report's stash)."""
    record, attrs = OPS[op], attrs or {}
    graph = Graph(frontend="torch")
    for i, shape in enumerate(shapes):
        graph.inputs.append(graph.add_value(f"in{i}", shape, "float32"))
    outputs = [graph.add_value(f"out{j}", shape, "float32")
               for j, shape in enumerate(record.shape(shapes, attrs))]
    graph.add_node(op, list(graph.inputs), outputs, attrs)
    graph.outputs = {"y": outputs[0]}
    (kernel,) = match(graph)
    return kernel.stash_bytes


@pytest.mark.parametrize("op, attrs, kept", [
    ("neg", {}, False), ("exp", {}, True),  # exp's gradient is its output: it keeps what it reads
    ("reduce_sum", {"axes": [1]}, False), ("reduce_mean", {"axes": [1]}, False), ("reduce_max", {"axes": [1]}, True),
    ("transpose", {"perm": [1, 0]}, False), ("cast", {"dtype": "float16"}, False),  # routing only
])
def test_ops_linear_in_their_input_keep_nothing_for_the_backward_pass(op, attrs, kept):
    assert _stash_bytes(op, [(3, 4)], attrs) == (3 * 4 * 4 if kept else 0)


@pytest.mark.parametrize("op, attrs", [("add", {}), ("sub", {})])
def test_a_sum_of_two_activations_keeps_neither(op, attrs):
    assert _stash_bytes(op, [(3, 4), (3, 4)], attrs) == 0


@pytest.mark.parametrize("needs", [(True, False), (False, True), (True, True)])
def test_a_binary_op_computes_only_the_gradients_asked_for(needs):
    a, b, g = randn(3, 1), randn(1, 4), randn(3, 4)
    record = OPS["mul"]
    _, saved = record.forward([a, b], {}, KernelContext())
    ga, gb = record.backward(saved, [g], {}, needs)
    assert (ga is not None, gb is not None) == needs
    if needs[0]:
        np.testing.assert_allclose(ga, (g * b).sum(axis=1, keepdims=True), rtol=1e-12)
    if needs[1]:
        np.testing.assert_allclose(gb, (g * a).sum(axis=0, keepdims=True), rtol=1e-12)


def test_a_reduction_drops_its_axes_unless_told_to_keep_them():
    x = randn(3, 4)
    for op in ("reduce_sum", "reduce_max"):
        (y,), _ = OPS[op].forward([x], {"axes": [1]}, KernelContext())
        assert y.shape == (3,)
        (y,), _ = OPS[op].forward([x], {"axes": [1], "keepdims": True}, KernelContext())
        assert y.shape == (3, 1)


def test_a_record_of_an_unknown_category_is_refused():
    from device.ops.record import OpRecord

    with pytest.raises(ValueError) as error:
        OpRecord("twice", "2 x", ("x",), (), "elementwize", ((),), lambda shapes, attrs: shapes, None, None,
                 lambda work: (0.0, 0.0))
    assert str(error.value) == f"op 'twice': category 'elementwize' is not one of {', '.join(CATEGORIES)}"


def test_two_records_of_one_name_are_refused(monkeypatch):
    import types

    import device.ops
    from device.ops import elementwise

    copy = types.ModuleType("device.ops.copy")
    copy.RECORDS = (OPS["exp"],)
    monkeypatch.setattr(device.ops, "FAMILIES", (elementwise, copy))
    with pytest.raises(ValueError) as error:
        device.ops._by_name()
    assert str(error.value) == "op 'exp' has two records (device.ops.copy)"


@pytest.mark.parametrize("op", ["equal", "less", "logical_not"])
def test_a_comparison_has_no_backward_work_and_keeps_nothing(op):
    shapes = [(3, 4)] * len(OPS[op].inputs)
    assert OPS[op].backward_ratio == 0.0  # the cost model's backward work: none
    assert _stash_bytes(op, shapes) == 0


def test_a_cast_gives_the_dtype_it_is_asked_for():
    assert OPS["cast"].dtype(["float32"], {"dtype": "float16"}) == ["float16"]
    assert OPS["cast"].dtype(["float16"], {"dtype": "int32"}) == ["int32"]


# ------------------------------------------------- the helpers the records are built from


def test_ops_in_gives_the_ops_of_the_categories_asked_and_refuses_an_unknown_one():
    from device.ops import ops_in

    assert ops_in("layer_norm") == frozenset({"layer_norm"})
    assert ops_in("pool", "layer_norm") == frozenset({"avg_pool2d", "max_pool2d", "resize2d", "layer_norm"})
    with pytest.raises(ValueError) as error:
        ops_in("pool", "pooling")
    assert str(error.value) == f"unknown op categories ['pooling']; known: {', '.join(CATEGORIES)}"


def test_broadcast_lets_an_unknown_dimension_win_over_one_only():
    from device.ops.record import broadcast

    assert broadcast((None, 1), (1, 1)) == (None, 1)  # unknown against 1: unknown; 1 against 1: 1
    assert broadcast((None, 3), (4, 1)) == (4, 3)  # a known size other than 1 wins
    assert broadcast((5,), (2, 1)) == (2, 5)


def test_a_reductions_axes_may_be_one_int_and_its_shape_drops_them_by_default():
    from device.ops.record import reduced_shape, reduction_axes

    assert reduction_axes(-1, 3) == (2,)
    assert reduction_axes(None, 2) == (0, 1)
    assert reduced_shape([(2, 3, 4)], {"axes": 1}) == [(2, 4)]
    assert reduced_shape([(2, 3, 4)], {"axes": [0, 2], "keepdims": True}) == [(1, 3, 1)]


@pytest.mark.parametrize("index, others_are_weights, reads", [
    (0, True, False),  # x / w: the numerator's gradient reads only the weight
    (0, False, True),  # x / y of two activations: it reads y
    (1, True, True),  # the denominator's gradient reads x and w
    (1, False, True),
])
def test_div_reads_its_numerator_only_when_the_denominator_is_an_activation(index, others_are_weights, reads):
    from device.ops.record import reads_numerator_unless_weights, reads_unless_scaled_by_weights

    assert reads_numerator_unless_weights(index, others_are_weights) is reads
    assert reads_unless_scaled_by_weights(index, others_are_weights) is (not others_are_weights)


def test_an_unknown_dimension_counts_no_elements_in_a_cost():
    assert Work([(None, 4)], [(None, 4)], {}, elem=2).numel((None, 4)) == 0
    assert Work([(3, 4)], [(3, 4)], {}, elem=2).out == 12


def test_erfc_at_zero_is_the_positive_branch():
    from device.ops.arrays import erfc

    # the fit gives erfc(0) = 1 + 3e-8 in float64; the negative branch 2 - erfc(|x|) would give 1 - 3e-8
    x = np.array([0.0, 1e-300])
    assert erfc(x)[0] == erfc(x)[1]


def test_same_padding_is_none_where_the_windows_cover_the_input():
    from device.ops.arrays import padding_pairs

    assert padding_pairs("SAME", (4, 5), (1, 1), (1, 2), (1, 1)) == ((0, 0), (0, 0))
    assert padding_pairs("same", (4, 4), (3, 3), (1, 1), (1, 1)) == ((1, 1), (1, 1))
    assert padding_pairs("SAME", (4, 4), (2, 2), (1, 1), (1, 1)) == ((0, 1), (0, 1))  # the odd pixel at the end


def test_pair_refuses_what_is_neither_an_int_nor_a_pair():
    from device.ops.arrays import pair

    assert pair(3) == (3, 3) and pair([2, 5]) == (2, 5)
    with pytest.raises(ValueError) as error:
        pair((1, 2, 3))
    assert str(error.value) == "expected an int or a pair (height, width), got (1, 2, 3)"


def test_reduce_rows_drops_the_axes_unless_told_to_keep_them():
    from device.ops.arrays import reduce_rows

    x = randn(2, 3, 4)
    np.testing.assert_allclose(reduce_rows(np.sum, x, (0, 2)), x.sum(axis=(0, 2)), rtol=1e-12)
    assert reduce_rows(np.sum, x, (0, 2), keepdims=True).shape == (1, 3, 1)


@pytest.mark.parametrize("g_shape, shape", [((1, 3, 4), (3, 1)), ((3, 2), (3, 1)), ((2, 3, 2), (3, 1))])
def test_unbroadcast_sums_the_gradient_over_each_broadcast_axis(g_shape, shape):
    from device.ops.arrays import unbroadcast

    g = randn(*g_shape)
    lead = len(g_shape) - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1)
    np.testing.assert_allclose(unbroadcast(g, shape), g.sum(axis=axes).reshape(shape), rtol=1e-12)


def test_select_or_zero_passes_the_gradient_where_true_and_zero_elsewhere_even_nan():
    from device.ops.arrays import select_or_zero

    g = np.array([[1.5, np.nan], [-np.inf, -2.0]], np.float32)
    condition = np.array([[True, False], [False, True]])
    out = select_or_zero(condition, g)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.array([[1.5, 0.0], [0.0, -2.0]], np.float32))


def test_a_convolutions_windows_are_a_read_only_view_of_its_input():
    from device.ops.arrays import windows

    xp = randn(1, 4, 4, 2)
    win = windows(xp, (3, 3), (1, 1), (1, 1))
    assert win.shape == (1, 2, 2, 3, 3, 2) and np.shares_memory(win, xp)
    np.testing.assert_array_equal(win[0, 1, 0, :, :, 1], xp[0, 1:4, 0:3, 1])
    with pytest.raises(ValueError, match="read-only"):  # a kernel writing into it would change its input
        win[0, 0, 0, 0, 0, 0] = 1.0


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("embedding", [np.zeros((4, 2)), np.array([0, 4])], {}, "embedding ids out of range: values in [0, 4], expected [0, 4)"),
    ("gather", [np.zeros((3, 5)), np.array([-1, 2])], {"axis": 1},
     "gather indices out of range: values in [-1, 2], expected [0, 5)"),
    ("take_along_axis", [np.zeros((3, 5)), np.array([[0], [1], [7]])], {"axis": 1},
     "gather indices out of range: values in [0, 7], expected [0, 5)"),
])
def test_an_id_out_of_range_is_refused_naming_the_op_and_the_range(op, inputs, attrs, message):
    with pytest.raises(UserError) as error:
        OPS[op].forward(inputs, attrs, KernelContext())
    assert str(error.value) == message


@pytest.mark.parametrize("batch_dims", [1, -1])
def test_gather_with_a_batch_dim_picks_and_scatters_per_batch_element(batch_dims):
    # TF's GatherV2 with batch_dims=1 (BERT's masked positions): out[b, i] = x[b, ids[b, i]]; -1 counts
    # back from the ids' rank (2), so it is 1 as well; three batch elements, so that an offset off by
    # a batch element cannot land on a valid row by chance
    x, ids = randn(3, 5, 2), np.array([[0, 4, 1, 1], [2, 3, 0, 4], [1, 1, 2, 0]])
    record, attrs = OPS["gather"], {"axis": 1, "batch_dims": batch_dims}
    expected = np.stack([x[b, ids[b]] for b in range(3)])
    assert record.shape([x.shape, ids.shape], attrs) == [(3, 4, 2)]
    (y,), saved = record.forward([x, ids], attrs, KernelContext())
    np.testing.assert_array_equal(y, expected)
    g = randn(3, 4, 2)
    dx, dids = record.backward(saved, [g], attrs, (True, False))
    want = np.zeros_like(x)
    for b in range(3):
        np.add.at(want[b], ids[b], g[b])  # row 1 of batch element 0 is picked twice: its gradients add
    np.testing.assert_allclose(dx, want, rtol=1e-12)
    assert dids is None


def test_gather_of_one_index_drops_the_axis():
    x = randn(3, 5)
    (y,), _ = OPS["gather"].forward([x, np.array(2)], {"axis": 1, "batch_dims": 0}, KernelContext())
    np.testing.assert_array_equal(y, x[:, 2])
    assert OPS["gather"].shape([(3, 5), ()], {"axis": 1}) == [(3,)]


@pytest.mark.parametrize("op, attrs, shapes", [
    ("embedding", {}, [(10, 4), (2, 3)]),
    ("gather", {"axis": 1}, [(2, 7, 4), (3,)]),
    ("take_along_axis", {"axis": 1}, [(2, 7), (2, 3)]),
])
def test_a_lookup_moves_its_output_twice_and_its_gradient_is_an_fp32_scatter_add(op, attrs, shapes):
    from device.ops.record import ACCUMULATOR_BYTES

    record = OPS[op]
    work = Work(shapes, record.shape(shapes, attrs), attrs, elem=2)
    out = math.prod(work.outputs[0])
    assert record.cost(work) == (0.0, 2.0 * out * 2)  # read the picked elements, write them: no arithmetic
    assert record.backward_cost(work) == (float(out), out * (2 + 2 * ACCUMULATOR_BYTES))


def _readme_with(monkeypatch, tmp_path, text):
    from device.ops import table

    path = tmp_path / "README.md"
    path.write_text(text)
    monkeypatch.setattr(table, "README", str(path))
    return path


def test_write_readme_replaces_only_the_table_between_its_markers(monkeypatch, tmp_path):
    from device.ops import table

    path = _readme_with(monkeypatch, tmp_path, f"# Device\n\nbefore\n{table.BEGIN}\nold table\n{table.END}\nafter\n")
    assert not table.readme_table_is_current()
    table.write_readme()
    assert path.read_text() == f"# Device\n\nbefore\n{table.BEGIN}\n{table.markdown_table()}\n{table.END}\nafter\n"
    assert table.readme_table_is_current()


@pytest.mark.parametrize("markers", [("BEGIN",), ("END",), ("BEGIN", "END", "BEGIN", "END"), ("BEGIN", "END", "END")])
def test_a_readme_without_its_op_table_markers_once_each_is_refused(monkeypatch, tmp_path, markers):
    from device.ops import table

    path = _readme_with(monkeypatch, tmp_path, "\n".join(getattr(table, m) for m in markers) + "\n")
    with pytest.raises(ValueError) as error:
        table.readme_table_is_current()
    assert str(error.value) == (f"{path} must hold the op table markers once each "
                                f"({table.BEGIN!r} ... {table.END!r})")
    assert path.read_text() == "\n".join(getattr(table, m) for m in markers) + "\n"  # left as it was


def test_the_op_table_names_a_dtype_list_outside_the_groups_by_its_dtypes():
    from device.ops import table

    record = OPS["exp"]
    odd = type(record)(**{**record.__dict__, "dtypes": (("float32", "int32"),)})
    assert table._dtypes(odd) == "float32/int32"
    mixed = type(record)(**{**record.__dict__, "dtypes": (("float32", "int32"), ("bfloat16",))})
    assert table._dtypes(mixed) == "float32/int32, bfloat16"


# ------------------------------------------------------------------- layout ops' rules


@pytest.mark.parametrize("in_dtype, out_dtype, flows", [
    ("float32", "float64", True), ("float64", "float32", True), ("float32", "bfloat16", True),
    ("int32", "float32", False),  # ids made floats: no gradient back into integers
    ("float32", "int32", False), ("float32", "bool", False),
])
def test_a_gradient_flows_through_a_cast_only_between_floats(in_dtype, out_dtype, flows):
    record, attrs = OPS["cast"], {"dtype": out_dtype}
    x = (randn(3, 4) * 3).astype(in_dtype)
    (y,), saved = record.forward([x], attrs, KernelContext())
    (dx,) = record.backward(saved, [np.ones(y.shape, np.float32)], attrs, (True,))
    if flows:
        assert dx.dtype == x.dtype and dx.shape == x.shape
        np.testing.assert_array_equal(dx, np.ones_like(x))
    else:
        assert dx is None


@pytest.mark.parametrize("op, shapes, attrs, out", [
    ("reshape", [(None, 3, 4)], {"shape": [-1, 4]}, (None, 4)),  # the input's size unknown: so is the -1
    ("reshape", [(2, 3, 4)], {"shape": [None, -1]}, (None, None)),  # the rest unknown
    ("reshape", [(2, 3, 4)], {"shape": [4, -1]}, (4, 6)),
    ("concat", [(3, 4), (None, 4)], {"axis": 1}, (3, 8)),  # the first operand's sizes off the axis
    ("concat", [(2, None), (2, 4)], {"axis": -1}, (2, None)),  # a size along the axis unknown
    ("slice", [(None, 6)], {"begin": [0, 1], "end": [2, 5]}, (None, 4)),  # no step: 1
    ("slice", [(7, 6)], {"begin": [1, 1], "end": [6, 5], "step": [2, 3]}, (3, 2)),
    ("tile", [(None, 3)], {"multiples": [2, 2]}, (None, 6)),
    ("tile", [(2, 3)], {"multiples": [2, 1, 3]}, (2, 2, 9)),
    ("pad", [(None, 3)], {"pads": [[1, 1], [0, 2]]}, (None, 5)),
    ("pad", [(4, 3)], {"pads": [[3, 3], [0, 2]], "mode": "reflect"}, (10, 5)),  # reflect: at most n - 1
    ("pad", [(4, 3)], {"pads": [[4, 0], [0, 3]], "mode": "symmetric"}, (8, 6)),  # symmetric: at most n
])
def test_a_layout_ops_shape_rule_keeps_unknown_sizes_unknown(op, shapes, attrs, out):
    (shape,) = OPS[op].shape(shapes, attrs)
    assert shape == out
    assert all(d is None or type(d) is int for d in shape)  # a float size breaks every kernel after


@pytest.mark.parametrize("op, shape, attrs, message", [
    ("tile", (2, 3), {"multiples": [2]}, "multiples [2] must be positive, one per axis of (2, 3)"),
    ("tile", (2, 3), {"multiples": [2, 0]}, "multiples [2, 0] must be positive, one per axis of (2, 3)"),
    ("pad", (2, 3), {"pads": [[1, 1]]}, "pads [[1, 1]] must be one non-negative [before, after] per axis of (2, 3)"),
    ("pad", (2, 3), {"pads": [[1, 1], [0, -1]]},
     "pads [[1, 1], [0, -1]] must be one non-negative [before, after] per axis of (2, 3)"),
    ("pad", (2, 3), {"pads": [[1, 1], [0, 1, 2]]},
     "pads [[1, 1], [0, 1, 2]] must be one non-negative [before, after] per axis of (2, 3)"),
    ("pad", (2, 3), {"pads": [[0, 0], [1, 1]], "mode": "wrap"},
     "pad mode 'wrap' is not one of constant, reflect, symmetric, edge"),
    ("pad", (4, 3), {"pads": [[0, 0], [3, 0]], "mode": "reflect"},
     "reflect padding [[0, 0], [3, 0]] is wider than the axes of (4, 3) allow"),
    ("pad", (4, 3), {"pads": [[5, 0], [0, 0]], "mode": "symmetric"},
     "symmetric padding [[5, 0], [0, 0]] is wider than the axes of (4, 3) allow"),
])
def test_a_layout_op_refuses_what_it_cannot_lay_out_naming_it(op, shape, attrs, message):
    with pytest.raises(ValueError) as error:
        OPS[op].shape([shape], attrs)
    assert str(error.value) == message


# ---------------------------------------------------------------- vision ops' defaults and costs

_DEFAULT_LAYOUTS = {"layout": "NCHW", "weight_layout": {"conv2d": "OIHW", "conv_transpose2d": "IOHW"}}


@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("conv2d", "max_pool2d", "avg_pool2d", "conv_transpose2d",
                                                                "resize2d") and c.attrs.get("layout") == "NCHW"
                                  and c.attrs.get("weight_layout") in (None, "OIHW", "IOHW")], ids=lambda c: c.id)
def test_a_vision_op_without_layouts_is_torchs_nchw_and_weight_layout(case):
    bare = Case(case.op, case.inputs, {k: v for k, v in case.attrs.items() if k not in ("layout", "weight_layout")},
                case.reference, case.name)
    assert OPS[case.op].shape([x.shape for x in case.inputs], bare.attrs) == \
        OPS[case.op].shape([x.shape for x in case.inputs], case.attrs)
    (outputs, grads, _), (want_outputs, want_grads, _) = _run(bare), _run(case)
    for got, want in zip(outputs + (grads or []), want_outputs + (want_grads or [])):
        np.testing.assert_array_equal(got, want)


def _cost(op, shapes, attrs):
    record = OPS[op]
    return record.cost(Work(shapes, record.shape(shapes, attrs), attrs, elem=2))


def test_a_convolutions_cost_is_two_flops_per_output_and_weight_tap_of_one_group():
    from device.ops.record import ACCUMULATOR_BYTES

    # OIHW (6, 4, 3, 2): C_in 4 (of one group), kh 3, kw 2, all different; output (2, 12, 6, 9)
    attrs = {"groups": 3, "padding": [[1, 1], [0, 0]]}
    flops, _ = _cost("conv2d", [(2, 12, 6, 10), (6, 4, 3, 2)], attrs)
    macs = 2 * 6 * 6 * 9 * 4 * 3 * 2
    assert (flops, _) == (2.0 * macs, macs * (2 + 2 * ACCUMULATOR_BYTES))
    # transposed, IOHW (3, 5, 2, 3): per input element (120 of them) C_out 5 x kh 2 x kw 3
    attrs = {"output_size": [8, 10], "strides": [2, 2], "padding": [[0, 0], [1, 1]]}
    flops, _ = _cost("conv_transpose2d", [(2, 3, 4, 5), (3, 5, 2, 3)], attrs)
    assert flops == 2.0 * (2 * 3 * 4 * 5) * 5 * 2 * 3


def test_a_transposed_convolution_refuses_an_input_of_other_channels_than_its_weights():
    attrs = {"output_size": [8, 10], "strides": [2, 2]}
    with pytest.raises(ValueError) as error:
        OPS["conv_transpose2d"].shape([(2, 4, 4, 5), (3, 2, 2, 2)], attrs)
    assert str(error.value) == "the input's 4 channels are not the weight's 3 inputs"
    assert OPS["conv_transpose2d"].shape([(2, None, 4, 5), (3, 2, 2, 2)], attrs) == [(2, 2, 8, 10)]


@pytest.mark.parametrize("shapes, groups, message", [
    ([(2, 6, 5, 5), (4, 3, 3, 3)], 3, "groups=3: the input's 6 channels and the weight's 4 outputs must split into "
                                      "3 groups of 3 inputs each"),
    ([(2, 6, 5, 5), (6, 3, 3, 3)], 3, "groups=3: the input's 6 channels and the weight's 6 outputs must split into "
                                      "3 groups of 3 inputs each"),
    ([(2, 6, 5, 5), (6, 3, 3, 3)], 0, "groups=0: the input's 6 channels and the weight's 6 outputs must split into "
                                      "0 groups of 3 inputs each"),
])
def test_a_convolution_refuses_channels_that_do_not_split_into_its_groups(shapes, groups, message):
    with pytest.raises(ValueError) as error:
        OPS["conv2d"].shape(shapes, {"groups": groups})
    assert str(error.value) == message


def test_a_convolution_of_unknown_input_channels_takes_the_weights_and_strides_default_to_1():
    assert OPS["conv2d"].shape([(2, None, 5, 5), (6, 3, 3, 3)], {"groups": 2}) == [(2, 6, 3, 3)]
    x, w = randn(2, 4, 5, 5), randn(6, 2, 3, 3)
    (y,), _ = OPS["conv2d"].forward([x, w], {"groups": 2}, KernelContext())
    assert [y.shape] == OPS["conv2d"].shape([x.shape, w.shape], {"groups": 2})  # the kernel's strides, 1, too


@pytest.mark.parametrize("op, attrs, per_output", [
    ("max_pool2d", {"kernel": [3, 2]}, 6),  # one flop per window element
    ("avg_pool2d", {"kernel": 2}, 4),
    ("resize2d", {"size": [8, 10], "method": "bilinear"}, 8),  # 4 taps of a multiply-add
    ("resize2d", {"size": [8, 10], "method": "nearest"}, 0),  # a copy
])
def test_a_pool_or_resize_costs_its_flops_per_output_element_and_one_pass(op, attrs, per_output):
    record = OPS[op]
    shapes = [(2, 3, 4, 5)]
    work = Work(shapes, record.shape(shapes, attrs), attrs, elem=2)
    assert record.cost(work) == (float(per_output * work.out), work.moved)


def test_resize_refuses_an_unknown_method_naming_the_known():
    with pytest.raises(ValueError) as error:
        OPS["resize2d"].shape([(2, 3, 4, 5)], {"size": [8, 10], "method": "bicubic"})
    assert str(error.value) == "method 'bicubic' is not one of nearest, bilinear"


@pytest.mark.parametrize("op, attrs, w", [
    ("conv2d", {}, randn(4, 3, 3, 2)), ("max_pool2d", {"kernel": [3, 2]}, None),
    ("avg_pool2d", {"kernel": 2, "strides": 1}, None),
])
def test_a_window_op_without_padding_is_valid(op, attrs, w):
    x = randn(2, 3, 7, 6)
    inputs = [x] if w is None else [x, w]
    padded = dict(attrs, padding="VALID")
    (y,), _ = OPS[op].forward(inputs, attrs, KernelContext())
    (want,), _ = OPS[op].forward(inputs, padded, KernelContext())
    np.testing.assert_array_equal(y, want)
    shapes = [v.shape for v in inputs]
    assert OPS[op].shape(shapes, attrs) == OPS[op].shape(shapes, padded) == [want.shape]


@pytest.mark.parametrize("x_shape", [(2, 3, None, 6), (2, 3, 7, None), (2, 3, None, None)])
def test_same_padding_of_an_unknown_size_leaves_both_output_sizes_unknown(x_shape):
    for padding in ("SAME", "same"):
        assert OPS["max_pool2d"].shape([x_shape], {"kernel": 3, "strides": 2, "padding": padding}) == \
            [(2, 3, None, None)]
    # VALID and explicit padding: each size on its own
    (shape,) = OPS["max_pool2d"].shape([x_shape], {"kernel": 3, "strides": 2, "padding": [[1, 1], [1, 1]]})
    assert shape[2] == (None if x_shape[2] is None else 4) and shape[3] == (None if x_shape[3] is None else 3)


@pytest.mark.parametrize("attrs, message", [
    ({"output_size": [8, 9], "strides": 2},
     "output_size (8, 9) with padding 'VALID' is not the input of a convolution whose output has (4, 5) pixels"),
    ({"output_size": [8, 11], "strides": 2, "padding": [[0, 0], [-1, 1]]}, "negative padding ((0, 0), (-1, 1))"),
    ({"output_size": [8, 12], "strides": 2, "padding": "SAME"},
     "output_size (8, 12) with padding 'SAME' is not the input of a convolution whose output has (4, 5) pixels"),
])
def test_a_transposed_convolution_refuses_sizes_that_do_not_fit_naming_them(attrs, message):
    with pytest.raises(ValueError) as error:
        OPS["conv_transpose2d"].shape([(2, 3, 4, 5), (3, 2, 2, 2)], attrs)
    assert str(error.value) == message


# ------------------------------------------- elementwise, activations, reductions, linalg


def test_cumsum_keeps_an_integer_inputs_dtype():
    (y,), _ = OPS["cumsum"].forward([np.array([[1, 2, 3]], np.int32)], {"axis": 1}, KernelContext())
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, [[1, 3, 6]])


def test_dropout_keeps_where_a_float32_draw_is_at_least_the_rate():
    x = np.ones((4, 5), np.float32)
    draws = np.random.default_rng(3).random(x.shape, dtype=np.float32)
    rate = float(draws[1, 2])  # that element's draw equals the rate: kept (keep probability 1 - rate exactly)
    (y,), _ = OPS["dropout"].forward([x], {"rate": rate}, KernelContext(training=True, rng=np.random.default_rng(3)))
    np.testing.assert_array_equal(y, (draws >= rate) * np.float32(1.0 / (1.0 - rate)))
    assert y[1, 2] != 0
    (y,), _ = OPS["dropout"].forward([x], {"rate": 1.0}, KernelContext(training=True, rng=np.random.default_rng(3)))
    assert y.dtype == np.float32 and not np.any(y)


@pytest.mark.parametrize("needs", [(False, True, False), (False, False, True), (False, True, True)])
def test_where_computes_only_the_gradients_asked_for(needs):
    condition, a, b, g = RNG.random((3, 4)) > 0.5, randn(3, 4), randn(1, 4), randn(3, 4)
    record = OPS["where"]
    _, saved = record.forward([condition, a, b], {}, KernelContext())
    grads = record.backward(saved, [g], {}, needs)
    assert grads[0] is None and [x is not None for x in grads[1:]] == list(needs[1:])
    if needs[1]:
        np.testing.assert_array_equal(grads[1], np.where(condition, g, 0.0))
    if needs[2]:
        np.testing.assert_allclose(grads[2], np.where(condition, 0.0, g).sum(axis=0, keepdims=True), rtol=1e-12)


def test_matmul_costs_its_inner_size_per_output_element():
    from device.ops.record import ACCUMULATOR_BYTES

    record, shapes = OPS["matmul"], [(2, 3, 5), (5, 7)]  # K 5, N 7
    work = Work(shapes, record.shape(shapes, {}), {}, elem=2)
    macs = 2 * 3 * 7 * 5
    assert record.cost(work) == (2.0 * macs, macs * (2 + 2 * ACCUMULATOR_BYTES))


def test_sigmoid_of_a_large_negative_input_is_0_without_a_floating_point_error():
    with np.errstate(all="raise"):
        (y,), _ = OPS["sigmoid"].forward([np.array([-1000.0, 0.0])], {}, KernelContext())
    np.testing.assert_array_equal(y, [0.0, 0.5])


@needs_torch
def test_softplus_at_its_threshold_is_torchs_curve_not_yet_x():
    x = torch.tensor([20.0, 20.5], dtype=torch.float64, requires_grad=True)
    y_t = F.softplus(x, beta=1.0, threshold=20.0)  # linear only above the threshold
    y_t.sum().backward()
    record, attrs = OPS["softplus"], {"threshold": 20.0}
    (y,), saved = record.forward([x.detach().numpy()], attrs, KernelContext())
    (dx,) = record.backward(saved, [np.ones(2)], attrs, (True,))
    np.testing.assert_array_equal(y, y_t.detach().numpy())
    np.testing.assert_allclose(dx, x.grad.numpy(), rtol=1e-15)
    assert y[0] != 20.0 and dx[0] < 1.0 - 1e-9  # sigmoid(20), not 1


def test_maximum_and_minimum_split_a_tie_evenly():
    a, b, g = np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.0, 4.0]), np.array([2.0, 2.0, 2.0])
    for op, want_a, want_b in (("maximum", [1.0, 2.0, 0.0], [1.0, 0.0, 2.0]),
                               ("minimum", [1.0, 0.0, 2.0], [1.0, 2.0, 0.0])):
        _, saved = OPS[op].forward([a, b], {}, KernelContext())
        ga, gb = OPS[op].backward(saved, [g], {}, (True, True))
        np.testing.assert_array_equal(ga, want_a)
        np.testing.assert_array_equal(gb, want_b)


def test_cross_entropy_loss_by_default_averages_over_the_last_axis():
    logits, labels = randn(2, 3, 4), ints(4, 2, 3)
    record = OPS["cross_entropy_loss"]
    full = {"axis": -1, "reduction": "mean"}
    assert record.shape([logits.shape, labels.shape], {}) == record.shape([logits.shape, labels.shape], full) == [()]
    (y,), saved = record.forward([logits, labels], {}, KernelContext())
    (want,), want_saved = record.forward([logits, labels], full, KernelContext())
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(record.backward(saved, [np.array(1.0)], {}, (True, False))[0],
                                  record.backward(want_saved, [np.array(1.0)], full, (True, False))[0])


@pytest.mark.parametrize("a, b, out", [
    ((1, 2, 3), (4, 3, 5), (4, 2, 5)), ((4, 2, 3), (1, 3, 5), (4, 2, 5)),  # a letter of size 1 broadcasts
    ((None, 2, 3), (1, 3, 5), (None, 2, 5)), ((1, 2, 3), (None, 3, 5), (None, 2, 5)),  # unknown wins over 1
    ((None, 2, 3), (4, 3, 5), (4, 2, 5)), ((4, 2, 3), (None, 3, 5), (4, 2, 5)),  # a known size over unknown
])
def test_einsums_shape_broadcasts_a_letter_of_size_1(a, b, out):
    assert OPS["einsum"].shape([a, b], {"equation": "bij,bjk->bik"}) == [out]


@pytest.mark.parametrize("batch", [4, 2])
def test_einsums_gradient_sums_a_broadcast_letter_back_to_size_1(batch):
    a, b = randn(1, 2, 3), randn(batch, 3, 5)
    record, attrs = OPS["einsum"], {"equation": "bij,bjk->bik"}
    (y,), saved = record.forward([a, b], attrs, KernelContext())
    np.testing.assert_allclose(y, np.matmul(a, b), rtol=1e-12)
    g = randn(batch, 2, 5)
    ga, gb = record.backward(saved, [g], attrs, (True, True))
    np.testing.assert_allclose(ga, np.matmul(g, b.transpose(0, 2, 1)).sum(axis=0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(gb, np.matmul(a.transpose(0, 2, 1), g), rtol=1e-12)


def test_cross_entropy_loss_of_one_class_with_an_ignored_label():
    # the ignored label is looked up as class 0, the only one: no out-of-range refusal; log p = 0
    record, attrs = OPS["cross_entropy_loss"], {"ignore_index": -100, "reduction": "none"}
    (y,), _ = record.forward([randn(3, 1), np.array([0, -100, 0])], attrs, KernelContext())
    np.testing.assert_array_equal(y, [0.0, 0.0, 0.0])


@needs_torch
@pytest.mark.parametrize("attrs, labels", [
    ({"ignore_index": 0}, [0, 0, 0, 0]),  # every label ignored: NaN, no gradient
    ({"ignore_index": 0, "label_smoothing": 0.3}, [0, 0, 0, 0]),
    ({"weight": [0.0, 0.0, 1.0]}, [0, 1, 1, 0]),  # every picked weight 0: NaN, NaN gradients
    ({"weight": [0.0, 0.0, 1.0], "label_smoothing": 0.3}, [0, 1, 1, 0]),  # smoothing's sum is not 0: NaN still
])
def test_cross_entropy_loss_over_no_weight_is_nan_as_torchs(attrs, labels):
    logits, labels = randn(4, 3), np.array(labels)
    z = torch.tensor(logits, requires_grad=True)
    kw = {k: torch.tensor(v, dtype=z.dtype) if k == "weight" else v for k, v in attrs.items()}
    want = F.cross_entropy(z, torch.tensor(labels), **kw)
    want.backward()
    record, attrs = OPS["cross_entropy_loss"], dict(attrs, reduction="mean")
    with np.errstate(all="raise"):  # no floating-point error on the way
        (y,), saved = record.forward([logits, labels], attrs, KernelContext())
        (dz, _) = record.backward(saved, [np.array(1.0)], attrs, (True, False))
    assert np.isnan(y) and np.isnan(want.item())
    np.testing.assert_array_equal(dz, z.grad.numpy())


def test_sparse_softmax_cross_entropy_shifts_each_row_by_its_own_maximum():
    logits = np.array([[1000.0, 999.0], [-1000.0, -999.0], [0.0, 1.0]])  # far apart: one shift for all overflows
    with np.errstate(all="raise"):
        (y,), _ = OPS["sparse_softmax_cross_entropy"].forward([logits, np.array([0, 1, 1])], {}, KernelContext())
    want = np.log1p(np.exp(-1.0))  # each row: -log softmax of the larger of two logits 1 apart
    np.testing.assert_allclose(y, [want, want, want], rtol=1e-12)
    with pytest.raises(UserError) as error:
        OPS["sparse_softmax_cross_entropy"].forward([logits, np.array([0, 2, 1])], {}, KernelContext())
    assert str(error.value) == "labels out of range: values in [0, 2], expected [0, 2)"


def test_einsums_implicit_output_takes_each_letter_seen_once_sorted_as_numpy():
    a, b = randn(2, 3), randn(4, 5)
    (y,), _ = OPS["einsum"].forward([a, b], {"equation": "Xi,jk"}, KernelContext())
    np.testing.assert_array_equal(y, np.einsum("Xi,jk", a, b))
    assert OPS["einsum"].shape([a.shape, b.shape], {"equation": "Xi,jk"}) == [(2, 3, 4, 5)]


@pytest.mark.parametrize("attrs", [{}, {"weight": [0.5, 2.0, 1.5]}])
def test_cross_entropy_loss_holds_its_class_weights_in_the_logits_dtype(attrs):
    # float64 weights would promote label smoothing's sum over the classes (and its gradient) to float64
    logits = randn(4, 3).astype(np.float32)
    attrs = dict(attrs, label_smoothing=0.1)
    (y,), saved = OPS["cross_entropy_loss"].forward([logits, ints(3, 4)], attrs, KernelContext())
    w = saved[4]
    assert y.dtype == np.float32 and w.dtype == np.float32
    np.testing.assert_array_equal(w, np.float32(attrs.get("weight", [1.0, 1.0, 1.0])))


def test_cross_entropy_loss_over_no_weight_is_a_nan_of_the_logits_dtype():
    logits = randn(2, 3).astype(np.float32)
    (y,), _ = OPS["cross_entropy_loss"].forward([logits, np.array([0, 0])], {"ignore_index": 0}, KernelContext())
    assert np.isnan(y) and y.dtype == np.float32


# ---- integer arithmetic: exact in the int dtype ----

_INTEGER_CASES = [c for c in CASES if c.name.startswith(("int64", "int32")) and c.op != "cast"]


@needs_torch
@pytest.mark.parametrize("case", _INTEGER_CASES, ids=[c.id for c in _INTEGER_CASES])
def test_integer_arithmetic_is_exact_beyond_float_precision(case):
    # assert_allclose compares in float64, which cannot tell 2 ** 62 + 3 from 2 ** 62: compared bit for bit
    outputs, grads, _ = _run(case)
    expected = case.reference(*[torch.tensor(x) for x in case.inputs])
    assert outputs[0].dtype == np.asarray(case.inputs[0]).dtype
    np.testing.assert_array_equal(outputs[0], expected.numpy())
    assert grads is None  # integers carry no gradient


def test_clamp_of_integers_takes_integer_bounds_and_a_bound_beyond_the_dtype_clamps_nothing():
    x = np.array([-(2**31), 5, 2**31 - 1], np.int32)
    (y,), _ = OPS["clamp"].forward([x], {"min": -(2**40), "max": 2**40}, KernelContext())
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, x)
    (y,), _ = OPS["clamp"].forward([x], {"min": 4.0}, KernelContext())  # an integral float bound is its integer
    np.testing.assert_array_equal(y, [4, 5, 2**31 - 1])
    with pytest.raises(UserError) as error:
        OPS["clamp"].forward([x], {"max": 2.5}, KernelContext())
    assert str(error.value) == "clamp of int32 values takes integer bounds, got 2.5"


# ---- audio: CTC; the host's checks ----


@pytest.mark.parametrize("change, message", [
    ({2: np.array([9, 7, 10])}, r"input_lengths in \[7, 10\], expected \[1, 9\]"),
    ({2: np.array([9, 0, 6])}, r"input_lengths in \[0, 9\], expected \[1, 9\]"),
    ({3: np.array([4, 2, -1])}, "target_lengths has a negative value"),
    ({3: np.array([4, 2, 4]), 4: np.ones((3, 4), dtype=bool)}, "target_lengths add up to 10 labels, the targets hold 12"),
    ({3: np.array([4, 2, 5])}, "target_lengths add up to 11 labels, the targets hold 10"),  # a target past its row
    ({1: _CTC_PADDED + 2}, r"targets out of range: values in \[3, 5\], expected \[0, 5\)"),
])
def test_ctc_refuses_lengths_and_labels_torch_refuses(change, message):
    inputs = [_log_probs(9, 3, 5), _CTC_PADDED, np.array([9, 7, 6]), _CTC_LENGTHS,
              np.arange(4)[None] < _CTC_LENGTHS[:, None]]
    for index, value in change.items():
        inputs[index] = value
    if 3 in change and 4 not in change:  # the frontend's mask follows the lengths
        inputs[4] = np.arange(4)[None] < np.asarray(change[3])[:, None]
    with pytest.raises(UserError, match=message):
        OPS["ctc_loss"].forward(inputs, {"blank": 0, "reduction": "mean"}, KernelContext())


@needs_torch
def test_ctc_of_an_impossible_alignment_is_infinite_without_zero_infinity_as_torch():
    # 2 steps cannot hold the labels 1, 1 (a blank must part them)
    log_probs = _log_probs(2, 1, 3)
    inputs = [log_probs, np.array([[1, 1]]), np.array([2]), np.array([2]), np.ones((1, 2), dtype=bool)]
    (loss,), saved = OPS["ctc_loss"].forward(inputs, {"blank": 0, "reduction": "sum"}, KernelContext())
    expected = F.ctc_loss(torch.tensor(log_probs), torch.tensor([[1, 1]]), [2], [2], reduction="sum")
    assert np.isposinf(loss) and torch.isinf(expected)


def test_a_host_check_passes_the_captured_value_and_refuses_the_other():
    attrs = {"expected": True, "code": "assert (lengths > 0).all()"}
    (y,), _ = OPS["host_check"].forward([np.array(True)], attrs, KernelContext())
    assert y.dtype == bool and bool(y)
    with pytest.raises(UserError, match=r"^`assert \(lengths > 0\).all\(\)` is False on this batch and was True "
                                        "on the batch the step was captured with"):
        OPS["host_check"].forward([np.array([False])], attrs, KernelContext())
