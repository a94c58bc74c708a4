"""Llama (Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models"; Llama 3,
Grattafiori et al. 2024) and Mistral (Jiang et al. 2023, "Mistral 7B"): a decoder-only language
model trained to predict the next token, as Hugging Face's LlamaForCausalLM computes it.

    input_ids (B, T) -> embed_tokens (no position table)
      -> num_hidden_layers x [h = x + o_proj(attn(rms(x))); x = h + down(silu(gate(rms(h))) * up(rms(h)))]
         attn: causal self-attention; q and k rotated by their position (rotary, rotate_half);
               num_kv_heads key/value heads, each shared by num_heads / num_kv_heads query heads
         mlp:  SwiGLU (Shazeer 2020): down_proj(silu(gate_proj(x)) * up_proj(x)), filter_size wide
      -> norm (RMS) -> lm_head (its own weight unless share_embedding_weights) -> logits (B, T, V)

    rms(x) = x * rsqrt(mean(x^2, -1) + rms_norm_eps) * weight        (in float32, as Hugging Face)
    loss   = the mean cross entropy of the next token over the positions attention_mask marks
             (the packing pads the last window of the corpus; common/data/text/lm.py)

No biases and no dropout anywhere. ``num_kv_heads: null`` is multi-head attention (Llama 2 7B and
13B); fewer is grouped-query attention (Ainslie et al. 2023; Llama 2 70B, Llama 3, Mistral).
``rope_scaling: {rope_type: llama3, ...}`` rescales the rotary frequencies as Llama 3.1 does;
``sliding_window: W`` (Mistral) lets position i attend to j with i - W < j <= i only.

The weight names and layouts are Hugging Face ``LlamaForCausalLM``'s (``model.embed_tokens.weight``,
``model.layers.0.self_attn.q_proj.weight`` [nH*D, H], ..., ``model.norm.weight``, ``lm_head.weight``),
so that a state_dict crosses as it is. tf/llama is the same network.

For the device: the rotary cos/sin tables are computed in numpy when the model is built (a
constant of the graph, so the graph needs no sin or cos), and the causal (and sliding-window)
mask is built in the graph from ``torch.tril`` of ones, once for every layer, and added to the
scores as 0 or -inf (the capture turns it into one constant).
Greedy decoding (``--mode predict`` with a prompt file) keeps each layer's keys and values in a
cache on the host, so each new token costs one position's work; it runs on the CPU or a GPU.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from common.data.text.lm import read_lm_meta
from common.data.text.prompts import encode_prompts, prompt_batches, write_completions
from common.data.text.tokenizer import read_tokenizer_json
from common.errors import UserError
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Metric

logger = logging.getLogger("zoo")

# the batch, a tuple of tensors in this order (data.py builds them); each (B, T) int64
FIELDS = ("input_ids", "attention_mask", "labels")

ROPE_TYPES = ("llama3",)  # rope_scaling.rope_type: the Llama 3.1 frequency rescaling
ROPE_SCALING_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def num_kv_heads(p: Mapping) -> int:
    return p["num_kv_heads"] or p["num_heads"]  # null: one key/value head per query head


def check_sizes(p: Mapping) -> None:
    """(max_sequence_length against max_position_embeddings: data.py, which runs first)"""
    if p["hidden_size"] % p["num_heads"]:
        raise UserError(f"model.hidden_size {p['hidden_size']} is not a multiple of model.num_heads {p['num_heads']}")
    head_size = p["hidden_size"] // p["num_heads"]
    if head_size % 2:
        raise UserError(f"the head size {head_size} (model.hidden_size {p['hidden_size']} / model.num_heads "
                        f"{p['num_heads']}) is odd; rotary positions turn pairs of dims")
    if p["num_heads"] % num_kv_heads(p):
        raise UserError(f"model.num_kv_heads {p['num_kv_heads']} does not divide model.num_heads {p['num_heads']} "
                        f"(each key/value head serves the same number of query heads)")
    scaling = p["rope_scaling"]
    if scaling is not None:
        unknown = [k for k in scaling if k not in ROPE_SCALING_KEYS]
        if unknown:
            raise UserError(f"model.rope_scaling.{unknown[0]}: unknown key; rope_scaling takes "
                            f"{', '.join(ROPE_SCALING_KEYS)}")
        if scaling.get("rope_type") not in ROPE_TYPES:
            raise UserError(f"model.rope_scaling.rope_type {scaling.get('rope_type')!r}: not supported; "
                            f"{', '.join(ROPE_TYPES)} (or rope_scaling: null)")
        for key in ROPE_SCALING_KEYS[1:]:
            value = scaling.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise UserError(f"model.rope_scaling.{key} {value!r}: must be a positive number")
        if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
            raise UserError(f"model.rope_scaling.high_freq_factor {scaling['high_freq_factor']} must be larger than "
                            f"low_freq_factor {scaling['low_freq_factor']}")


def rope_tables(positions: int, head_size: int, theta: float, scaling: Mapping | None) -> np.ndarray:
    """(2, positions, head_size) float32: cos and sin of each position's angle, the angles of
    dims i and i + D/2 equal (rotate_half's pairing). Computed in float32 as Hugging Face's
    LlamaRotaryEmbedding does, so the tables are theirs: inv_freq = 1 / theta^(2i / D), and with
    ``scaling`` Llama 3.1's rescaling (transformers' ``_compute_llama3_parameters``)."""
    D = head_size
    inv_freq = (1.0 / (np.float32(theta) ** (np.arange(0, D, 2).astype(np.float32) / np.float32(D)))).astype(np.float32)
    if scaling is not None:
        inv_freq = llama3_inv_freq(inv_freq, scaling)
    angles = np.arange(positions).astype(np.float32)[:, None] * inv_freq[None, :]  # (P, D/2)
    angles = np.concatenate([angles, angles], axis=1)  # (P, D)
    return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


def llama3_inv_freq(inv_freq: np.ndarray, scaling: Mapping) -> np.ndarray:
    """Llama 3.1: wavelengths beyond original_max_position_embeddings / low_freq_factor slowed by
    ``factor``, those below original_max_position_embeddings / high_freq_factor kept, and those
    between interpolated smoothly (transformers/modeling_rope_utils.py, ``_compute_llama3_parameters``)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelen = np.float32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > context / low, inv_freq / np.float32(factor), inv_freq).astype(np.float32)
    smooth = ((context / wavelen - low) / (high - low)).astype(np.float32)
    smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
    medium = ~(wavelen < context / high) & ~(wavelen > context / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x_1 .. x_D) -> (-x_{D/2+1} .. -x_D, x_1 .. x_{D/2}) over the last axis (Hugging Face's)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention_mask(T: int, S: int, offset: int, window: int | None, device) -> torch.Tensor:
    """(T, S) bool: query t (at position offset + t) sees key s where s <= offset + t, and with a
    sliding window W only where offset + t - W < s (Hugging Face's sliding-window causal mask).
    Built from tril of ones: in a captured step a constant of the graph."""
    ones = torch.ones(T, S, dtype=torch.bool, device=device)
    mask = torch.tril(ones, diagonal=offset)
    if window is not None:
        mask = mask & ~torch.tril(ones, diagonal=offset - window)
    return mask


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., H) -> (..., H)
        x32 = x.float()  # the statistics in float32 under mixed precision, as Hugging Face's LlamaRMSNorm
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H = p["hidden_size"]
        self.num_heads, self.num_kv_heads = p["num_heads"], num_kv_heads(p)
        self.head_size = D = H // self.num_heads
        self.q_proj = nn.Linear(H, self.num_heads * D, bias=False)
        self.k_proj = nn.Linear(H, self.num_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(H, self.num_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(self.num_heads * D, H, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                cache: dict | None = None) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        """cos, sin: (T, D), the tables' rows of x's positions; bias (T, S): 0 where a query sees a
        key, -inf elsewhere. ``cache`` (decoding only): this layer's keys and values of the earlier
        positions, {"k", "v"} (B, kv heads, S - T, D), extended here to S."""
        B, T, _ = x.shape
        D = self.head_size
        q = self.q_proj(x).view(B, T, self.num_heads, D).transpose(1, 2)  # (B, heads, T, D)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, D).transpose(1, 2)  # (B, kv heads, T, D)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, D).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)  # (B, kv heads, S, D)
            cache["k"], cache["v"] = k, v
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:  # each k/v head serves `groups` query heads in a row (Hugging Face's repeat_kv)
            S = k.shape[2]
            k = k[:, :, None].expand(B, self.num_kv_heads, groups, S, D).reshape(B, self.num_heads, S, D)
            v = v[:, :, None].expand(B, self.num_kv_heads, groups, S, D).reshape(B, self.num_heads, S, D)
        # softmax(q k^T / sqrt(D) + bias) v in one op: the capture keeps it whole and lowers it to that
        # math (a few nodes fewer a layer for torch.export to trace)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))  # (B, heads, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.num_heads * D))


class MLP(nn.Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x))."""

    def __init__(self, p: Mapping):
        super().__init__()
        H, F_ = p["hidden_size"], p["filter_size"]
        self.gate_proj = nn.Linear(H, F_, bias=False)
        self.up_proj = nn.Linear(H, F_, bias=False)
        self.down_proj = nn.Linear(F_, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H, eps = p["hidden_size"], p["rms_norm_eps"]
        self.input_layernorm = RMSNorm(H, eps)
        self.self_attn = Attention(p)
        self.post_attention_layernorm = RMSNorm(H, eps)
        self.mlp = MLP(p)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, bias: torch.Tensor,
                cache: dict | None = None) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        h = x + self.self_attn(self.input_layernorm(x), cos, sin, bias, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """The token embeddings, the layers and the final norm: the hidden states (B, T, H)."""

    def __init__(self, p: Mapping):
        super().__init__()
        self.embed_tokens = nn.Embedding(p["vocab_size"], p["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(p) for _ in range(p["num_hidden_layers"])])
        self.norm = RMSNorm(p["hidden_size"], p["rms_norm_eps"])
        self.window = p["sliding_window"]
        # a numpy array, not a buffer: a constant of the graph (never trained, not saved, recomputed
        # from the params), which keeps its values in a build without weights (torch's meta device);
        # one table for every layer
        self.rope = rope_tables(p["max_position_embeddings"], p["hidden_size"] // p["num_heads"],
                                p["rope_theta"], p["rope_scaling"])  # (2, P, D)

    def forward(self, input_ids: torch.Tensor, caches: list[dict] | None = None) -> torch.Tensor:  # (B, T) -> (B, T, H)
        """``caches`` (decoding only): one dict per layer, the keys and values of the positions
        before input_ids' (Attention.forward); input_ids are then the positions after them."""
        T = input_ids.shape[1]
        offset = caches[0]["k"].shape[2] if caches and "k" in caches[0] else 0
        cos, sin = torch.from_numpy(self.rope[:, offset:offset + T]).to(input_ids.device)  # (T, D) each
        # built once for every layer: on the device one constant of the graph, not one per layer
        # (at MSL 4096, 64 MiB each)
        mask = attention_mask(T, offset + T, offset, self.window, input_ids.device)  # (T, S)
        bias = torch.zeros(mask.shape, device=input_ids.device).masked_fill(~mask, float("-inf"))
        x = self.embed_tokens(input_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, bias, caches[i] if caches is not None else None)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.model = LlamaModel(p)
        self.shared = p["share_embedding_weights"]
        if not self.shared:
            self.lm_head = nn.Linear(p["hidden_size"], p["vocab_size"], bias=False)
        init_weights(self, p["initializer_range"])

    def forward(self, input_ids: torch.Tensor, caches: list[dict] | None = None) -> torch.Tensor:
        """(B, T) -> logits (B, T, V)."""
        x = self.model(input_ids, caches)
        if self.shared:
            return x @ self.model.embed_tokens.weight.t()  # the output embedding is the input one (one weight)
        return self.lm_head(x)


def init_weights(module: nn.Module, std: float) -> None:
    """Hugging Face's LlamaPreTrainedModel: every projection and the embeddings N(0, std), the
    RMS norms' weights 1 (their construction)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)


# Copied from pytorch/gpt2/model.py (tests/pytorch/test_pt_llama.py keeps the copies equal): the
# loss and the eval metrics, the same in both language models.

def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The cross entropy of each position's label (B, T), in float32."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T), reduction="none").reshape(B, T)


def lm_loss(losses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real labels (attention_mask 1); every packed window holds at least one."""
    weights = attention_mask.float()
    return (losses * weights).sum() / weights.sum()


class NextTokenAccuracy(Metric):
    """The share of real label positions whose most likely token is the label (``accuracy``)."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.correct = self.total = 0.0

    def update(self, outputs, batch) -> None:
        mask = np.asarray(batch[FIELDS.index("attention_mask")])  # (B, T)
        labels = np.asarray(batch[FIELDS.index("labels")])
        self.correct += float(np.sum((np.asarray(outputs["predictions"]) == labels) * mask))
        self.total += float(np.sum(mask))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class Perplexity(Metric):
    """exp of the mean token loss over every real label of the eval set (``lm_perplexity``)."""

    summed = ("sum", "total")  # added up over the processes of a data-parallel eval

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.sum = self.total = 0.0

    def update(self, outputs, batch) -> None:
        mask = np.asarray(batch[FIELDS.index("attention_mask")])
        self.sum += float(np.sum(np.asarray(outputs["token_losses"], np.float64) * mask))
        self.total += float(np.sum(mask))

    def result(self) -> float:
        return math.exp(self.sum / self.total) if self.total else float("nan")


class LlamaLM(PyTorchBaseModel):
    """With ``predict_input.prompt_file`` set, ``--mode predict`` decodes greedily from each
    prompt of the file (the hooks of common/pytorch/runner.py: ``predict_dataloader``,
    ``predict_step`` and ``predictions_done``, given to this model only then); without it,
    predict writes the eval set's next-token argmax and losses."""

    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        super().__init__(params, LlamaForCausalLM(p), device)
        self.metrics = {"accuracy": NextTokenAccuracy(), "lm_perplexity": Perplexity()}
        self.predict_input = params["predict_input"]
        if self.predict_input["prompt_file"] is not None:
            self.data_dir = params["eval_input"]["data_dir"]  # its tokenizer.json and end-of-text id
            # read now: a bad prompt file stops the run before anything else happens
            self.prompts = encode_prompts(self.predict_input["prompt_file"], self._tokenizer(),
                                          self.predict_input["max_new_tokens"], p["max_position_embeddings"])
            self.predict_dataloader, self.predict_step = self._prompts, self._generate
            self.predictions_done = self._write_completions

    def __call__(self, batch):
        input_ids, attention_mask, labels = batch  # (B, T) each
        logits = self.model(input_ids)  # (B, T, V)
        losses = token_losses(logits, labels)  # (B, T)
        loss = lm_loss(losses, attention_mask)
        if self.model.training:  # the metrics' outputs in eval only: no argmax over the vocab in a training step
            return loss
        return loss, {"predictions": logits.argmax(-1), "token_losses": losses}  # (B, T) each

    # --- predict: greedy decoding from a prompt file, on the CPU or a GPU -----------------------

    def _tokenizer(self):
        return read_tokenizer_json(os.path.join(self.data_dir, "tokenizer.json"))

    def _prompts(self) -> DataLoader:
        return prompt_batches(self.prompts, self.predict_input["batch_size"])

    @torch.no_grad()
    def _generate(self, batch) -> dict[str, np.ndarray]:
        tokens, prompt_length = batch
        tokens = greedy_decode(self.model, tokens, prompt_length, self.predict_input["max_new_tokens"])
        return {"tokens": tokens.cpu().numpy(), "prompt_length": prompt_length.cpu().numpy()}

    def _write_completions(self, arrays: Mapping[str, np.ndarray], model_dir: str) -> dict[str, float]:
        """model_dir/completions.jsonl: each prompt's line, text and completion (cut at <|endoftext|>)."""
        path = os.path.join(model_dir, "completions.jsonl")
        count = write_completions(path, self.predict_input["prompt_file"], self._tokenizer(), arrays["tokens"],
                                  arrays["prompt_length"], self.predict_input["max_new_tokens"],
                                  read_lm_meta(self.data_dir)["eot_id"])
        logger.info("greedy decoding: %d completions of up to %d tokens in %s", count,
                    self.predict_input["max_new_tokens"], path)
        return {}


@torch.no_grad()
def greedy_decode(net: LlamaForCausalLM, tokens: torch.Tensor, prompt_length: torch.Tensor,
                  max_new_tokens: int, use_cache: bool = True) -> torch.Tensor:
    """Each row's prompt (``tokens`` (B, L), left-aligned, ``prompt_length`` (B,)) followed by
    ``max_new_tokens`` greedy tokens: token t + 1 = the argmax of the logits at t; a row's
    positions after those stay as they were (the padding).

    With the cache (each layer's keys and values so far), the positions every row's prompt
    covers run at once, then one position a step: each step feeds the newest token only, so a
    token costs one position's work against the cache. A row still inside its prompt keeps its
    own next token. ``use_cache=False`` runs the whole sequence every step (the reference)."""
    tokens = tokens.clone()
    net.eval()
    start = int(prompt_length.min())  # positions 0 .. start - 1 are every row's prompt
    end = int(prompt_length.max()) + max_new_tokens  # the last position any row needs
    caches = [{} for _ in net.model.layers] if use_cache else None
    logits = net(tokens[:, :start], caches)  # (B, start, V)
    for t in range(start - 1, end - 1):  # choose token t + 1 from the logits at t
        chosen = logits[:, -1].argmax(-1)  # (B,)
        new = (t + 1 >= prompt_length) & (t + 1 < prompt_length + max_new_tokens)  # (B,) rows past their prompt
        tokens[:, t + 1] = torch.where(new, chosen, tokens[:, t + 1])
        if t + 1 < end - 1:
            logits = net(tokens[:, t + 1:t + 2], caches) if use_cache else net(tokens[:, :t + 2])
    return tokens


def model_fn(params: Mapping, device: torch.device) -> PyTorchBaseModel:
    return LlamaLM(params, device)
