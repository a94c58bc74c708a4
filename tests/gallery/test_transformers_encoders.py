"""The batches of the Hugging Face encoder entries (tests/gallery/transformers_encoders.py); their
training against torch is test_gallery.py's, as for every gallery entry."""

from __future__ import annotations

from tests.gallery.transformers_encoders import MODELS


def test_batches_pad_rows_of_different_lengths():
    from tests.gallery.transformers_encoders import LENGTH, batches

    (bert,) = batches(MODELS["BertForMaskedLM"], 1)
    assert bert["attention_mask"].sum(1).tolist() == [LENGTH, LENGTH - 3, LENGTH - 5]
    assert bert["token_type_ids"].max() == 1 and not (bert["token_type_ids"] * (1 - bert["attention_mask"])).any()
    assert ((bert["labels"] != -100).sum(1) == 2).all()
    assert "token_type_ids" not in batches(MODELS["DistilBertForMaskedLM"], 1)[0]
