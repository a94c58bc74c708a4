"""Hugging Face decoders and encoder-decoders, as a user wraps them: tiny configs, random weights,
the model's own LM head and loss (``labels=`` with -100 on the padding), batches whose rows have
different lengths under an attention mask, the default attention implementation (sdpa).

Decoders are left-padded, as for batched generation: the padding positions then attend to
nothing, the case torch's sdpa answers with zeros. Encoder-decoders pad their sources on the
right and their labels with -100; the model shifts the labels into decoder inputs itself
(slice assignment in the traced step). Dropout is off (the emulator draws its own masks).

The gallery's registry lists them as "transformers" entries next to the encoders
(transformers_encoders.py); its harness (run_torch) trains each on the emulator next to torch
with these batches and the model's own loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

VOCAB = 64
LENGTH = 8  # source (decoder: the whole sequence)
TARGET = 6  # an encoder-decoder's labels
BATCH = 3


def _gpt2():
    import transformers as T
    return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                          resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))


def _gpt_neo():  # one global and one local (windowed) attention layer
    import transformers as T
    return T.GPTNeoForCausalLM(T.GPTNeoConfig(
        vocab_size=VOCAB, max_position_embeddings=32, hidden_size=16, num_layers=2, num_heads=2,
        attention_types=[[["global", "local"], 1]], window_size=4, resid_dropout=0, embed_dropout=0,
        attention_dropout=0))


def _gptj():  # rotary on the first 4 of each head's 8 dimensions
    import transformers as T
    return T.GPTJForCausalLM(T.GPTJConfig(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2,
                                          rotary_dim=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0))


def _opt():
    import transformers as T
    return T.OPTForCausalLM(T.OPTConfig(
        vocab_size=VOCAB, max_position_embeddings=32, hidden_size=16, num_hidden_layers=2, ffn_dim=32,
        num_attention_heads=2, word_embed_proj_dim=16, dropout=0, attention_dropout=0, pad_token_id=1))


def _llama():  # rotary, RMS norm, SiLU gates, grouped-query attention (2 heads, 1 key/value head)
    import transformers as T
    return T.LlamaForCausalLM(T.LlamaConfig(
        vocab_size=VOCAB, max_position_embeddings=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1))


def _t5():  # relative position buckets, RMS-style layer norm, a tied head
    import transformers as T
    return T.T5ForConditionalGeneration(T.T5Config(
        vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2, dropout_rate=0,
        decoder_start_token_id=0, pad_token_id=0))


def _bart():
    import transformers as T
    return T.BartForConditionalGeneration(T.BartConfig(
        vocab_size=VOCAB, max_position_embeddings=32, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
        dropout=0, attention_dropout=0, activation_dropout=0))


@dataclass(frozen=True)
class Model:
    name: str  # as transformers names the class
    build: Callable[[], Any]
    seq2seq: bool = False
    quick: bool = False  # in the default test run


MODELS = {m.name: m for m in [
    Model("GPT2LMHeadModel", _gpt2, quick=True),
    Model("GPTNeoForCausalLM", _gpt_neo),
    Model("GPTJForCausalLM", _gptj),
    Model("OPTForCausalLM", _opt),
    Model("LlamaForCausalLM", _llama, quick=True),
    Model("T5ForConditionalGeneration", _t5, seq2seq=True, quick=True),
    Model("BartForConditionalGeneration", _bart, seq2seq=True),
]}


def batches(model: Model, count: int, seed: int = 1) -> list[dict[str, np.ndarray]]:
    """The keyword arguments of each step; rows of LENGTH, LENGTH - 3 and LENGTH - 5 tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.array([LENGTH, LENGTH - 3, LENGTH - 5])[:, None]
    position = np.arange(LENGTH)[None]
    out = []
    for _ in range(count):
        ids = rng.integers(3, VOCAB, (BATCH, LENGTH))
        if model.seq2seq:  # sources padded on the right, labels of 6, 4 and 2 tokens
            mask = position < lengths
            labels = rng.integers(3, VOCAB, (BATCH, TARGET))
            labels[np.arange(TARGET)[None] >= np.array([[6], [4], [2]])] = -100
        else:  # left-padded, as for batched generation
            mask = position >= LENGTH - lengths
            labels = np.where(mask, ids, -100)
        out.append({"input_ids": ids, "attention_mask": mask.astype(np.int64), "labels": labels})
    return out
