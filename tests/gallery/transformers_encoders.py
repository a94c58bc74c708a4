"""Hugging Face encoders, as a user wraps them: tiny configs, random weights, the model's own head
and loss, batches whose rows have different lengths under an attention mask (padded on the right),
token types where the model has them, the default attention implementation (sdpa).

The masked-language models take ``labels=`` with -100 everywhere but the masked positions; the
classifiers take one class per row; the question-answering head a start and an end position per row,
some outside the row, which its loss clamps (integers) before a cross entropy that ignores them;
ViT takes images and a class. Dropout is off (the emulator draws its own masks).

The gallery's registry lists them as the "transformers" entries; its harness (run_torch) trains
each on the emulator next to torch with these batches and the model's own loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

VOCAB = 64
LENGTH = 8
BATCH = 3
CLASSES = 3  # ViT
SENTIMENTS = 2  # the text classifiers: with 2 classes over 3 rows the bias gradient never cancels
IMAGE = 8  # ViT: 8x8 pixels in 4x4 patches
MASK_ID = 2
# the shape every text encoder shares; a model adds its own names
_SIZE = dict(vocab_size=VOCAB, max_position_embeddings=32, hidden_size=16, num_hidden_layers=2,
             num_attention_heads=2, intermediate_size=32)
_NO_DROPOUT = dict(hidden_dropout_prob=0, attention_probs_dropout_prob=0)


def _bert():
    import transformers as T
    return T.BertForMaskedLM(T.BertConfig(**_SIZE, **_NO_DROPOUT, type_vocab_size=2))


def _roberta():  # positions count from pad_token_id + 1 and skip the padding
    import transformers as T
    return T.RobertaForSequenceClassification(T.RobertaConfig(
        **_SIZE, **_NO_DROPOUT, num_labels=SENTIMENTS, pad_token_id=1))


def _bert_qa():  # a start and an end score per token
    import transformers as T
    return T.BertForQuestionAnswering(T.BertConfig(**_SIZE, **_NO_DROPOUT, type_vocab_size=2))


def _distilbert():  # no token types
    import transformers as T
    return T.DistilBertForMaskedLM(T.DistilBertConfig(
        vocab_size=VOCAB, max_position_embeddings=32, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
        dropout=0, attention_dropout=0))


def _albert():  # factorized embeddings, one layer's weights shared across both layers
    import transformers as T
    return T.AlbertForMaskedLM(T.AlbertConfig(
        **_SIZE, embedding_size=8, hidden_dropout_prob=0, attention_probs_dropout_prob=0,
        classifier_dropout_prob=0))


def _electra():  # embeddings narrower than the hidden size, projected
    import transformers as T
    return T.ElectraForSequenceClassification(T.ElectraConfig(
        **_SIZE, **_NO_DROPOUT, embedding_size=8, num_labels=SENTIMENTS))


def _vit():
    import transformers as T
    return T.ViTForImageClassification(T.ViTConfig(
        image_size=IMAGE, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
        num_attention_heads=2, intermediate_size=32, hidden_dropout_prob=0, attention_probs_dropout_prob=0,
        num_labels=CLASSES))


@dataclass(frozen=True)
class Model:
    name: str  # as transformers names the class
    build: Callable[[], Any]
    task: str  # "mlm", "classify" (text), "qa" (a span's start and end) or "image"
    token_types: bool = False
    quick: bool = False  # in the default test run


MODELS = {m.name: m for m in [
    Model("BertForMaskedLM", _bert, "mlm", token_types=True, quick=True),
    Model("RobertaForSequenceClassification", _roberta, "classify"),
    Model("DistilBertForMaskedLM", _distilbert, "mlm"),
    Model("AlbertForMaskedLM", _albert, "mlm", token_types=True),
    Model("ElectraForSequenceClassification", _electra, "classify", token_types=True),
    Model("ViTForImageClassification", _vit, "image"),
    Model("BertForQuestionAnswering", _bert_qa, "qa", token_types=True, quick=True),
]}


def batches(model: Model, count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """The keyword arguments of each step; text rows of LENGTH, LENGTH - 3 and LENGTH - 5 tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        if model.task == "image":
            out.append({"pixel_values": rng.standard_normal((BATCH, 3, IMAGE, IMAGE)).astype(np.float32),
                        "labels": rng.integers(0, CLASSES, BATCH)})
            continue
        lengths = np.array([LENGTH, LENGTH - 3, LENGTH - 5])[:, None]
        position = np.arange(LENGTH)[None]
        mask = position < lengths
        ids = np.where(mask, rng.integers(3, VOCAB, (BATCH, LENGTH)), 1)
        kwargs = {"input_ids": ids, "attention_mask": mask.astype(np.int64)}
        if model.token_types:  # a second segment from the middle of each row
            kwargs["token_type_ids"] = ((position >= lengths // 2) & mask).astype(np.int64)
        if model.task == "mlm":  # mask positions 1 and 2 of each row (inside even the shortest)
            chosen = (position >= 1) & (position <= 2)
            kwargs["labels"] = np.where(chosen, ids, -100)
            kwargs["input_ids"] = np.where(chosen, MASK_ID, ids)
        elif model.task == "qa":  # transformers clamps the positions to [0, LENGTH], LENGTH is ignored:
            # a start beyond the row (ignored) and one before it (position 0), an end at LENGTH (ignored)
            kwargs["start_positions"] = np.array([rng.integers(0, LENGTH), LENGTH + 4, -1])
            kwargs["end_positions"] = np.array([rng.integers(0, LENGTH), rng.integers(0, LENGTH - 5), LENGTH])
        else:
            kwargs["labels"] = rng.integers(0, SENTIMENTS, BATCH)
        out.append(kwargs)
    return out
