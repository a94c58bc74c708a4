"""The recurrent family blocks' shared settings: an LSTM (or GRU) sequence classifier.

Used by tests/device/test_family_blocks_recurrent_torch.py and ..._tf.py (one file per
framework, so that each runs where only its framework is installed). The five batches and
the tolerances are the language blocks' (tests/device/language_blocks.py).
"""

from __future__ import annotations

import numpy as np

from tests.device.language_blocks import step_batches

EMBED, HIDDEN, LAYERS, CLASSES = 8, 12, 2, 3


def classifier_batches():
    """Five (ids (B, T) int64, labels (B,) int64): the language blocks' ids, a class per sequence."""
    return [(ids, (np.arange(len(ids)) + step) % CLASSES) for step, (ids, *_) in enumerate(step_batches())]
