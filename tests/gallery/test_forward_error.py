"""tests/gallery/forward_error.py's arithmetic and pairing, without a framework."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gallery.forward_error import errors, pair


def test_errors_are_relative_to_the_exact_layer():
    exact = np.array([[3.0, -4.0], [0.0, 0.0]])  # max 4, rms 2.5
    got = (exact + np.array([[0.0, 0.0], [1.0, 0.0]])).astype(np.float32)  # one element off by 1
    largest, rms = errors(got, exact)
    assert largest == pytest.approx(1 / 4)
    assert rms == pytest.approx(np.sqrt(1 / 4) / 2.5)
    assert errors(exact.astype(np.float32), exact) == (0.0, 0.0)


def test_pairs_layers_by_kind_and_order_and_names_a_mismatch():
    a, b = np.zeros((1, 2)), np.ones((1, 2))
    framework = {"conv": [("c1", a, b), ("c2", b, a)], "batch_norm": [], "relu6": [("r", a, a)]}
    emulator = {"conv": [("n1", b), ("n2", a)], "batch_norm": [], "relu6": [("n3", b)]}
    rows = pair(framework, emulator)
    assert [(kind, name) for kind, name, *_ in rows] == [("conv", "c1"), ("conv", "c2"), ("relu6", "r")]
    assert rows[1][4] is a  # the emulator's second conv beside the framework's second
    with pytest.raises(SystemExit, match="2 conv layers in the framework, 1 in the emulator"):
        pair(framework, {**emulator, "conv": emulator["conv"][:1]})
    with pytest.raises(SystemExit, match=r"relu6 r: the framework's output is \(1, 2\), the emulator's \(2,\)"):
        pair(framework, {**emulator, "relu6": [("n3", np.ones(2))]})
