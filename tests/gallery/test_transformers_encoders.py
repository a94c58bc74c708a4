"""Hugging Face encoders on the emulator against torch (tests/gallery/transformers_encoders.py):
the first step's loss and every gradient within 1e-5 relative; with GALLERY_FULL=1, every model,
3 SGD steps within 1e-3 and bfloat16 within 2e-2."""

from __future__ import annotations

import pytest

from tests.gallery.test_gallery import FIRST_STEP, FULL, MIXED, STEPS
from tests.gallery.transformers_encoders import MODELS


@pytest.mark.parametrize("name", list(MODELS))
def test_trains_like_torch(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if not (FULL or MODELS[name].quick):
        pytest.skip("in the full gallery only: GALLERY_FULL=1 (tox -e gallery)")
    from tests.gallery.transformers_encoders import run

    result = run(name, full=FULL)
    assert not result.unsupported, "\n".join(result.unsupported)
    assert result.loss_err <= FIRST_STEP, result.loss_err
    assert result.grad_err <= FIRST_STEP, (result.grad_err, result.grad_worst)
    if FULL:
        assert result.steps_err <= STEPS, result.steps_err
        assert result.mixed_err <= MIXED, result.mixed_err


def test_batches_pad_rows_of_different_lengths():
    from tests.gallery.transformers_encoders import LENGTH, batches

    (bert,) = batches(MODELS["BertForMaskedLM"], 1)
    assert bert["attention_mask"].sum(1).tolist() == [LENGTH, LENGTH - 3, LENGTH - 5]
    assert bert["token_type_ids"].max() == 1 and not (bert["token_type_ids"] * (1 - bert["attention_mask"])).any()
    assert ((bert["labels"] != -100).sum(1) == 2).all()
    assert "token_type_ids" not in batches(MODELS["DistilBertForMaskedLM"], 1)[0]
