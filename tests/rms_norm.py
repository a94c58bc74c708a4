"""The RMS-norm case both frameworks' T5 tests check where epsilon is added: inside the square root."""

import numpy as np

RMS_EPSILON = 0.5  # beside inputs of magnitude 0.1 (mean squares ~0.01), so where it is added shows


def rms_case(seed=0):
    """(x, weight, r): small inputs (2, 3, 8), a scale that is not ones, and the weights of a loss."""
    rng = np.random.default_rng(seed)
    x = (0.1 * rng.standard_normal((2, 3, 8))).astype(np.float32)
    return x, rng.uniform(0.5, 1.5, 8).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)


def rms_reference(x, weight, eps):
    """T5's RMS norm in float64: x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    x = x.astype(np.float64)
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight
