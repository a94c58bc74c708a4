"""The batches of the Hugging Face entries (tests/gallery/transformers_encoders.py and
transformers_decoders.py); their training against torch is test_gallery.py's, as for every
gallery entry."""

from __future__ import annotations

from tests.gallery import transformers_audio, transformers_decoders, transformers_encoders


def test_encoder_batches_pad_rows_of_different_lengths_on_the_right():
    from tests.gallery.transformers_encoders import LENGTH, MODELS, batches

    (bert,) = batches(MODELS["BertForMaskedLM"], 1)
    assert bert["attention_mask"].sum(1).tolist() == [LENGTH, LENGTH - 3, LENGTH - 5]
    assert bert["attention_mask"][:, 0].all()
    assert bert["token_type_ids"].max() == 1 and not (bert["token_type_ids"] * (1 - bert["attention_mask"])).any()
    assert ((bert["labels"] != -100).sum(1) == 2).all()
    assert "token_type_ids" not in batches(MODELS["DistilBertForMaskedLM"], 1)[0]


def test_decoder_batches_pad_on_the_left_and_label_no_padding():
    from tests.gallery.transformers_decoders import LENGTH, MODELS, TARGET, batches

    (gpt2,) = batches(MODELS["GPT2LMHeadModel"], 1)
    mask = gpt2["attention_mask"]
    assert mask.sum(1).tolist() == [LENGTH, LENGTH - 3, LENGTH - 5] and mask[:, -1].all()
    assert ((gpt2["labels"] == -100) == (mask == 0)).all()
    (t5,) = batches(MODELS["T5ForConditionalGeneration"], 1)
    assert t5["attention_mask"][:, 0].all() and t5["labels"].shape == (3, TARGET)
    assert (t5["labels"] != -100).sum(1).tolist() == [6, 4, 2]


def test_every_model_is_a_gallery_entry():
    from tests.gallery.registry import ENTRIES

    names = [*transformers_encoders.MODELS, *transformers_decoders.MODELS, *transformers_audio.MODELS]
    assert [e.name for e in ENTRIES.values() if e.library == "transformers"] == names
    assert {e.name for e in ENTRIES.values() if e.library == "transformers" and e.quick} == {
        "BertForMaskedLM", "BertForQuestionAnswering", "GPT2LMHeadModel", "LlamaForCausalLM",
        "T5ForConditionalGeneration"}
