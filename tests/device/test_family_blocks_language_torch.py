"""One small block per language family (BERT, GPT, T5) in PyTorch, end to end (the same in
TensorFlow: test_family_blocks_language_tf.py).

Each block is written as a user of the zoo writes it, from the framework's own layers and
ops: a BERT encoder layer with a padding mask, the MLM head's masked-position gather and an
NSP head; a GPT block with a causal mask built in the graph and a head tied to the token
embedding; a T5 block with RMS norm and a relative position bias whose buckets are computed
in the graph (log, floor, integer arithmetic) from position ids that skip padding.

Each validates, compiles, and trains on the emulator for 5 Adam steps with the framework's
loss at every step: within 1e-4 relative in float32, within 2e-2 in bfloat16 and float16
(against the framework's float32 run).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.device.language_blocks import (DIM, HEADS, LR, MAX_DISTANCE, MIXED, NUM_BUCKETS, SEQ, VOCAB, step_batches,
                                          check, with_precision)

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.api import compile_graph, validate_graph  # noqa: E402
from device.capture.torch import capture, state_of, weights_of  # noqa: E402
from device.runtime.program import Program  # noqa: E402


class TorchAttention(nn.Module):
    def __init__(self, scale: bool = True, bias: bool = True):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=bias)
        self.out = nn.Linear(DIM, DIM, bias=bias)
        self.scale = scale

    def forward(self, x, mask=None, additive=None):  # x (B, T, C); mask (B, 1 or T, T) bool; additive (.., T, T)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = [t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v)]  # (B, H, T, D)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
        if self.scale:
            scores = scores / math.sqrt(C // HEADS)
        if additive is not None:
            scores = scores + additive
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
        y = scores.softmax(-1) @ v  # (B, H, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class TorchBert(nn.Module):
    """A BERT encoder layer (post-norm), the MLM head on the masked positions and the NSP head."""

    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.position = nn.Embedding(SEQ, DIM)
        self.ln_embed = nn.LayerNorm(DIM, eps=1e-12)
        self.attn = TorchAttention()
        self.ln1 = nn.LayerNorm(DIM, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.ln2 = nn.LayerNorm(DIM, eps=1e-12)
        self.mlm_dense = nn.Linear(DIM, DIM)
        self.mlm_ln = nn.LayerNorm(DIM, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(VOCAB))
        self.pooler = nn.Linear(DIM, DIM)
        self.nsp = nn.Linear(DIM, 2)

    def forward(self, ids, positions):  # (B, T), (B, P)
        B, T = ids.shape
        x = self.ln_embed(self.word(ids) + self.position(torch.arange(T)))  # (B, T, C)
        keep = ids != 0  # the padding mask, from the batch
        additive = (1.0 - keep[:, None, None, :].float()) * -10000.0  # BERT's additive form
        x = self.ln1(x + self.attn(x, additive=additive))
        x = self.ln2(x + self.ffn(x))
        picked = x[torch.arange(B)[:, None], positions]  # (B, P, C): the masked positions
        h = self.mlm_ln(F.gelu(self.mlm_dense(picked)))
        mlm_logits = h @ self.word.weight.t() + self.mlm_bias  # decoder tied to the word embedding
        nsp_logits = self.nsp(torch.tanh(self.pooler(x[:, 0])))  # [CLS]
        return mlm_logits, nsp_logits


class TorchGpt(nn.Module):
    """A GPT-2 block: pre-norm, causal mask built in the graph, tanh GELU, tied head."""

    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.pos_emb = nn.Embedding(SEQ, DIM)
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = TorchAttention()
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(approximate="tanh"), nn.Linear(4 * DIM, DIM))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as GPT-2

    def forward(self, ids):  # (B, T)
        B, T = ids.shape
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(T, device=ids.device))
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[None].expand(B, T, T)
        x = x + self.attn(self.ln1(x), mask=causal)
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln_f(x))  # (B, T, V)


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def torch_buckets(relative):
    """T5's bidirectional relative position buckets (HF's _relative_position_bucket)."""
    half = NUM_BUCKETS // 2
    buckets = (relative > 0).long() * half
    distance = torch.abs(relative)
    exact = half // 2
    is_small = distance < exact
    large = exact + (torch.log(distance.float() / exact) / math.log(MAX_DISTANCE / exact)
                     * (half - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return buckets + torch.where(is_small, distance, large)


class TorchT5(nn.Module):
    """A T5 encoder block: RMS norm, unscaled attention with a relative position bias, ReLU FFN."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.ln1 = RMSNorm()
        self.attn = TorchAttention(scale=False, bias=False)
        self.relative_bias = nn.Embedding(NUM_BUCKETS, HEADS)
        self.ln2 = RMSNorm()
        self.wi = nn.Linear(DIM, 4 * DIM, bias=False)
        self.wo = nn.Linear(4 * DIM, DIM, bias=False)
        self.ln_f = RMSNorm()
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):  # (B, T)
        keep = ids != 0
        position = torch.cumsum(keep.long(), dim=1) - 1  # (B, T): positions that skip padding
        relative = position[:, None, :] - position[:, :, None]  # (B, T, T): key - query
        bias = self.relative_bias(torch_buckets(relative)).permute(0, 3, 1, 2)  # (B, H, T, T)
        x = self.embed(ids)
        mask = keep[:, None, :].expand(-1, ids.shape[1], -1)  # (B, T, T)
        x = x + self.attn(self.ln1(x), mask=mask, additive=bias)
        x = x + self.wo(F.relu(self.wi(self.ln2(x))))
        return self.head(self.ln_f(x))  # (B, T, V)


def torch_block(name):
    """(model, step_fn, batch maker): each step_fn returns the scalar loss."""
    if name == "bert":
        model = TorchBert()

        def step(batch):
            ids, positions, mlm_labels, nsp_labels = batch
            mlm_logits, nsp_logits = model(ids, positions)
            return (F.cross_entropy(mlm_logits.reshape(-1, VOCAB), mlm_labels.reshape(-1))
                    + F.cross_entropy(nsp_logits, nsp_labels))

        return model, step, lambda b: [torch.tensor(a) for a in b]
    model = TorchGpt() if name == "gpt" else TorchT5()

    def step(batch):
        ids, targets = batch
        logits = model(ids)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    # next-token targets for GPT; T5 (an encoder block here) predicts the token itself shifted
    return model, step, lambda b: [torch.tensor(b[0]), torch.tensor(np.roll(b[0], -1, axis=1))]


def trains_with_torch_losses(graph, model, step, optimizer, batches) -> dict:
    """Train ``batches`` in torch and on the emulator from the same weights, in float32 and each
    mixed precision: the emulator's loss at every step within ``check``'s tolerance of torch's.
    The emulator's programs, by precision, after their steps."""
    programs = {precision: Program(with_precision(graph, precision), weights_of(model, graph),
                                   state_of(model, graph), seed=0) for precision in ("float32", *MIXED)}
    expected = []
    for batch in batches:
        optimizer.zero_grad()
        loss = step(batch)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    for precision, program in programs.items():
        losses = [program.train_step([t.numpy() for t in batch], LR) for batch in batches]
        check(losses, expected, precision)
    return programs


@pytest.mark.parametrize("name", ["bert", "gpt", "t5"])
def test_torch_block_validates_compiles_and_trains_with_torch_loss(name, tmp_path):
    torch.manual_seed(0)
    model, step, make = torch_block(name)
    batches = [make(b) for b in step_batches()]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    graph = capture(step, model, batches[0], optimizer=optimizer)
    report = validate_graph(graph, mode="train", profile_name="small")
    assert report.ok, report.to_text()
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    kinds = {k.kind for k in result.kernels}
    assert "attention" in kinds and "unsupported" not in kinds  # the masked attention is one kernel
    initial = weights_of(model, graph)
    programs = trains_with_torch_losses(graph, model, step, optimizer, batches)
    # every weight was updated (the losses above agree step by step; the weights themselves
    # can differ by up to the learning rate where a gradient is zero but for rounding, as
    # the key bias of attention, which Adam scales up: device/README.md, "How close")
    moved = {key: not np.array_equal(w, initial[key]) for key, w in programs["float32"].get_weights().items()}
    assert all(moved.values()), moved


def test_gpt_tied_head_is_one_weight_saved_under_both_keys():
    torch.manual_seed(0)
    model, step, make = torch_block("gpt")
    batch = make(step_batches()[0])
    graph = capture(step, model, batch, optimizer=torch.optim.Adam(model.parameters(), lr=LR))
    assert "tok_emb.weight" in graph.params.values() and "head.weight" not in graph.params.values()
    program = Program(graph, weights_of(model, graph), seed=0)
    program.train_step([t.numpy() for t in batch], LR)
    from device.capture.torch import load_weights

    load_weights(model, program.get_weights())
    saved = model.state_dict()
    np.testing.assert_array_equal(saved["head.weight"].numpy(), program.get_weights()["tok_emb.weight"])
