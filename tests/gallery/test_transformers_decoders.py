"""Hugging Face decoders and encoder-decoders on the emulator against torch
(tests/gallery/transformers_decoders.py): the first step's loss and every gradient within 1e-5
relative; with GALLERY_FULL=1, every model, 3 SGD steps within 1e-3 and bfloat16 within 2e-2."""

from __future__ import annotations

import pytest

from tests.gallery.test_gallery import FIRST_STEP, FULL, MIXED, STEPS
from tests.gallery.transformers_decoders import MODELS

# a gap known and not yet fixed, with what was measured: a strict expected failure
KNOWN_GAPS = {
    "GPTNeoForCausalLM": "bfloat16 only: the loss is NaN; GPT-Neo fills its masks with float32's lowest, -inf in "
                         "bfloat16 (torch rounds it so too), so a left-padded row attends nowhere with -inf "
                         "everywhere; torch keeps GPT-Neo's attention in float32",
}


def _cases():
    for name, model in MODELS.items():
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[name])] if name in KNOWN_GAPS and FULL else []
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_cases()))
def test_trains_like_torch(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not (FULL or MODELS[name].quick):
        pytest.skip("in the full gallery only: GALLERY_FULL=1 (tox -e gallery)")
    from tests.gallery.transformers_decoders import run

    result = run(name, full=FULL)
    assert not result.unsupported, "\n".join(result.unsupported)
    assert result.loss_err <= FIRST_STEP, result.loss_err
    assert result.grad_err <= FIRST_STEP, (result.grad_err, result.grad_worst)
    if FULL:
        assert result.steps_err <= STEPS, result.steps_err
        assert result.mixed_err <= MIXED, result.mixed_err
