"""Edges of the vision and loss kernels that tests/device/test_ops.py's table does not reach:
numerical stability, all labels ignored, labels out of range, skipped gradients."""

from __future__ import annotations

import numpy as np
import pytest

from device.ops import OPS, KernelContext
from zoo_base.errors import UserError

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402


def test_sigmoid_cross_entropy_is_stable_for_huge_logits():
    x = np.array([-200.0, -30.0, 0.0, 30.0, 200.0], np.float32)
    z = np.array([1.0, 0.0, 0.5, 1.0, 0.0], np.float32)
    record = OPS["sigmoid_cross_entropy"]
    (loss,), saved = record.forward([x, z], {}, KernelContext())
    dx, dz = record.backward(saved, [np.ones_like(x)], {}, (True, True))
    tx, tz = torch.tensor(x, requires_grad=True), torch.tensor(z, requires_grad=True)
    expected = F.binary_cross_entropy_with_logits(tx, tz, reduction="none")
    expected.sum().backward()
    assert np.all(np.isfinite(loss)) and np.all(np.isfinite(dx)) and loss.dtype == dx.dtype == np.float32
    # (torch's float32 form rounds log(1 + e^-30) to 0; TF's and this one keep it: 9.4e-14)
    np.testing.assert_allclose(loss, expected.detach().numpy(), rtol=1e-6, atol=1e-13)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-6, atol=1e-30)
    np.testing.assert_allclose(dz, tz.grad.numpy(), rtol=1e-6)


def test_cross_entropy_with_every_label_ignored_is_nan_as_in_torch():
    logits, labels = np.zeros((3, 4), np.float32), np.full(3, -100)
    attrs = {"axis": 1, "reduction": "mean", "ignore_index": -100}
    (loss,), saved = OPS["cross_entropy_loss"].forward([logits, labels], attrs, KernelContext())
    assert np.isnan(loss) and np.isnan(F.cross_entropy(torch.zeros(3, 4), torch.tensor(labels)).item())
    dz, _ = OPS["cross_entropy_loss"].backward(saved, [np.float32(1.0)], attrs, (True, False))
    assert not dz.any()  # no label counts: no gradient (torch's is zero too)


def test_cross_entropy_labels_out_of_range_other_than_ignore_index_are_user_errors():
    attrs = {"axis": 1, "reduction": "mean", "ignore_index": 0}
    with pytest.raises(UserError, match="labels out of range"):
        OPS["cross_entropy_loss"].forward([np.zeros((2, 3), np.float32), np.array([-100, 1])], attrs, KernelContext())


def test_conv_transpose_skips_the_input_gradient_when_not_needed():
    rng = np.random.default_rng(0)
    record = OPS["conv_transpose2d"]
    attrs = {"output_size": [8, 8], "strides": [2, 2], "padding": "VALID", "layout": "NCHW", "weight_layout": "IOHW"}
    (y,), saved = record.forward([rng.standard_normal((2, 3, 4, 4)), rng.standard_normal((3, 2, 2, 2))], attrs,
                                 KernelContext())
    full = record.backward(saved, [np.ones_like(y)], attrs, (True, True))
    partial = record.backward(saved, [np.ones_like(y)], attrs, (False, True))
    assert partial[0] is None
    np.testing.assert_array_equal(partial[1], full[1])


@pytest.mark.parametrize("attrs, message", [
    ({"output_size": [10, 8], "strides": [2, 2], "padding": "VALID"}, "output_size"),
    ({"output_size": [8, 8], "strides": [2, 2], "padding": "SOMETIMES"}, "padding"),
])
def test_conv_transpose_shape_rule_rejects_sizes_that_do_not_fit(attrs, message):
    with pytest.raises(ValueError, match=message):
        OPS["conv_transpose2d"].shape([(2, 3, 4, 4), (3, 2, 2, 2)], attrs)


def test_resize_shape_rule_rejects_methods_and_factors_it_lacks():
    with pytest.raises(ValueError, match="method"):
        OPS["resize2d"].shape([(1, 2, 3, 3)], {"size": [6, 6], "method": "bicubic"})
    with pytest.raises(ValueError, match="whole-number"):
        OPS["resize2d"].shape([(1, 2, 4, 4)], {"size": [6, 6], "method": "nearest"})


def test_cross_entropy_loss_shape_rule_defaults_and_unknown_sizes():
    shape = OPS["cross_entropy_loss"].shape
    # classes on the last axis and a mean by default
    assert shape([(2, 3, 5), (2, 3)], {}) == [()]
    assert shape([(2, 3, 5), (2, 3)], {"reduction": "none"}) == [(2, 3)]
    assert shape([(2, 5, 3), (2, 3)], {"axis": 1, "reduction": "none"}) == [(2, 3)]
    # an unknown size on either side fits any size; the weights of an unknown class count are not checked
    assert shape([(None, 3, 5), (2, 3)], {"reduction": "none"}) == [(None, 3)]
    assert shape([(2, 3, 5), (None, 3)], {"reduction": "none"}) == [(2, 3)]
    assert shape([(2, None), (2,)], {"weight": [1.0, 2.0, 3.0]}) == [()]
    assert shape([(2, 5), (2,)], {"label_smoothing": 1.0}) == [()]  # [0, 1], both ends in


@pytest.mark.parametrize("shapes, attrs, message", [
    ([(2, 5), (2,)], {"reduction": "avg"}, "reduction 'avg' is not one of none, mean, sum"),
    ([(2, 5), (2,)], {"label_smoothing": 1.5}, "label_smoothing 1.5 is not in [0, 1]"),
    ([(2, 5), (2,)], {"label_smoothing": -0.1}, "label_smoothing -0.1 is not in [0, 1]"),
    ([(2, 5), (2,)], {"weight": [1.0, 2.0]}, "weight has 2 entries for 5 classes"),
    ([(2, 3, 5), (2, 4)], {}, "labels of shape (2, 4) do not fit logits of shape (2, 3, 5) with classes on axis 2"),
    ([(2, 3, 5), (2, 3, 5)], {}, "labels of shape (2, 3, 5) do not fit logits of shape (2, 3, 5) with classes on axis 2"),
])
def test_cross_entropy_loss_shape_rule_refusals_name_the_attribute_and_its_value(shapes, attrs, message):
    with pytest.raises(ValueError) as caught:
        OPS["cross_entropy_loss"].shape(shapes, attrs)
    assert str(caught.value) == message


def test_cross_entropy_loss_is_stable_per_row_and_a_mean_by_default():
    # rows 2000 apart: each row's softmax shifted by its own maximum, or one row's exp underflows to 0
    logits = np.array([[1000.0, 0.0, -1000.0], [-1000.0, -999.0, -1001.0]], np.float32)
    labels = np.array([1, 0])
    (loss,), _ = OPS["cross_entropy_loss"].forward([logits, labels], {"axis": 1}, KernelContext())
    expected = F.cross_entropy(torch.tensor(logits), torch.tensor(labels))
    assert np.isfinite(loss) and loss.dtype == np.float32
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-6)


def test_cross_entropy_loss_over_no_label_raises_no_floating_point_error():
    attrs = {"axis": 1, "reduction": "mean", "ignore_index": -100}
    with np.errstate(all="raise"):  # 0 / 0: NaN, as in torch, not an error under a caller's errstate
        (loss,), _ = OPS["cross_entropy_loss"].forward([np.zeros((3, 4), np.float32), np.full(3, -100)], attrs,
                                                       KernelContext())
    assert np.isnan(loss)


@pytest.mark.parametrize("attrs", [{}, {"pos_weight": [0.5, 2.0]}], ids=["plain", "pos-weight"])
def test_sigmoid_cross_entropy_skips_the_gradients_not_needed(attrs):
    x, z = np.array([[-1.0, 2.0], [0.5, -3.0]], np.float32), np.array([[1.0, 0.0], [0.3, 1.0]], np.float32)
    record = OPS["sigmoid_cross_entropy"]
    (loss,), saved = record.forward([x, z], attrs, KernelContext())
    g = np.ones_like(loss)
    dx, dz = record.backward(saved, [g], attrs, (True, True))
    assert record.backward(saved, [g], attrs, (False, False)) == [None, None]
    only_x, none = record.backward(saved, [g], attrs, (True, False))
    none2, only_z = record.backward(saved, [g], attrs, (False, True))
    assert none is None and none2 is None
    np.testing.assert_array_equal(only_x, dx)
    np.testing.assert_array_equal(only_z, dz)
