"""BERT (Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding"): pretraining (masked LM + next sentence) and sequence classification.

    input_ids, segment_ids -> word + position + token-type embeddings -> LayerNorm -> dropout
      -> num_hidden_layers x [self-attention (padding mask) -> dense -> dropout -> + -> LayerNorm
                              -> dense (filter_size) -> GELU -> dense -> dropout -> + -> LayerNorm]
      -> sequence output (B, T, H); pooled output = tanh(dense(sequence output at [CLS])) (B, H)

    pretraining: MLM head on the masked positions only (gathered): dense -> GELU -> LayerNorm
                 -> x word_embeddings^T (the output embedding is the input one) + bias;
                 NSP head: dense(pooled) -> 2 logits. loss = MLM + NSP (NSP off: disable_nsp)
    classifier:  dropout(pooled) -> dense -> num_classes logits; cross entropy

Post-LN, erf GELU, additive -10000 padding mask, as Google's modeling.py. The weight names
are Hugging Face ``BertForPreTraining``'s (``bert.encoder.layer.0.attention.self.query.weight``,
``cls.predictions.transform.dense.weight``, ...), so a checkpoint maps one to one onto
Google's TF names (common/bert_names.py). tf/bert is the same network.

The MLM loss is Google's: the mean over the masked positions of the batch weighted by
masked_lm_weights (0 on padded predictions), ``sum(w * ce) / (sum(w) + 1e-5)``.
"""

from __future__ import annotations

import logging
import math
from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.bert_names import check_compatible, read_bert_weights
from common.errors import UserError
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy, Metric

logger = logging.getLogger("zoo")

# the batch of each task, a tuple of tensors in this order (data.py builds them)
PRETRAINING_FIELDS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                      "masked_lm_weights", "next_sentence_labels")
CLASSIFIER_FIELDS = ("input_ids", "input_mask", "segment_ids", "labels")


def check_sizes(p: Mapping) -> None:
    """(max_sequence_length against max_position_embeddings: data.py, which runs first)"""
    if p["hidden_size"] % p["num_heads"]:
        raise UserError(f"model.hidden_size {p['hidden_size']} is not a multiple of model.num_heads {p['num_heads']}")


class Embeddings(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.word_embeddings = nn.Embedding(p["vocab_size"], p["hidden_size"])
        self.position_embeddings = nn.Embedding(p["max_position_embeddings"], p["hidden_size"])
        self.token_type_embeddings = nn.Embedding(p["type_vocab_size"], p["hidden_size"])
        self.LayerNorm = nn.LayerNorm(p["hidden_size"], eps=p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, H)
        T = input_ids.shape[1]
        positions = self.position_embeddings(torch.arange(T, device=input_ids.device))  # (T, H)
        x = self.word_embeddings(input_ids) + positions + self.token_type_embeddings(segment_ids)
        return self.dropout(self.LayerNorm(x))


class SelfAttention(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        H = p["hidden_size"]
        self.num_heads = p["num_heads"]
        self.query, self.key, self.value = nn.Linear(H, H), nn.Linear(H, H), nn.Linear(H, H)
        self.dropout = nn.Dropout(p["attention_dropout_rate"])

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        D = H // self.num_heads
        q, k, v = [t.view(B, T, self.num_heads, D).transpose(1, 2) for t in
                   (self.query(x), self.key(x), self.value(x))]  # (B, heads, T, D)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D) + additive_mask  # (B, heads, T, T)
        y = self.dropout(scores.softmax(-1)) @ v  # (B, heads, T, D)
        return y.transpose(1, 2).reshape(B, T, H)


class AttentionOutput(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.dense = nn.Linear(p["hidden_size"], p["hidden_size"])
        self.LayerNorm = nn.LayerNorm(p["hidden_size"], eps=p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(x + self.dropout(self.dense(y)))  # post-LN


class Attention(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.self = SelfAttention(p)
        self.output = AttentionOutput(p)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, additive_mask), x)


NONLINEARITIES = {"gelu": F.gelu, "relu": F.relu, "tanh": torch.tanh}  # gelu: the erf form, as Google's


class Intermediate(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.dense = nn.Linear(p["hidden_size"], p["filter_size"])
        self.nonlinearity = NONLINEARITIES[p["encoder_nonlinearity"]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, F)
        return self.nonlinearity(self.dense(x))


class Output(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.dense = nn.Linear(p["filter_size"], p["hidden_size"])
        self.LayerNorm = nn.LayerNorm(p["hidden_size"], eps=p["layer_norm_epsilon"])
        self.dropout = nn.Dropout(p["dropout_rate"])

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(x + self.dropout(self.dense(h)))


class Layer(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.attention = Attention(p)
        self.intermediate = Intermediate(p)
        self.output = Output(p)

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T, H)
        x = self.attention(x, additive_mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.layer = nn.ModuleList([Layer(p) for _ in range(p["num_hidden_layers"])])

    def forward(self, x: torch.Tensor, additive_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, additive_mask)
        return x


class Pooler(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.dense = nn.Linear(p["hidden_size"], p["hidden_size"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, H): [CLS]
        return torch.tanh(self.dense(x[:, 0]))


class Bert(nn.Module):
    """The encoder: (sequence output (B, T, H), pooled output (B, H))."""

    def __init__(self, p: Mapping):
        super().__init__()
        self.embeddings = Embeddings(p)
        self.encoder = Encoder(p)
        self.pooler = Pooler(p)

    def forward(self, input_ids, input_mask, segment_ids):  # (B, T) each
        # 0 where a token is kept, -10000 on padding: added to every query's scores of that key
        additive_mask = (1.0 - input_mask[:, None, None, :].float()) * -10000.0  # (B, 1, 1, T)
        x = self.encoder(self.embeddings(input_ids, segment_ids), additive_mask)  # (B, T, H)
        return x, self.pooler(x)


class PredictionTransform(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.dense = nn.Linear(p["hidden_size"], p["hidden_size"])
        self.LayerNorm = nn.LayerNorm(p["hidden_size"], eps=p["layer_norm_epsilon"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class Predictions(nn.Module):
    """The MLM head; its output projection is the word embedding table (``tied``), plus a bias."""

    def __init__(self, p: Mapping):
        super().__init__()
        self.transform = PredictionTransform(p)
        self.bias = nn.Parameter(torch.zeros(p["vocab_size"]))

    def forward(self, picked: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        return self.transform(picked) @ word_embeddings.t() + self.bias  # (B, P, H) -> (B, P, V)


class PretrainingHeads(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.predictions = Predictions(p)
        self.seq_relationship = nn.Linear(p["hidden_size"], 2)


class BertForPretraining(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.bert = Bert(p)
        self.cls = PretrainingHeads(p)
        self.disable_nsp = p["disable_nsp"]
        init_weights(self, p["initializer_range"])

    def forward(self, input_ids, input_mask, segment_ids, masked_lm_positions):
        x, pooled = self.bert(input_ids, input_mask, segment_ids)  # (B, T, H), (B, H)
        B = x.shape[0]
        # the masked positions only: (B, P, H); the vocabulary projection never sees the others
        picked = x[torch.arange(B, device=x.device)[:, None], masked_lm_positions]
        mlm_logits = self.cls.predictions(picked, self.bert.embeddings.word_embeddings.weight)  # (B, P, V)
        nsp_logits = None if self.disable_nsp else self.cls.seq_relationship(pooled)  # (B, 2)
        return mlm_logits, nsp_logits


class BertForClassification(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        self.bert = Bert(p)
        self.dropout = nn.Dropout(p["dropout_rate"])
        self.classifier = nn.Linear(p["hidden_size"], p["num_classes"])
        init_weights(self, p["initializer_range"])

    def forward(self, input_ids, input_mask, segment_ids):  # -> (B, num_classes)
        _, pooled = self.bert(input_ids, input_mask, segment_ids)
        return self.classifier(self.dropout(pooled))


def init_weights(module: nn.Module, std: float) -> None:
    """Google's initialisation: weights N(0, initializer_range), biases 0, LayerNorm 1 and 0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def masked_lm_loss(mlm_logits: torch.Tensor, masked_lm_ids: torch.Tensor, masked_lm_weights: torch.Tensor):
    """(the weighted mean loss, the loss of each prediction (B, P))."""
    B, P, V = mlm_logits.shape
    losses = F.cross_entropy(mlm_logits.float().reshape(B * P, V), masked_lm_ids.reshape(B * P),
                             reduction="none").reshape(B, P)
    return (losses * masked_lm_weights).sum() / (masked_lm_weights.sum() + 1e-5), losses


# --- metrics: over the whole eval set, weighted by masked_lm_weights -----------------------------


class MaskedLMAccuracy(Metric):
    """Fraction of the real (weight 1) masked positions whose most likely token is the original."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def reset(self) -> None:
        self.correct = self.total = 0.0

    def update(self, outputs, batch) -> None:
        weights = np.asarray(batch[PRETRAINING_FIELDS.index("masked_lm_weights")])  # (B, P)
        labels = np.asarray(batch[PRETRAINING_FIELDS.index("masked_lm_ids")])  # (B, P)
        self.correct += float(np.sum((np.asarray(outputs["mlm_predictions"]) == labels) * weights))
        self.total += float(np.sum(weights))

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class MaskedLMLoss(Metric):
    """The mean cross entropy over every real masked position of the eval set; ``perplexity``:
    its exponential (``mlm_perplexity``)."""

    summed = ("sum", "total")  # added up over the processes of a data-parallel eval

    def __init__(self, perplexity: bool = False):
        self.perplexity = perplexity
        self.reset()

    def reset(self) -> None:
        self.sum = self.total = 0.0

    def update(self, outputs, batch) -> None:
        weights = np.asarray(batch[PRETRAINING_FIELDS.index("masked_lm_weights")])
        self.sum += float(np.sum(np.asarray(outputs["mlm_losses"], np.float64) * weights))
        self.total += float(np.sum(weights))

    def result(self) -> float:
        if not self.total:
            return float("nan")
        mean = self.sum / self.total
        return math.exp(mean) if self.perplexity else mean


class BertPretrainingModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        super().__init__(params, BertForPretraining(p), device)
        self.metrics = {"masked_lm_accuracy": MaskedLMAccuracy(), "masked_lm_loss": MaskedLMLoss(),
                        "mlm_perplexity": MaskedLMLoss(perplexity=True)}
        if not p["disable_nsp"]:
            self.metrics["nsp_accuracy"] = Accuracy(output="nsp_logits",
                                                    labels=PRETRAINING_FIELDS.index("next_sentence_labels"))

    def __call__(self, batch):
        input_ids, input_mask, segment_ids, positions, masked_lm_ids, masked_lm_weights, nsp_labels = batch
        mlm_logits, nsp_logits = self.model(input_ids, input_mask, segment_ids, positions)  # (B, P, V), (B, 2)
        loss, losses = masked_lm_loss(mlm_logits, masked_lm_ids, masked_lm_weights)
        if nsp_logits is not None:
            loss = loss + F.cross_entropy(nsp_logits.float(), nsp_labels)
        if self.model.training:  # the metrics' outputs in eval only: no argmax over the vocab in a training step
            return loss
        outputs = {"mlm_predictions": mlm_logits.argmax(-1), "mlm_losses": losses}  # (B, P) each
        if nsp_logits is not None:
            outputs["nsp_logits"] = nsp_logits  # (B, 2)
        return loss, outputs


def load_pretrained(net: BertForClassification, path: str) -> None:
    """The encoder's weights from a pretraining checkpoint of either framework, shape-checked
    first; the classifier (and the checkpoint's pretraining heads) left out."""
    weights = read_bert_weights(path)
    encoder = {name: tuple(w.shape) for name, w in net.state_dict().items() if name.startswith("bert.")}
    check_compatible(weights, encoder, source=path)
    net.load_state_dict({name: torch.from_numpy(weights[name]) for name in encoder}, strict=False)
    logger.info("fine-tuning from %s: %d encoder weights loaded, the classifier starts fresh", path, len(encoder))


class BertClassifierModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        check_sizes(p)
        net = BertForClassification(p)
        if p["pretrained_checkpoint"]:
            load_pretrained(net, p["pretrained_checkpoint"])
        super().__init__(params, net, device)
        self.metrics = {"accuracy": Accuracy(output="logits", labels=CLASSIFIER_FIELDS.index("labels"))}

    def __call__(self, batch):
        input_ids, input_mask, segment_ids, labels = batch  # (B, T) x 3, (B,)
        logits = self.model(input_ids, input_mask, segment_ids)  # (B, num_classes)
        return F.cross_entropy(logits.float(), labels), {"logits": logits}


def model_fn(params: Mapping, device: torch.device) -> PyTorchBaseModel:
    if params["model"]["task"] == "classifier":
        return BertClassifierModel(params, device)
    return BertPretrainingModel(params, device)
