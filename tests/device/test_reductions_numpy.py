"""reduce_sum and reduce_mean sum in one order whatever the layout, close to the exact sum.

numpy adds the rows of a strided axis one after another, so the mean over the spatial axes of an
NHWC map (a global average pool, a squeeze-and-excitation) carried an fp32 error growing with the
map's size, where the same values in NCHW were summed pairwise. Framework-free (float64 is the
reference).
"""

from __future__ import annotations

import numpy as np
import pytest

from device.ops import OPS, KernelContext

RNG = np.random.default_rng(11)
EPS32 = float(np.finfo(np.float32).eps)


def run(op, x, axes, keepdims=False):
    outputs, _ = OPS[op].forward([x], {"axes": axes, "keepdims": keepdims}, KernelContext(training=True))
    return outputs[0]


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
def test_the_same_sum_in_either_layout(op):
    nhwc = (RNG.random((4, 32, 32, 8)) + 0.5).astype(np.float32)  # positive, as after a ReLU or swish
    nchw = np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(run(op, nhwc, [1, 2]), run(op, nchw, [2, 3]))


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean"])
def test_a_large_strided_sum_is_close_to_the_exact_one(op):
    x = (RNG.random((2, 64, 64, 4)) + 0.5).astype(np.float32)
    exact = getattr(x.astype(np.float64), "sum" if op == "reduce_sum" else "mean")(axis=(1, 2))
    got = run(op, x, [1, 2])
    assert got.dtype == np.float32
    # 4096 terms: a sequential sum's error bound is 4096 eps; the pairwise one's a few eps
    assert np.max(np.abs(got - exact) / exact) < 8 * EPS32


def test_keepdims_and_every_axis():
    x = RNG.standard_normal((3, 4, 5)).astype(np.float32)
    assert run("reduce_mean", x, [0, 2], keepdims=True).shape == (1, 4, 1)
    np.testing.assert_allclose(run("reduce_sum", x, None), x.astype(np.float64).sum(), rtol=1e-6)
    assert run("reduce_sum", x, None).shape == ()
