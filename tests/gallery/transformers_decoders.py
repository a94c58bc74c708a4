"""Hugging Face decoders and encoder-decoders, as a user wraps them: tiny configs, random weights,
the model's own LM head and loss (``labels=`` with -100 on the padding), batches whose rows have
different lengths under an attention mask, the default attention implementation (sdpa).

Decoders are left-padded, as for batched generation: the padding positions then attend to
nothing, the case torch's sdpa answers with zeros. Encoder-decoders pad their sources on the
right and their labels with -100; the model shifts the labels into decoder inputs itself
(slice assignment in the traced step). Dropout is off (the emulator draws its own masks).

``run(name)`` trains one on the emulator next to torch, with the figures of the gallery's
harness (first-step loss and every gradient, then STEPS SGD steps, then mixed precision).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from tests.gallery.harness import LR, MOMENTUM, STEPS, grad_gap, relative

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


def batches(model: Model, count: int, seed: int = 1) -> list[list[np.ndarray]]:
    """[ids, attention mask, labels] per step; rows of LENGTH, LENGTH - 3 and LENGTH - 5 tokens."""
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
        out.append([ids, mask.astype(np.int64), labels])
    return out


@dataclass
class Result:
    loss_err: float = 0.0
    grad_err: float = 0.0
    grad_worst: str = ""
    steps_err: float | None = None
    mixed_err: float | None = None
    unsupported: list[str] | None = None


def run(name: str, full: bool = True) -> Result:
    """The first step against torch; with ``full``, STEPS SGD steps and the first in bfloat16 too."""
    import torch

    from device.api import validate_graph
    from device.capture.torch import capture, state_of, weights_of
    from device.runtime.program import Program

    model_spec, result = MODELS[name], Result()
    torch.manual_seed(0)
    model = model_spec.build()
    twin = copy.deepcopy(model)
    data = batches(model_spec, STEPS if full else 1)
    tensors = [[torch.from_numpy(a) for a in b] for b in data]

    def step_of(m):
        return lambda b: m(input_ids=b[0], attention_mask=b[1], labels=b[2]).loss

    def sgd(m):
        return torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM)

    graph = capture(step_of(model), model, tensors[0], optimizer=sgd(model))
    report = validate_graph(graph, mode="train", profile_name="wse2")
    result.unsupported = [f"{f.framework_op or f.kind}: {f.message}" for f in report.errors]
    if not report.ok:
        return result
    weights = {k: v.copy() for k, v in weights_of(model, graph).items()}
    state = {k: v.copy() for k, v in state_of(model, graph).items()}
    loss, grads = Program(graph, weights, state, seed=0).gradients(data[0])

    step, optimizer, losses, expected = step_of(model), sgd(model), [], None
    for batch in tensors:
        optimizer.zero_grad()
        value = step(batch)
        value.backward()
        if expected is None:
            expected = {k: p.grad.numpy().copy() for k, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
        losses.append(value.item())
    result.loss_err = relative(loss, losses[0])
    result.grad_err, result.grad_worst = grad_gap(grads, expected)
    if full:
        program = Program(graph, weights, state, seed=0)
        result.steps_err = max(relative(program.train_step(b, LR), ref) for b, ref in zip(data, losses))
        graph16 = capture(step_of(twin), twin, tensors[0], optimizer=sgd(twin), precision="bfloat16")
        program16 = Program(graph16, weights_of(twin, graph16), state_of(twin, graph16), seed=0)
        result.mixed_err = relative(program16.gradients(data[0])[0], losses[0])
    return result


def _figure(value: float | None) -> str:
    return "-" if value is None else "NaN" if value != value else f"{value:.1e}"


if __name__ == "__main__":  # the README's rows: python -m tests.gallery.transformers_decoders [NAME ...]
    import sys

    for name in sys.argv[1:] or MODELS:
        r = run(name)
        refused = "; ".join(r.unsupported or [])
        print(f"| {name} | {_figure(r.loss_err)} | {_figure(r.grad_err)} | {_figure(r.steps_err)} | "
              f"{_figure(r.mixed_err)} |" + (f" refused: {refused}" if refused else ""), flush=True)
