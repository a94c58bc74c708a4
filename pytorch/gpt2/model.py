"""GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): a
decoder-only language model trained to predict the next token.

    input_ids (B, T) -> word embeddings (+ learned position embeddings) -> dropout
      -> num_hidden_layers x [x + attn(ln_1(x)); x + mlp(ln_2(x))]          (pre-LN, as GPT-2)
         attn: causal self-attention, q k v from one fused projection (c_attn), c_proj, dropout
         mlp:  c_fc (filter_size) -> gelu_new (tanh approximation) -> c_proj -> dropout
      -> ln_f -> x @ wte^T (the lm head is the word embedding table) -> logits (B, T, V)

    loss = the mean cross entropy of the next token over the positions attention_mask marks
           (the packing pads the last window of the corpus; common/data/text/lm.py)

The GPT-J variant (Wang and Komatsuzaki 2021) is three switches of the same network:
``position_embedding_type: rotary`` (no position table; the first ``rotary_dim`` dims of
each head's q and k rotated pairwise by the position's angle, ``rotate_every_two``),
``use_parallel_attention`` (x + attn(ln_1(x)) + mlp(ln_1(x)): one layer norm per block)
and ``share_embedding_weights: false`` (a separate lm head with a bias). Unlike GPT-J, the
attention projections keep their biases here.

The weight names are Hugging Face ``GPT2LMHeadModel``'s (``transformer.h.0.attn.c_attn.weight``,
...), with nn.Linear's [out, in] layout where HF's Conv1D stores [in, out]; c_attn's 3 H
outputs are q, k, v in that order. tf/gpt2 is the same network.

For the device: the causal mask is built in the graph from ``torch.tril`` of ones (the
capture turns it into a constant), and the rotary sin/cos tables are computed in numpy
when the model is built (a constant of the graph), so that the graph needs no sin or cos.
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
from common.data.text.tokenizer import read_gpt2
from common.errors import UserError
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Metric

logger = logging.getLogger("zoo")

# the batch, a tuple of tensors in this order (data.py builds them); each (B, T) int64
FIELDS = ("input_ids", "attention_mask", "labels")

NONLINEARITIES = {"gelu_new": lambda x: F.gelu(x, approximate="tanh"), "gelu": F.gelu, "relu": F.relu}


def check_sizes(p: Mapping) -> None:
    """(max_sequence_length against max_position_embeddings: data.py, which runs first)"""
    if p["hidden_size"] % p["num_heads"]:
        raise UserError(f"model.hidden_size {p['hidden_size']} is not a multiple of model.num_heads {p['num_heads']}")
    head_size = p["hidden_size"] // p["num_heads"]
    if p["position_embedding_type"] == "rotary":
        rotary_dim = p["rotary_dim"] or head_size
        if rotary_dim > head_size or rotary_dim % 2:
            raise UserError(f"model.rotary_dim {rotary_dim} must be even and at most the head size {head_size} "
                            f"(hidden_size {p['hidden_size']} / num_heads {p['num_heads']})")
    elif p["rotary_dim"] is not None:
        raise UserError(f"model.rotary_dim {p['rotary_dim']} applies to rotary positions only; "
                        f"model.position_embedding_type is {p['position_embedding_type']}")


def rotary_tables(positions: int, rotary_dim: int) -> np.ndarray:
    """(2, positions, rotary_dim) float32: cos and sin of each position's angle for each dim
    pair, repeated for both dims of the pair (GPT-J's create_sinusoidal_positions, then
    repeat_interleave): dims 2i and 2i+1 turn by position / 10000^(2i / rotary_dim)."""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))  # (R/2,)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, R/2)
    angles = np.repeat(angles, 2, axis=1)  # (P, R): the pair's two dims share the angle
    return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) over the last axis."""
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class Attention(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H = p["hidden_size"]
        self.num_heads = p["num_heads"]
        self.c_attn = nn.Linear(H, 3 * H)  # q, k, v
        self.c_proj = nn.Linear(H, H)
        self.attn_dropout = nn.Dropout(p["attention_dropout_rate"])
        self.resid_dropout = nn.Dropout(p["dropout_rate"])
        self.rotary_dim = None
        if p["position_embedding_type"] == "rotary":
            self.rotary_dim = p["rotary_dim"] or H // self.num_heads
            # a numpy array, not a buffer: a constant of the graph (never trained, not saved, recomputed
            # from the params), which keeps its values in a build without weights (torch's meta device)
            self.rotary = rotary_tables(p["max_position_embeddings"], self.rotary_dim)  # (2, P, R)

    def rotate(self, t: torch.Tensor) -> torch.Tensor:  # (B, heads, T, D): the first rotary_dim dims turned
        T, R = t.shape[2], self.rotary_dim
        cos, sin = torch.from_numpy(self.rotary[:, :T]).to(t.device)  # (T, R) each
        turned = t[..., :R] * cos + rotate_every_two(t[..., :R]) * sin
        return torch.cat([turned, t[..., R:]], dim=-1) if R < t.shape[-1] else turned

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        B, T, H = x.shape
        D = H // self.num_heads
        q, k, v = [t.view(B, T, self.num_heads, D).transpose(1, 2) for t in self.c_attn(x).split(H, dim=-1)]
        if self.rotary_dim is not None:
            q, k = self.rotate(q), self.rotate(k)  # (B, heads, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # (B, heads, T, T)
        # query t sees keys 0..t: built in the graph from the sequence length (a constant on the device)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool, device=x.device))  # (T, T), broadcast
        scores = scores.masked_fill(~causal, float("-inf"))
        y = self.attn_dropout(scores.softmax(-1)) @ v  # (B, heads, T, D)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(B, T, H)))


class MLP(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.c_fc = nn.Linear(p["hidden_size"], p["filter_size"])
        self.c_proj = nn.Linear(p["filter_size"], p["hidden_size"])
        self.nonlinearity = NONLINEARITIES[p["nonlinearity"]]
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        return self.dropout(self.c_proj(self.nonlinearity(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H, eps = p["hidden_size"], p["layer_norm_epsilon"]
        self.parallel = p["use_parallel_attention"]
        self.ln_1 = nn.LayerNorm(H, eps=eps)
        self.attn = Attention(p)
        if not self.parallel:
            self.ln_2 = nn.LayerNorm(H, eps=eps)
        self.mlp = MLP(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        if self.parallel:  # GPT-J: attention and MLP read the same normalised input
            h = self.ln_1(x)
            return x + self.attn(h) + self.mlp(h)
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """Embeddings, blocks and the final layer norm: the hidden states (B, T, H)."""

    def __init__(self, p: Mapping):
        super().__init__()
        self.wte = nn.Embedding(p["vocab_size"], p["hidden_size"])
        if p["position_embedding_type"] == "learned":
            self.wpe = nn.Embedding(p["max_position_embeddings"], p["hidden_size"])
        self.drop = nn.Dropout(p["embedding_dropout_rate"])
        self.h = nn.ModuleList([Block(p) for _ in range(p["num_hidden_layers"])])
        self.ln_f = nn.LayerNorm(p["hidden_size"], eps=p["layer_norm_epsilon"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, H)
        x = self.wte(input_ids)
        if hasattr(self, "wpe"):
            x = x + self.wpe(torch.arange(input_ids.shape[1], device=input_ids.device))  # (T, H), broadcast
        x = self.drop(x)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


class GPT2LMHeadModel(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.transformer = Transformer(p)
        self.shared = p["share_embedding_weights"]
        if not self.shared:
            self.lm_head = nn.Linear(p["hidden_size"], p["vocab_size"])
        init_weights(self, p["initializer_range"], p["num_hidden_layers"])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> logits (B, T, V)
        x = self.transformer(input_ids)
        if self.shared:
            return x @ self.transformer.wte.weight.t()  # the output embedding is the input one (one weight)
        return self.lm_head(x)


def init_weights(module: nn.Module, std: float, num_layers: int) -> None:
    """GPT-2's initialisation (as Hugging Face's GPT2PreTrainedModel): weights N(0, std),
    biases 0, LayerNorm 1 and 0; the projections into the residual stream (each block's
    attn.c_proj and mlp.c_proj) N(0, std / sqrt(2 num_layers)), the paper's scaling "by
    1/sqrt(N) where N is the number of residual layers"."""
    for name, m in module.named_modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            scaled = name.endswith("c_proj")
            nn.init.normal_(m.weight, std=std / math.sqrt(2 * num_layers) if scaled else std)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The cross entropy of each position's label (B, T), in float32."""
    B, T, V = logits.shape
    return F.cross_entropy(logits.float().reshape(B * T, V), labels.reshape(B * T), reduction="none").reshape(B, T)


def lm_loss(losses: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The mean over the real labels (attention_mask 1); every packed window holds at least one."""
    weights = attention_mask.float()
    return (losses * weights).sum() / weights.sum()


# --- metrics: over the whole eval set, the positions attention_mask marks -------------------------


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


class GPT2Model(PyTorchBaseModel):
    """With ``predict_input.prompt_file`` set, ``--mode predict`` decodes greedily from each
    prompt of the file (the hooks of common/pytorch/runner.py: ``predict_dataloader``,
    ``predict_step`` and ``predictions_done``, given to this model only then); without it,
    predict writes the eval set's next-token argmax and losses."""

    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        super().__init__(params, GPT2LMHeadModel(p), device)
        self.metrics = {"accuracy": NextTokenAccuracy(), "lm_perplexity": Perplexity()}
        self.predict_input = params["predict_input"]
        if self.predict_input["prompt_file"] is not None:
            self.data_dir = params["eval_input"]["data_dir"]  # its tokenizer and end-of-text id
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
        return read_gpt2(os.path.join(self.data_dir, "encoder.json"), os.path.join(self.data_dir, "vocab.bpe"))

    def _prompts(self) -> DataLoader:
        return prompt_batches(self.prompts, self.predict_input["batch_size"])

    @torch.no_grad()
    def _generate(self, batch) -> dict[str, np.ndarray]:
        """max_new_tokens greedy steps: token t + 1 of each row = the argmax of its logits at t.
        Each step runs the whole (B, L) sequence (no cache of keys and values: a prompt file is
        small), and the causal mask keeps the padding behind a prompt out of its logits."""
        tokens, prompt_length = batch
        tokens = tokens.clone()
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        self.model.eval()
        for step in range(self.predict_input["max_new_tokens"]):
            last = prompt_length - 1 + step  # (B,) each row's newest token
            end = int(last.max()) + 1
            logits = self.model(tokens[:, :end])  # (B, end, V)
            tokens[rows, last + 1] = logits[rows, last].argmax(-1)
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


def model_fn(params: Mapping, device: torch.device) -> PyTorchBaseModel:
    return GPT2Model(params, device)
