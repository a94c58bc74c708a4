"""common/precision.py: which device runs which 16-bit dtype, and the loss scaling params ask for."""

import logging

import pytest

from common.errors import UserError
from common.precision import check_precision, loss_scaling


def params(enabled=True, dtype="bfloat16", factor=1.0):
    return {"mixed_precision": {"enabled": enabled, "dtype": dtype}, "optimizer": {"loss_scaling_factor": factor}}


CB16 = "mixed_precision.dtype: cb16 exists on the device only; run with --device emulator or use bfloat16"


@pytest.mark.parametrize("dtype, device, message", [
    ("cb16", "cpu", CB16),
    ("cb16", "gpu", CB16),
    ("float16", "cpu", "mixed_precision.dtype: float16 needs --device gpu (or emulator); use bfloat16 on the CPU"),
])
def test_a_dtype_the_device_lacks_is_refused(dtype, device, message):
    with pytest.raises(UserError) as error:
        check_precision(params(dtype=dtype), device)
    assert str(error.value) == message


@pytest.mark.parametrize("dtype, device", [("cb16", "emulator"), ("float16", "gpu"), ("float16", "emulator"),
                                           ("bfloat16", "cpu")])
def test_a_dtype_the_device_has_passes(dtype, device):
    check_precision(params(dtype=dtype), device)
    check_precision(params(enabled=False, dtype="cb16"), "cpu")  # off: the dtype is not used


@pytest.mark.parametrize("factor, expected", [(1.0, None), (128.0, 128.0), (2, 2.0), ("dynamic", "dynamic")])
def test_loss_scaling_with_mixed_precision(factor, expected):
    got = loss_scaling(params(factor=factor))
    assert got == expected and type(got) is type(expected)  # 1.0 is no scaling at all, not a scale of 1


def test_loss_scaling_without_mixed_precision_is_none_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert loss_scaling(params(enabled=False, factor=1.0)) is None
        assert not caplog.records  # the default: nothing to say
        assert loss_scaling(params(enabled=False, factor=128.0)) is None
    assert [r.getMessage() for r in caplog.records] == [
        "optimizer.loss_scaling_factor=128.0 is ignored: mixed_precision.enabled is false"]


@pytest.mark.parametrize("factor, message", [
    ("auto", "optimizer.loss_scaling_factor must be a number or 'dynamic', got 'auto'"),
    (0.0, "optimizer.loss_scaling_factor must be positive, got 0.0"),  # params' range stops it first; callers
    (-2.0, "optimizer.loss_scaling_factor must be positive, got -2.0"),  # building params by hand get this
])
def test_a_bad_factor_is_a_user_error(factor, message):
    with pytest.raises(UserError) as error:
        loss_scaling(params(factor=factor))
    assert str(error.value) == message
