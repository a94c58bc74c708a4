"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer"): an encoder-decoder pretrained by span corruption.

The network is Hugging Face's T5 v1.0 (``T5ForConditionalGeneration``, feed_forward_proj
"relu"), with the same keys and defaults as tf/t5:

    input_ids (B, S) -> shared embedding -> dropout
      -> num_layers x [x + dropout(SelfAttention(rms(x), bias_enc + source padding));
                       x + dropout(ffn(rms(x)))]
      -> final rms norm -> dropout                                            -> memory (B, S, d_model)
    decoder_input_ids (B, T) -> the same embedding -> dropout
      -> num_decoder_layers x [x + dropout(SelfAttention(rms(x), bias_dec, causal));
                               x + dropout(EncDecAttention(rms(x), memory, source padding));
                               x + dropout(ffn(rms(x)))]
      -> final rms norm -> dropout -> * d_model^-0.5 -> @ shared^T            -> logits (B, T, V)

    rms(x) = weight * x / sqrt(mean(x^2) + layer_norm_epsilon)   (T5LayerNorm: no mean, no bias)
    attention: q k v o without biases, heads of d_kv, scores q.k^T with NO 1/sqrt(d_kv) (T5 folds
               it into the initialisation of q), + the relative position bias, softmax, dropout
    ffn: relu: wo(dropout(relu(wi(x))));  gated-gelu: wo(dropout(gelu_tanh(wi_0(x)) * wi_1(x)))

    loss = the mean cross entropy over the labels decoder_attention_mask marks (and not -100)

With tie_word_embeddings false the head is its own ``lm_head`` and the output is not scaled.

Relative position bias: a table (relative_attention_num_buckets, num_heads) in block 0 of
each stack; every block of the stack adds the same (1, heads, Q, K) bias to its
self-attention scores (the cross-attention has none). Which bucket a (query, key) pair
falls in depends on the lengths alone (``relative_position_buckets``: bidirectional in the
encoder, causal in the decoder), so the bucket ids are a numpy constant computed when the
model is built, for the longest source (encoder) and target (decoder), and the graph holds
only an embedding lookup of the table. A numpy array rather than a buffer: never trained,
not saved, and it keeps its values in a build without weights (torch's meta device, how
the 3B and 11B configs compile). The bucket of (q, k) depends on k - q alone, so the
(L, L) ids sliced to [:Q, :K] are those of any shorter lengths. The decoder's causal mask
is one (T, T) constant, broadcast over the batch and the heads; the source padding mask is
additive, (B, 1, 1, S). The decoder's own padding needs no mask: it is right padding under
a causal mask, so it reaches only padded positions, which the loss leaves out.

Weight names are Hugging Face's (``shared.weight``, ``encoder.block.0.layer.0.SelfAttention.q.weight``,
``decoder.block.1.layer.2.DenseReluDense.wo.weight``, ...; common/t5_names.py), except that the
stacks' ``embed_tokens`` (the shared table again) and a tied ``lm_head`` are not stored twice.
Initialisation as Hugging Face's ``T5PreTrainedModel._init_weights`` (factor 1): shared
N(0, 1); q N(0, (d_model d_kv)^-0.5), k and v N(0, d_model^-0.5), o N(0, (heads d_kv)^-0.5);
wi N(0, d_model^-0.5), wo N(0, d_ff^-0.5); the bias tables N(0, d_model^-0.5); norms 1.

Greedy decoding (``predict_step``, ``--mode predict``) runs on the CPU: the encoder once per
batch, then the decoder once per target position over the ids generated so far, starting
from decoder_start_id (pad, 0), each position's most likely token appended, until every
sequence has produced </s>.
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
IGNORE = -100  # a label that counts in no loss (Hugging Face's convention), beside decoder_attention_mask


def check_sizes(p: Mapping) -> None:
    if p["relative_attention_num_buckets"] < 4:
        raise UserError(f"model.relative_attention_num_buckets {p['relative_attention_num_buckets']}: needs at "
                        f"least 4 (half of them exact, half logarithmic, per direction)")
    if p["relative_attention_max_distance"] * 2 <= p["relative_attention_num_buckets"]:
        # the decoder's causal buckets are exact below num_buckets / 2: the logarithmic ones need a longer reach
        raise UserError(f"model.relative_attention_max_distance {p['relative_attention_max_distance']}: must be "
                        f"more than half of model.relative_attention_num_buckets "
                        f"{p['relative_attention_num_buckets']} (the decoder's exact buckets)")


def lengths(params: Mapping) -> tuple[int, int]:
    """The longest source and target the position buckets must cover: the inputs'."""
    return tuple(max(params[section][key] for section in ("train_input", "eval_input"))
                 for key in ("source_length", "target_length"))


# --- relative positions: numpy, when the model is built -------------------------------------------

def relative_position_buckets(query_length: int, key_length: int, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:
    """(Q, K) int64: the bucket of key k seen from query q, Hugging Face's
    ``T5Attention._relative_position_bucket`` of k - q, in the same float32 arithmetic.

    Bidirectional: half the buckets for keys after the query, half for the rest; causal: keys
    after the query share bucket 0 (the mask hides them). Within a half, distances below
    half of it have a bucket each; longer ones share logarithmically wider buckets up to
    max_distance, and all beyond it the last.
    """
    relative = np.arange(key_length)[None, :] - np.arange(query_length)[:, None]  # (Q, K): key - query
    buckets = np.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative > 0) * num_buckets
        distance = np.abs(relative)
    else:
        distance = -np.minimum(relative, 0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # the large branch only where it applies (log of 0 elsewhere); float32 as torch computes it
    scaled = np.maximum(distance, max_exact).astype(np.float32) / np.float32(max_exact)
    large = max_exact + (np.log(scaled) / np.float32(math.log(max_distance / max_exact))
                         * np.float32(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return (buckets + np.where(is_small, distance, large)).astype(np.int64)


# --- layers ---------------------------------------------------------------------------------------

class T5LayerNorm(nn.Module):
    """RMS norm: a scale, no bias, no mean subtracted; the mean square in float32 (as Hugging Face's)."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, d) -> (B, L, d)
        variance = (x.float() * x.float()).mean(-1, keepdim=True)  # (B, L, 1)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class T5Attention(nn.Module):
    """Multi-head attention of queries from x over keys and values from ``kv`` (x itself in
    self-attention), unscaled scores plus an additive bias that broadcasts to (B, heads, Q, K)."""

    def __init__(self, p: Mapping, has_relative_attention_bias: bool):
        super().__init__()
        self.num_heads, self.d_kv = p["num_heads"], p["d_kv"]
        inner = self.num_heads * self.d_kv
        self.q = nn.Linear(p["d_model"], inner, bias=False)
        self.k = nn.Linear(p["d_model"], inner, bias=False)
        self.v = nn.Linear(p["d_model"], inner, bias=False)
        self.o = nn.Linear(inner, p["d_model"], bias=False)
        if has_relative_attention_bias:  # block 0 of a stack: the table every block of the stack uses
            self.relative_attention_bias = nn.Embedding(p["relative_attention_num_buckets"], self.num_heads)
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor, kv: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        # x (B, Q, d), kv (B, K, d), bias (B or 1, heads or 1, Q, K) -> (B, Q, d)
        B, Q, _ = x.shape
        K = kv.shape[1]
        q = self.q(x).view(B, Q, self.num_heads, self.d_kv).transpose(1, 2)  # (B, heads, Q, d_kv)
        k = self.k(kv).view(B, K, self.num_heads, self.d_kv).transpose(1, 2)  # (B, heads, K, d_kv)
        v = self.v(kv).view(B, K, self.num_heads, self.d_kv).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) + bias  # (B, heads, Q, K): no 1/sqrt(d_kv), as T5
        weights = self.dropout(scores.float().softmax(-1).to(scores.dtype))
        y = (weights @ v).transpose(1, 2).reshape(B, Q, self.num_heads * self.d_kv)  # (B, Q, heads d_kv)
        return self.o(y)


class DenseReluDense(nn.Module):
    """The feed-forward: relu wo(dropout(relu(wi x))), or gated-gelu wo(dropout(gelu_tanh(wi_0 x) * wi_1 x))."""

    def __init__(self, p: Mapping):
        super().__init__()
        d, d_ff = p["d_model"], p["d_ff"]
        self.gated = p["feed_forward_proj"] == "gated-gelu"
        if self.gated:
            self.wi_0 = nn.Linear(d, d_ff, bias=False)
            self.wi_1 = nn.Linear(d, d_ff, bias=False)
        else:
            self.wi = nn.Linear(d, d_ff, bias=False)
        self.wo = nn.Linear(d_ff, d, bias=False)
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, L, d) -> (B, L, d)
        if self.gated:
            h = F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x)  # Hugging Face's "gelu_new"
        else:
            h = F.relu(self.wi(x))
        return self.wo(self.dropout(h))


class SelfAttentionLayer(nn.Module):  # Hugging Face's T5LayerSelfAttention
    def __init__(self, p: Mapping, has_relative_attention_bias: bool):
        super().__init__()
        self.SelfAttention = T5Attention(p, has_relative_attention_bias)
        self.layer_norm = T5LayerNorm(p["d_model"], p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        h = self.layer_norm(x)
        return x + self.dropout(self.SelfAttention(h, h, bias))


class CrossAttentionLayer(nn.Module):  # Hugging Face's T5LayerCrossAttention
    def __init__(self, p: Mapping):
        super().__init__()
        self.EncDecAttention = T5Attention(p, has_relative_attention_bias=False)
        self.layer_norm = T5LayerNorm(p["d_model"], p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor, memory: torch.Tensor, source_mask: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.EncDecAttention(self.layer_norm(x), memory, source_mask))


class FeedForwardLayer(nn.Module):  # Hugging Face's T5LayerFF
    def __init__(self, p: Mapping):
        super().__init__()
        self.DenseReluDense = DenseReluDense(p)
        self.layer_norm = T5LayerNorm(p["d_model"], p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.dropout(self.DenseReluDense(self.layer_norm(x)))


class T5Block(nn.Module):
    """``layer``: [self-attention, feed-forward] in the encoder, [self-attention,
    cross-attention, feed-forward] in the decoder (Hugging Face's order and indices)."""

    def __init__(self, p: Mapping, is_decoder: bool, has_relative_attention_bias: bool):
        super().__init__()
        self.is_decoder = is_decoder
        layers = [SelfAttentionLayer(p, has_relative_attention_bias)]
        if is_decoder:
            layers.append(CrossAttentionLayer(p))
        layers.append(FeedForwardLayer(p))
        self.layer = nn.ModuleList(layers)

    def forward(self, x, bias, memory=None, source_mask=None):  # (B, L, d) -> (B, L, d)
        x = self.layer[0](x, bias)
        if self.is_decoder:
            x = self.layer[1](x, memory, source_mask)
        return self.layer[-1](x)


class T5Stack(nn.Module):
    """The blocks of the encoder or the decoder over embedded tokens, with the stack's one
    relative position bias and its final norm."""

    def __init__(self, p: Mapping, is_decoder: bool, length: int):
        super().__init__()
        self.is_decoder = is_decoder
        num_layers = p["num_decoder_layers"] if is_decoder else p["num_layers"]
        self.block = nn.ModuleList([T5Block(p, is_decoder, has_relative_attention_bias=i == 0)
                                    for i in range(num_layers)])
        self.final_layer_norm = T5LayerNorm(p["d_model"], p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])
        # (L, L) bucket ids, a numpy constant of the graph (see the module docstring)
        self.buckets = relative_position_buckets(length, length, not is_decoder, p["relative_attention_num_buckets"],
                                                 p["relative_attention_max_distance"])

    def position_bias(self, length: int, device: torch.device) -> torch.Tensor:  # -> (1, heads, L, L)
        if length > len(self.buckets):
            raise UserError(f"a {'target' if self.is_decoder else 'source'} of {length} tokens is longer than the "
                            f"{len(self.buckets)} the model was built for (the inputs' "
                            f"{'target' if self.is_decoder else 'source'}_length)")
        ids = torch.from_numpy(self.buckets[:length, :length]).to(device)  # (L, L)
        table = self.block[0].layer[0].SelfAttention.relative_attention_bias
        return table(ids).permute(2, 0, 1)[None]  # (L, L, heads) -> (1, heads, L, L)

    def forward(self, embedded: torch.Tensor, source_mask: torch.Tensor, memory: torch.Tensor | None = None):
        # embedded (B, L, d), source_mask (B, 1, 1, S) additive -> (B, L, d)
        L = embedded.shape[1]
        bias = self.position_bias(L, embedded.device).to(embedded.dtype)
        if self.is_decoder:
            # query t sees keys 0..t: one (L, L) constant, broadcast over the batch and the heads
            allowed = torch.tril(torch.ones(L, L, dtype=torch.bool, device=embedded.device))
            bias = bias.masked_fill(~allowed, float("-inf"))
        else:
            bias = bias + source_mask  # (B, heads, S, S): the padding's keys hidden
        x = self.dropout(embedded)
        for block in self.block:
            x = block(x, bias, memory, source_mask)
        return self.dropout(self.final_layer_norm(x))


class T5(nn.Module):
    """The shared embedding, the encoder and decoder stacks and the head."""

    def __init__(self, p: Mapping, source_length: int, target_length: int):
        super().__init__()
        self.d_model = p["d_model"]
        self.tied = p["tie_word_embeddings"]
        self.shared = nn.Embedding(p["vocab_size"], p["d_model"])
        self.encoder = T5Stack(p, is_decoder=False, length=source_length)
        self.decoder = T5Stack(p, is_decoder=True, length=target_length)
        if not self.tied:
            self.lm_head = nn.Linear(p["d_model"], p["vocab_size"], bias=False)
        init_weights(self, p)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) twice -> memory (B, S, d) and the additive source mask (B, 1, 1, S)."""
        source_mask = (1.0 - attention_mask[:, None, None, :].float()) * -1e9  # 0 on tokens, -1e9 on padding
        return self.encoder(self.shared(input_ids), source_mask), source_mask

    def decode(self, decoder_input_ids: torch.Tensor, memory: torch.Tensor,
               source_mask: torch.Tensor) -> torch.Tensor:  # (B, T), (B, S, d), (B, 1, 1, S) -> logits (B, T, V)
        x = self.decoder(self.shared(decoder_input_ids), source_mask, memory)
        if self.tied:
            # Mesh TensorFlow's rescaling of a head tied to the embedding (as Hugging Face's)
            return (x * self.d_model**-0.5) @ self.shared.weight.t()
        return self.lm_head(x)

    def forward(self, input_ids, attention_mask, decoder_input_ids) -> torch.Tensor:  # -> logits (B, T, V)
        memory, source_mask = self.encode(input_ids, attention_mask)
        return self.decode(decoder_input_ids, memory, source_mask)


def init_weights(net: T5, p: Mapping) -> None:
    """Hugging Face's T5PreTrainedModel._init_weights with initializer_factor 1."""
    d, d_kv, heads = p["d_model"], p["d_kv"], p["num_heads"]
    nn.init.normal_(net.shared.weight, std=1.0)
    if not net.tied:
        nn.init.normal_(net.lm_head.weight, std=1.0)
    for m in net.modules():
        if isinstance(m, T5Attention):
            nn.init.normal_(m.q.weight, std=(d * d_kv) ** -0.5)
            nn.init.normal_(m.k.weight, std=d**-0.5)
            nn.init.normal_(m.v.weight, std=d**-0.5)
            nn.init.normal_(m.o.weight, std=(heads * d_kv) ** -0.5)
            if hasattr(m, "relative_attention_bias"):
                nn.init.normal_(m.relative_attention_bias.weight, std=d**-0.5)
        elif isinstance(m, DenseReluDense):
            for wi in (m.wi_0, m.wi_1) if m.gated else (m.wi,):
                nn.init.normal_(wi.weight, std=d**-0.5)
            nn.init.normal_(m.wo.weight, std=p["d_ff"] ** -0.5)


# --- loss and metrics -----------------------------------------------------------------------------

def label_weights(labels: torch.Tensor, decoder_attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) float: 1 on the labels that count (decoder_attention_mask 1 and not -100)."""
    return decoder_attention_mask.float() * (labels != IGNORE).float()


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The cross entropy of each position's label (B, T), in float32; 0 where the label is -100."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T), reduction="none",
                           ignore_index=IGNORE).reshape(B, T)


def masked_mean_loss(logits, labels, decoder_attention_mask) -> torch.Tensor:
    weights = label_weights(labels, decoder_attention_mask)
    return (token_losses(logits, labels) * weights).sum() / weights.sum()


@torch.no_grad()
def greedy_decode(net: T5, input_ids: torch.Tensor, attention_mask: torch.Tensor, start_id: int,
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
    """(N,) bool: the generated ids equal the labels on every real target token, </s> included."""
    return np.where(decoder_attention_mask.astype(bool), generated == labels, True).all(axis=1)


def _weights(batch) -> np.ndarray:
    labels = np.asarray(batch[FIELDS.index("labels")])
    return np.asarray(batch[FIELDS.index("decoder_attention_mask")]) * (labels != IGNORE)


class TokenAccuracy(Metric):
    """The share of real target tokens whose most likely token, given the true tokens before
    it (teacher forcing), is the label (``accuracy``)."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.correct = self.total = 0.0

    def update(self, outputs, batch) -> None:
        weights = _weights(batch)  # (B, T)
        labels = np.asarray(batch[FIELDS.index("labels")])
        self.correct += float(np.sum((np.asarray(outputs["predictions"]) == labels) * weights))
        self.total += float(np.sum(weights))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class Perplexity(Metric):
    """exp of the mean cross entropy over every real target token of the eval set (``lm_perplexity``)."""

    summed = ("sum", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sum = self.total = 0.0

    def update(self, outputs, batch) -> None:
        weights = _weights(batch)
        self.sum += float(np.sum(np.asarray(outputs["token_losses"], np.float64) * weights))
        self.total += float(np.sum(weights))

    def result(self) -> float:
        return math.exp(self.sum / self.total) if self.total else float("nan")


class T5Model(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        super().__init__(params, T5(p, *lengths(params)), device)
        self.eval_data_dir = params["eval_input"]["data_dir"]
        self.metrics = {"accuracy": TokenAccuracy(), "lm_perplexity": Perplexity()}

    def __call__(self, batch):
        input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels = batch
        logits = self.model(input_ids, attention_mask, decoder_input_ids)  # (B, T, V)
        loss = masked_mean_loss(logits, labels, decoder_attention_mask)
        if self.model.training:  # the metrics' outputs in eval only: no argmax over the vocab in a training step
            return loss
        return loss, {"predictions": logits.argmax(-1), "token_losses": token_losses(logits, labels)}  # (B, T) each

    # --- predict: greedy decoding on the CPU (common/pytorch/runner.py calls these) ---------------

    def predict_step(self, batch) -> dict[str, np.ndarray]:
        """Greedy decoding of one batch: the generated ids with the batch's sources and labels."""
        input_ids, attention_mask, decoder_input_ids, decoder_attention_mask, labels = batch
        meta = self._meta()
        self.model.eval()
        generated = greedy_decode(self.model, input_ids, attention_mask, meta["decoder_start_id"], meta["eos_id"],
                                  meta["pad_id"], labels.shape[1])
        return {"generated_ids": generated.cpu().numpy(), "input_ids": input_ids.cpu().numpy(),
                "labels": labels.cpu().numpy(), "decoder_attention_mask": decoder_attention_mask.cpu().numpy()}

    def predictions_done(self, arrays: Mapping[str, np.ndarray], model_dir: str) -> dict[str, float]:
        """Greedy exact match over the predicted examples (logged), and model_dir/predictions.txt:
        one line per example, ``source -> generated`` decoded with the data's tokenizer.json
        (the sentinels as <extra_id_N>), and the reference where the two differ."""
        from tokenizers import Tokenizer

        meta = self._meta()
        matches = exact_matches(arrays["generated_ids"], arrays["labels"], arrays["decoder_attention_mask"])
        tokenizer = Tokenizer.from_file(os.path.join(self.eval_data_dir, "tokenizer.json"))

        def text(ids: np.ndarray) -> str:
            ids = [int(i) for i in ids]
            if meta["eos_id"] in ids:
                ids = ids[:ids.index(meta["eos_id"])]
            return tokenizer.decode([i for i in ids if i != meta["pad_id"]], skip_special_tokens=False).strip()

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
    return T5Model(params, device)
