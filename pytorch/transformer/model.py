"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need"): an encoder-decoder
that maps a source sequence to a target sequence.

    input_ids (B, S) -> embedding * sqrt(hidden_size) + sinusoid(position) -> dropout
      -> encoder_num_hidden_layers x [self-attention (source padding mask); ReLU FFN]   -> memory (B, S, H)
    decoder_input_ids (B, T) -> the same embedding * sqrt(hidden_size) + sinusoid -> dropout
      -> decoder_num_hidden_layers x [causal self-attention; cross-attention over memory
                                      (source padding mask); ReLU FFN]
      -> x @ embedding^T -> logits (B, T, V)

    each sublayer, post-LN as the paper: x = LayerNorm(x + dropout(sublayer(x)));
    pre_layer_norm: true gives x = x + dropout(sublayer(LayerNorm(x))) and a final LayerNorm
    after each stack (as tensor2tensor's later versions)

    loss = the label-smoothed (label_smoothing, 0.1 in the paper) cross entropy of each label,
           the mean over the positions decoder_attention_mask marks

One embedding table serves the source, the target and the output projection (the paper's
3.4, for a shared BPE vocabulary); ``share_embedding_weights: false`` gives the source, the
target and the output projection a weight each. Weights are initialised as tensor2tensor's
and fairseq's: Xavier-uniform projections with zero biases, embeddings N(0, hidden_size^-0.5).

For the device: the sinusoid table is computed in numpy when the model is built (a
constant of the graph, so the graph holds no sin or cos); the causal mask is one (T, T)
constant built from ``torch.tril`` and broadcast over the batch and the heads; the source
padding mask is additive, (B, 1, 1, S), from attention_mask.

Greedy decoding (``predict_step``, ``--mode predict``) runs on the CPU: the encoder once per
batch, then the decoder once per target position over the ids generated so far, each
position's most likely token appended, until every sequence has produced </s>.
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError
from common.io import atomic_open
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Metric

logger = logging.getLogger("zoo")

# the batch, a tuple of tensors in this order (data.py builds them): (B, S) twice, then (B, T) three times
FIELDS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


def check_sizes(p: Mapping) -> None:
    if p["hidden_size"] % p["num_heads"]:
        raise UserError(f"model.hidden_size {p['hidden_size']} is not a multiple of model.num_heads {p['num_heads']}")
    if p["hidden_size"] % 2:
        raise UserError(f"model.hidden_size {p['hidden_size']} must be even (the sinusoids come in sin/cos pairs)")


def max_length(params: Mapping) -> int:
    """The longest sequence the positions must reach: the inputs' source and target lengths."""
    return max(params[section][key] for section in ("train_input", "eval_input")
               for key in ("source_length", "target_length"))


def sinusoid_table(positions: int, hidden_size: int) -> np.ndarray:
    """(positions, hidden_size) float32: the paper's 3.5, PE(pos, 2i) = sin(pos / 10000^(2i/d)),
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, hidden_size, 2, dtype=np.float64) / hidden_size))  # (H/2,)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, H/2)
    table = np.empty((positions, hidden_size), dtype=np.float64)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table.astype(np.float32)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention of queries from x over keys and values from ``memory``
    (x itself in self-attention), with an additive or boolean mask that broadcasts to
    (B, heads, T, S)."""

    def __init__(self, p: Mapping):
        super().__init__()
        H = p["hidden_size"]
        self.num_heads = p["num_heads"]
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.out_proj = nn.Linear(H, H)
        self.dropout = nn.Dropout(p["attention_dropout_rate"])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, additive_mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:  # (B, T, H), (B, S, H) -> (B, T, H)
        B, T, H = x.shape
        S = memory.shape[1]
        D = H // self.num_heads
        q = self.q_proj(x).view(B, T, self.num_heads, D).transpose(1, 2)  # (B, heads, T, D)
        k = self.k_proj(memory).view(B, S, self.num_heads, D).transpose(1, 2)  # (B, heads, S, D)
        v = self.v_proj(memory).view(B, S, self.num_heads, D).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, heads, T, S)
        if additive_mask is not None:
            scores = scores + additive_mask  # (B, 1, 1, S): -1e9 on the source's padding
        if causal:
            # query t sees keys 0..t: one (T, T) constant, broadcast over the batch and the heads
            allowed = torch.tril(torch.ones(T, S, dtype=torch.bool, device=x.device))
            scores = scores.masked_fill(~allowed, float("-inf"))
        y = self.dropout(scores.softmax(-1)) @ v  # (B, heads, T, D)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, H))


class FeedForward(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.fc1 = nn.Linear(p["hidden_size"], p["filter_size"])
        self.fc2 = nn.Linear(p["filter_size"], p["hidden_size"])
        self.dropout = nn.Dropout(p["relu_dropout_rate"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


def residual(x: torch.Tensor, norm: nn.LayerNorm, dropout: nn.Dropout, sublayer, pre_layer_norm: bool) -> torch.Tensor:
    """One residual sublayer with its layer norm: post-LN (the paper) LN(x + drop(f(x))), or
    pre-LN x + drop(f(LN(x)))."""
    if pre_layer_norm:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H, eps = p["hidden_size"], p["layer_norm_epsilon"]
        self.pre_layer_norm = p["pre_layer_norm"]
        self.self_attn = MultiHeadAttention(p)
        self.self_attn_norm = nn.LayerNorm(H, eps=eps)
        self.ffn = FeedForward(p)
        self.ffn_norm = nn.LayerNorm(H, eps=eps)
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:  # (B, S, H) -> (B, S, H)
        x = residual(x, self.self_attn_norm, self.dropout, lambda h: self.self_attn(h, h, source_mask),
                     self.pre_layer_norm)
        return residual(x, self.ffn_norm, self.dropout, self.ffn, self.pre_layer_norm)


class DecoderLayer(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H, eps = p["hidden_size"], p["layer_norm_epsilon"]
        self.pre_layer_norm = p["pre_layer_norm"]
        self.self_attn = MultiHeadAttention(p)
        self.self_attn_norm = nn.LayerNorm(H, eps=eps)
        self.cross_attn = MultiHeadAttention(p)
        self.cross_attn_norm = nn.LayerNorm(H, eps=eps)
        self.ffn = FeedForward(p)
        self.ffn_norm = nn.LayerNorm(H, eps=eps)
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:
        # x (B, T, H), memory (B, S, H) -> (B, T, H)
        x = residual(x, self.self_attn_norm, self.dropout, lambda h: self.self_attn(h, h, causal=True),
                     self.pre_layer_norm)
        x = residual(x, self.cross_attn_norm, self.dropout, lambda h: self.cross_attn(h, memory, source_mask),
                     self.pre_layer_norm)
        return residual(x, self.ffn_norm, self.dropout, self.ffn, self.pre_layer_norm)


class Transformer(nn.Module):
    """Embeddings, the encoder and decoder stacks and the output projection."""

    def __init__(self, p: Mapping, positions: int):
        super().__init__()
        V, H = p["vocab_size"], p["hidden_size"]
        self.hidden_size = H
        self.shared = p["share_embedding_weights"]
        self.embedding = nn.Embedding(V, H)  # source, target and output projection when shared
        if not self.shared:
            self.decoder_embedding = nn.Embedding(V, H)
            self.output_projection = nn.Linear(H, V, bias=False)
        # a numpy array, not a buffer: a constant of the graph (never trained, not saved, recomputed from
        # the params), which keeps its values in a build without weights (torch's meta device)
        self.positions = sinusoid_table(positions, H)  # (P, H)
        self.dropout = nn.Dropout(p["dropout_rate"])
        self.encoder_layers = nn.ModuleList([EncoderLayer(p) for _ in range(p["encoder_num_hidden_layers"])])
        self.decoder_layers = nn.ModuleList([DecoderLayer(p) for _ in range(p["decoder_num_hidden_layers"])])
        if p["pre_layer_norm"]:  # the stacks' outputs are the sum of unnormalised residuals: one norm each
            self.encoder_norm = nn.LayerNorm(H, eps=p["layer_norm_epsilon"])
            self.decoder_norm = nn.LayerNorm(H, eps=p["layer_norm_epsilon"])
        init_weights(self, H)

    def embed(self, table: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:  # (B, L) -> (B, L, H)
        L = ids.shape[1]
        if L > len(self.positions):
            raise UserError(f"a sequence of {L} tokens is longer than the {len(self.positions)} positions the model "
                            f"was built for (the inputs' source_length and target_length)")
        x = table(ids) * math.sqrt(self.hidden_size)  # the paper's 3.4: the embedding scaled by sqrt(d_model)
        x = x + torch.from_numpy(self.positions[:L]).to(x.device)  # (L, H), broadcast over the batch
        return self.dropout(x)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) twice -> memory (B, S, H) and the additive source mask (B, 1, 1, S)."""
        source_mask = (1.0 - attention_mask[:, None, None, :].float()) * -1e9  # 0 on tokens, -1e9 on padding
        x = self.embed(self.embedding, input_ids)
        for layer in self.encoder_layers:
            x = layer(x, source_mask)
        if hasattr(self, "encoder_norm"):
            x = self.encoder_norm(x)
        return x, source_mask

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               source_mask: torch.Tensor) -> torch.Tensor:  # (B, T), (B, S, H), (B, 1, 1, S) -> logits (B, T, V)
        x = self.embed(self.embedding if self.shared else self.decoder_embedding, decoder_input_ids)
        for layer in self.decoder_layers:
            x = layer(x, memory, source_mask)
        if hasattr(self, "decoder_norm"):
            x = self.decoder_norm(x)
        if self.shared:
            return x @ self.embedding.weight.t()  # the output projection is the embedding table (one weight)
        return self.output_projection(x)

    def forward(self, input_ids, attention_mask, decoder_input_ids) -> torch.Tensor:  # -> logits (B, T, V)
        memory, source_mask = self.encode(input_ids, attention_mask)
        return self.decode(decoder_input_ids, memory, source_mask)


def init_weights(module: nn.Module, hidden_size: int) -> None:
    """tensor2tensor's and fairseq's initialisation: projections Xavier-uniform with zero
    biases, embeddings N(0, hidden_size^-0.5) (scaled by sqrt(hidden_size) in the forward,
    so each embedded token has unit variance per dimension), LayerNorm 1 and 0."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=hidden_size**-0.5)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def smoothed_loss(logits: torch.Tensor, labels: torch.Tensor, decoder_attention_mask: torch.Tensor,
                  label_smoothing: float) -> torch.Tensor:
    """The label-smoothed cross entropy (as torch's: (1 - eps) on the label, eps spread evenly over
    the whole vocabulary), the mean over the real target tokens (decoder_attention_mask 1)."""
    B, T, V = logits.shape
    losses = F.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T), reduction="none",
                             label_smoothing=label_smoothing).reshape(B, T)
    weights = decoder_attention_mask.float()
    return (losses * weights).sum() / weights.sum()


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The plain (unsmoothed) cross entropy of each position's label (B, T), in float32: the perplexity's."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T), reduction="none").reshape(B, T)


@torch.no_grad()
def greedy_decode(net: Transformer, input_ids: torch.Tensor, attention_mask: torch.Tensor, start_id: int,
                  eos_id: int, pad_id: int, length: int) -> torch.Tensor:
    """(B, length) generated ids: the encoder once, then the decoder over the ids so far, once
    per position, appending each position's most likely token; after </s> a sequence holds
    pad_id. The decoder input has a fixed length (padding after the ids so far): the causal
    mask keeps position t from seeing it, so logits[:, t] are those of the ids up to t."""
    B = input_ids.shape[0]
    memory, source_mask = net.encode(input_ids, attention_mask)
    decoder_input = torch.full((B, length), pad_id, dtype=torch.long, device=input_ids.device)
    decoder_input[:, 0] = start_id
    generated = torch.full((B, length), pad_id, dtype=torch.long, device=input_ids.device)
    done = torch.zeros(B, dtype=torch.bool, device=input_ids.device)
    for t in range(length):
        token = net.decode(decoder_input, memory, source_mask)[:, t].argmax(-1)  # (B,)
        generated[:, t] = torch.where(done, torch.full_like(token, pad_id), token)
        done |= token == eos_id
        if bool(done.all()) or t + 1 == length:
            break
        decoder_input[:, t + 1] = generated[:, t]
    return generated


def exact_matches(generated: np.ndarray, labels: np.ndarray, decoder_attention_mask: np.ndarray) -> np.ndarray:
    """(N,) bool: the generated ids equal the labels on every real target token, </s> included
    (greedy_decode pads what follows </s>, so nothing else can differ)."""
    return np.where(decoder_attention_mask.astype(bool), generated == labels, True).all(axis=1)


# --- metrics: over the whole eval set, the positions decoder_attention_mask marks ----------------


class TokenAccuracy(Metric):
    """The share of real target tokens whose most likely token, given the true tokens before
    it (teacher forcing), is the label (``accuracy``)."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.correct = self.total = 0.0

    def update(self, outputs, batch) -> None:
        mask = np.asarray(batch[FIELDS.index("decoder_attention_mask")])  # (B, T)
        labels = np.asarray(batch[FIELDS.index("labels")])
        self.correct += float(np.sum((np.asarray(outputs["predictions"]) == labels) * mask))
        self.total += float(np.sum(mask))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class SequenceAccuracy(Metric):
    """The share of examples whose every target token is predicted right under teacher forcing
    (``sequence_accuracy``): an upper bound of greedy decoding's exact match."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.correct = self.total = 0.0

    def update(self, outputs, batch) -> None:
        mask = np.asarray(batch[FIELDS.index("decoder_attention_mask")]).astype(bool)
        labels = np.asarray(batch[FIELDS.index("labels")])
        self.correct += float(np.sum(np.where(mask, np.asarray(outputs["predictions"]) == labels, True).all(1)))
        self.total += float(len(labels))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class Perplexity(Metric):
    """exp of the mean plain cross entropy over every real target token of the eval set (``lm_perplexity``)."""

    summed = ("sum", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sum = self.total = 0.0

    def update(self, outputs, batch) -> None:
        mask = np.asarray(batch[FIELDS.index("decoder_attention_mask")])
        self.sum += float(np.sum(np.asarray(outputs["token_losses"], np.float64) * mask))
        self.total += float(np.sum(mask))

    def result(self) -> float:
        return math.exp(self.sum / self.total) if self.total else float("nan")


class TransformerModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        super().__init__(params, Transformer(p, max_length(params)), device)
        self.label_smoothing = p["label_smoothing"]
        self.eval_data_dir = params["eval_input"]["data_dir"]
        self.metrics = {"accuracy": TokenAccuracy(), "sequence_accuracy": SequenceAccuracy(),
                        "lm_perplexity": Perplexity()}

    def __call__(self, batch):
        input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels = batch
        logits = self.model(input_ids, attention_mask, decoder_input_ids)  # (B, T, V)
        loss = smoothed_loss(logits, labels, decoder_attention_mask, self.label_smoothing)
        if self.model.training:  # the metrics' outputs in eval only: no argmax over the vocab in a training step
            return loss
        return loss, {"predictions": logits.argmax(-1), "token_losses": token_losses(logits, labels)}  # (B, T) each

    # --- predict: greedy decoding on the CPU (common/pytorch/runner.py calls these) ---------------

    def predict_step(self, batch) -> dict[str, np.ndarray]:
        """Greedy decoding of one batch (on the torch device): the generated ids with the
        batch's sources and labels (each (B, length)), for predictions_done."""
        input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels = batch
        meta = self._meta()
        self.model.eval()
        generated = greedy_decode(self.model, input_ids, attention_mask, meta["decoder_start_id"], meta["eos_id"],
                                  meta["pad_id"], labels.shape[1])
        return {"generated_ids": generated.cpu().numpy(), "input_ids": input_ids.cpu().numpy(),
                "labels": labels.cpu().numpy(), "decoder_attention_mask": decoder_attention_mask.cpu().numpy()}

    def predictions_done(self, arrays: Mapping[str, np.ndarray], model_dir: str) -> dict[str, float]:
        """Greedy exact match over the predicted examples (logged), and model_dir/predictions.txt:
        one line per example, ``source -> generated`` decoded with the data's tokenizer.json, and
        the reference where the two differ."""
        from tokenizers import Tokenizer

        meta = self._meta()
        matches = exact_matches(arrays["generated_ids"], arrays["labels"], arrays["decoder_attention_mask"])
        tokenizer = Tokenizer.from_file(os.path.join(self.eval_data_dir, "tokenizer.json"))

        def text(ids: np.ndarray) -> str:
            ids = [int(i) for i in ids]
            if meta["eos_id"] in ids:
                ids = ids[:ids.index(meta["eos_id"])]
            return tokenizer.decode([i for i in ids if i != meta["pad_id"]]).strip()

        path = os.path.join(model_dir, "predictions.txt")
        with atomic_open(path, "w") as f:
            for source, generated, labels, match in zip(arrays["input_ids"], arrays["generated_ids"],
                                                        arrays["labels"], matches):
                line = f"{text(source)} -> {text(generated)}"
                f.write(line + ("\n" if match else f"    (expected: {text(labels)})\n"))
        exact_match = float(matches.mean())
        logger.info("greedy decoding: %d of %d examples exactly right (exact match %.2f %%); %s", int(matches.sum()),
                    len(matches), 100 * exact_match, path)
        return {"exact_match": exact_match}

    def _meta(self) -> dict:
        with open(os.path.join(self.eval_data_dir, "meta.json")) as f:
            return json.load(f)


def model_fn(params: Mapping, device: torch.device) -> PyTorchBaseModel:
    return TransformerModel(params, device)
