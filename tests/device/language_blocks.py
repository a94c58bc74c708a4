"""The language family blocks' shared settings: sizes, the five batches, the tolerances.

Used by tests/device/test_family_blocks_language_torch.py and ..._tf.py (one file per
framework, so that each runs where only its framework is installed).
"""

from __future__ import annotations

import copy

import numpy as np

VOCAB, SEQ, DIM, HEADS = 13, 6, 16, 2  # a batch is 3 sequences (IDS)
STEPS, LR = 5, 1e-3
MIXED = ("bfloat16", "float16")

# token ids with padding (0) at the end of two of the three sequences; [CLS] = 1
IDS = np.array([[1, 5, 7, 2, 9, 0], [1, 3, 12, 4, 0, 0], [1, 8, 6, 11, 10, 2]], np.int64)
MLM_POSITIONS = np.array([[2, 4], [1, 3], [5, 2]], np.int64)  # two masked positions per sequence
MLM_LABELS = np.array([[3, 4], [6, 7], [8, 2]], np.int64)
NSP_LABELS = np.array([0, 1, 1], np.int64)
NUM_BUCKETS, MAX_DISTANCE = 8, 16  # T5's relative position buckets (bidirectional)


def step_batches():
    """Five batches: the ids shifted in the vocabulary, so that each step sees new data."""
    out = []
    for step in range(STEPS):
        ids = np.where(IDS > 1, (IDS - 2 + step) % (VOCAB - 2) + 2, IDS)
        out.append((ids, MLM_POSITIONS, (MLM_LABELS + step) % VOCAB, (NSP_LABELS + step) % 2))
    return out


def check(losses, expected, precision):
    """The emulator's loss at every step against the framework's float32 run."""
    rtol = 1e-4 if precision == "float32" else 2e-2
    np.testing.assert_allclose(losses, expected, rtol=rtol, err_msg=precision)


def with_precision(graph, precision):
    """A shallow copy of the IR graph that computes in ``precision``."""
    copied = copy.copy(graph)
    copied.precision = precision
    return copied
