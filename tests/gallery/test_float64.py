"""tests/gallery/float64.py: under Float64Only the casts to float32 a model makes stay in float64."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gallery.float64 import Float64Only


def test_requests_for_float32_get_float64():
    x = torch.randn(3, 4, dtype=torch.float64)
    with Float64Only():
        widened = [
            F.log_softmax(x, dim=-1, dtype=torch.float32),  # transformers' CTC loss
            x.log_softmax(-1, torch.float32),
            x.float(), x.half(), x.bfloat16(),
            x.to(torch.float32), x.to(dtype=torch.float32), x.to("cpu", torch.float32), x.type(torch.float32),
            torch.zeros(2, dtype=torch.float32), torch.ones(2), torch.tensor(0.5),
            torch.softmax(x, -1, dtype=torch.float32),
        ]
        assert torch.get_default_dtype() == torch.float64
    assert [t.dtype for t in widened] == [torch.float64] * len(widened)
    assert torch.get_default_dtype() == torch.float32
    torch.testing.assert_close(widened[0], F.log_softmax(x, dim=-1), rtol=0, atol=0)  # the float64 values


def test_a_float32_tensor_it_cannot_widen_stops_the_run():
    x, y = torch.randn(3, dtype=torch.float64), torch.randn(3)
    with Float64Only(), pytest.raises(TypeError, match="float64 reference ran .*to in torch.float32"):
        x.to(y)  # a dtype taken from a float32 tensor
    with Float64Only():
        assert torch.arange(3).dtype == torch.int64  # integers and masks as they are
        assert (x > 0).dtype == torch.bool
