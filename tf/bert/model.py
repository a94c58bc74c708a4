"""BERT (Devlin et al. 2018, "BERT: Pre-training of Deep Bidirectional Transformers for
Language Understanding"): pretraining (masked LM + next sentence) and sequence classification.

The same network, keys and defaults as pytorch/bert. Written as Google's modeling.py
(google-research/bert) in TF1 ops, with its variable names, so that its checkpoints and
this folder's read each other (common/bert_names.py maps them to PyTorch's):

    bert/embeddings/{word,position,token_type}_embeddings, bert/embeddings/LayerNorm/{gamma,beta}
    bert/encoder/layer_{i}/attention/self/{query,key,value}/{kernel,bias}
    bert/encoder/layer_{i}/attention/output/dense, .../attention/output/LayerNorm
    bert/encoder/layer_{i}/intermediate/dense, .../output/dense, .../output/LayerNorm
    bert/pooler/dense
    cls/predictions/transform/dense, cls/predictions/transform/LayerNorm, cls/predictions/output_bias
    cls/seq_relationship/output_weights (2, H), cls/seq_relationship/output_bias
    output_weights (num_classes, H), output_bias                    (the classifier, as run_classifier.py)

Post-LN encoder layers; the padding mask is additive (-10000 where input_mask is 0); GELU
in its exact (erf) form. The MLM head gathers the masked positions only and projects them
with the word embedding (tied), plus a bias; its loss is the mean over masked_lm_weights.
``model_fn`` follows the Estimator contract (common/tf/estimator): TRAIN returns the loss
and train_op, EVAL the loss and the metrics through ``host_call`` (how metrics leave the
device), PREDICT the classes (classifier) or the masked positions' predicted ids.

Every op is one the device takes (device/README.md; the same forms as the BERT block of
tests/device/test_family_blocks_language_tf.py): dense layers on 2-D activations, layer
norm as tf.nn.moments + tf.nn.batch_normalization (Google's layer_norm), the gather with
batch_dims for the masked positions.
"""

import logging
import math
from typing import Mapping

import keras
import tensorflow as tf

from common.bert_names import check_compatible, read_bert_weights, tf_name_to_torch
from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

logger = logging.getLogger("zoo")
v1 = tf.compat.v1


def compute_dtype() -> tf.DType:
    """The runner's Keras policy: float32, or the 16-bit format of mixed precision (fp32 variables)."""
    return tf.as_dtype(keras.mixed_precision.global_policy().compute_dtype)


def weight(name: str, shape: list, stddev: float | None = None, init: float = 0.0) -> tf.Tensor:
    """A float32 variable (truncated normal of ``stddev``, else the constant ``init``), read in the compute dtype."""
    initializer = (v1.truncated_normal_initializer(stddev=stddev) if stddev is not None
                   else v1.constant_initializer(init))
    variable = v1.get_variable(name, shape, tf.float32, initializer=initializer)
    return tf.cast(variable, compute_dtype())


def dense(x: tf.Tensor, units: int, name: str, p: Mapping, activation=None) -> tf.Tensor:
    """(N, in) -> (N, units): x @ kernel + bias, kernel (in, units) as Google's tf.layers.dense."""
    with v1.variable_scope(name):
        kernel = weight("kernel", [x.shape[-1], units], stddev=p["initializer_range"])
        y = tf.matmul(x, kernel) + weight("bias", [units])
    return y if activation is None else activation(y)


def layer_norm(x: tf.Tensor, p: Mapping, name: str = "LayerNorm") -> tf.Tensor:
    """Over the last axis, in float32 (as Keras does under a 16-bit policy), back to x's dtype."""
    with v1.variable_scope(name):
        gamma, beta = (v1.get_variable(n, [x.shape[-1]], tf.float32, initializer=v1.constant_initializer(v))
                       for n, v in (("gamma", 1.0), ("beta", 0.0)))
        x32 = tf.cast(x, tf.float32)
        mean, variance = tf.nn.moments(x32, [-1], keepdims=True)
        y = tf.nn.batch_normalization(x32, mean, variance, beta, gamma, p["layer_norm_epsilon"])
    return tf.cast(y, x.dtype)


def dropout(x: tf.Tensor, rate: float, training: bool) -> tf.Tensor:
    return tf.nn.dropout(x, rate=rate) if training and rate > 0 else x


def activation_fn(name: str):
    return {"gelu": lambda x: tf.nn.gelu(x, approximate=False), "relu": tf.nn.relu, "tanh": tf.tanh}[name]


def attention(x: tf.Tensor, additive_mask: tf.Tensor, batch: int, seq: int, p: Mapping, training: bool) -> tf.Tensor:
    """(B*T, H) -> (B*T, H): multi-head self-attention; additive_mask (B, 1, 1, T) is 0 or -10000."""
    heads, hidden = p["num_heads"], p["hidden_size"]
    size = hidden // heads

    def split_heads(t):  # (B*T, H) -> (B, heads, T, size)
        return tf.transpose(tf.reshape(t, [batch, seq, heads, size]), [0, 2, 1, 3])

    with v1.variable_scope("self"):
        q, k, v = (split_heads(dense(x, hidden, name, p)) for name in ("query", "key", "value"))
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(size))  # (B, heads, T, T)
    scores = scores + tf.cast(additive_mask, scores.dtype)
    probs = dropout(tf.nn.softmax(scores), p["attention_dropout_rate"], training)
    context = tf.matmul(probs, v)  # (B, heads, T, size)
    return tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * seq, hidden])


def encoder_layer(x: tf.Tensor, additive_mask: tf.Tensor, batch: int, seq: int, p: Mapping,
                  training: bool) -> tf.Tensor:
    """(B*T, H) -> (B*T, H), post-LN: LN(x + attention(x)), then LN(h + FFN(h))."""
    with v1.variable_scope("attention"):
        context = attention(x, additive_mask, batch, seq, p, training)
        with v1.variable_scope("output"):
            h = dropout(dense(context, p["hidden_size"], "dense", p), p["dropout_rate"], training)
            x = layer_norm(x + h, p)
    with v1.variable_scope("intermediate"):
        h = dense(x, p["filter_size"], "dense", p, activation_fn(p["encoder_nonlinearity"]))  # (B*T, filter)
    with v1.variable_scope("output"):
        h = dropout(dense(h, p["hidden_size"], "dense", p), p["dropout_rate"], training)
        return layer_norm(x + h, p)


def bert_encoder(features: Mapping, p: Mapping, training: bool) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """input_ids, input_mask, segment_ids (B, T) -> (sequence output (B, T, H), pooled (B, H),
    word embedding table (V, H) for the tied MLM output)."""
    ids = features["input_ids"]
    batch, seq = ids.shape
    hidden = p["hidden_size"]
    if hidden % p["num_heads"]:
        raise UserError(f"model.hidden_size {hidden} is not a multiple of model.num_heads {p['num_heads']}")
    if seq > p["max_position_embeddings"]:
        raise UserError(f"the input's sequences have {seq} tokens, more than model.max_position_embeddings "
                        f"{p['max_position_embeddings']}")
    with v1.variable_scope("bert"):
        with v1.variable_scope("embeddings"):
            table = weight("word_embeddings", [p["vocab_size"], hidden], stddev=p["initializer_range"])
            x = tf.gather(table, ids)  # (B, T, H)
            positions = weight("position_embeddings", [p["max_position_embeddings"], hidden],
                               stddev=p["initializer_range"])
            x = x + tf.gather(positions, tf.range(seq))[None]
            token_types = weight("token_type_embeddings", [p["type_vocab_size"], hidden],
                                 stddev=p["initializer_range"])
            x = x + tf.gather(token_types, features["segment_ids"])
            x = dropout(layer_norm(x, p), p["dropout_rate"], training)
        # 0 where a token is real, -10000 at padding: softmax gives padding no weight
        additive_mask = (1.0 - tf.cast(features["input_mask"][:, None, None, :], tf.float32)) * -10000.0
        x = tf.reshape(x, [batch * seq, hidden])  # (B*T, H): the dense layers take 2-D inputs
        with v1.variable_scope("encoder"):
            for i in range(p["num_hidden_layers"]):
                with v1.variable_scope(f"layer_{i}"):
                    x = encoder_layer(x, additive_mask, batch, seq, p, training)
        sequence = tf.reshape(x, [batch, seq, hidden])
        with v1.variable_scope("pooler"):
            pooled = dense(sequence[:, 0], hidden, "dense", p, tf.tanh)  # (B, H): the [CLS] token
    return sequence, pooled, table


def masked_lm_head(sequence: tf.Tensor, positions: tf.Tensor, table: tf.Tensor, p: Mapping) -> tf.Tensor:
    """(B, T, H) at positions (B, P) -> (B*P, V) float32 logits, the output projection tied to ``table``."""
    batch, predictions = positions.shape
    picked = tf.gather(sequence, positions, axis=1, batch_dims=1)  # (B, P, H): the masked positions only
    x = tf.reshape(picked, [batch * predictions, p["hidden_size"]])
    with v1.variable_scope("cls/predictions"):
        with v1.variable_scope("transform"):
            x = layer_norm(dense(x, p["hidden_size"], "dense", p, activation_fn(p["encoder_nonlinearity"])), p)
        logits = tf.matmul(x, table, transpose_b=True) + weight("output_bias", [p["vocab_size"]])  # (B*P, V)
    return tf.cast(logits, tf.float32)


def output_layer(x: tf.Tensor, classes: int, p: Mapping) -> tf.Tensor:
    """(B, H) -> (B, classes) float32: x @ output_weights^T + output_bias (weights stored (classes, H))."""
    w = weight("output_weights", [classes, p["hidden_size"]], stddev=p["initializer_range"])
    return tf.cast(tf.matmul(x, w, transpose_b=True) + weight("output_bias", [classes]), tf.float32)


def masked_lm_loss(mlm_logits: tf.Tensor, masked_lm_ids: tf.Tensor, masked_lm_weights: tf.Tensor) -> tf.Tensor:
    """The cross-entropy of (B*P, V) logits against ids (B, P), averaged with weights (B, P)
    (0 on padding predictions): sum(loss * w) / (sum(w) + 1e-5), as run_pretraining.py."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(masked_lm_ids, [-1]), logits=mlm_logits)
    weights = tf.reshape(masked_lm_weights, [-1])
    return tf.reduce_sum(losses * weights) / (tf.reduce_sum(weights) + 1e-5)


# --- the two tasks --------------------------------------------------------------------------

def pretraining_metrics(mlm_logits, masked_lm_ids, masked_lm_weights, nsp_logits=None, nsp_labels=None) -> dict:
    """host_call's fn: runs on the host over what the device computed."""
    ids = tf.reshape(masked_lm_ids, [-1])
    weights = tf.reshape(masked_lm_weights, [-1])
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=mlm_logits)
    mlm_loss = v1.metrics.mean(losses, weights=weights)
    metrics = {
        "masked_lm_accuracy": v1.metrics.accuracy(ids, tf.argmax(mlm_logits, -1, output_type=ids.dtype),
                                                  weights=weights),
        "masked_lm_loss": mlm_loss,
        "mlm_perplexity": (tf.exp(mlm_loss[0]), mlm_loss[1]),
    }
    if nsp_logits is not None:
        labels = tf.reshape(nsp_labels, [-1])
        metrics["nsp_accuracy"] = v1.metrics.accuracy(labels, tf.argmax(nsp_logits, -1, output_type=labels.dtype))
    return metrics


def classifier_metrics(labels: tf.Tensor, logits: tf.Tensor) -> dict:
    """host_call's fn: runs on the host over what the device computed."""
    return {"accuracy": v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=-1))}


def pretraining_fn(features: Mapping, labels: Mapping, mode: str, params: Mapping) -> EstimatorSpec:
    """features: input_ids, input_mask, segment_ids (B, T), masked_lm_positions (B, P);
    labels: masked_lm_ids, masked_lm_weights (B, P), next_sentence_labels (B, 1)."""
    p = params["model"]
    training = mode == ModeKeys.TRAIN
    sequence, pooled, table = bert_encoder(features, p, training)
    mlm_logits = masked_lm_head(sequence, features["masked_lm_positions"], table, p)  # (B*P, V)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"masked_lm_predictions": tf.reshape(
            tf.argmax(mlm_logits, -1), features["masked_lm_positions"].shape)})
    ids, weights = labels["masked_lm_ids"], labels["masked_lm_weights"]
    loss = masked_lm_loss(mlm_logits, ids, weights)
    host_args = [mlm_logits, ids, weights]
    if not p["disable_nsp"]:
        with v1.variable_scope("cls/seq_relationship"):
            nsp_logits = output_layer(pooled, 2, p)  # (B, 2); label 1: B is a random sentence
        nsp_labels = labels["next_sentence_labels"]
        loss = loss + tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(nsp_labels, [-1]), logits=nsp_logits))
        host_args += [nsp_logits, nsp_labels]
    if training:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(pretraining_metrics, host_args))


def classifier_fn(features: Mapping, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    """features: input_ids, input_mask, segment_ids (B, T); labels (B,): dropout and a dense
    layer on the pooled [CLS] output, as run_classifier.py's create_model."""
    p = params["model"]
    training = mode == ModeKeys.TRAIN
    _, pooled, _ = bert_encoder(features, p, training)
    logits = output_layer(dropout(pooled, p["dropout_rate"], training), p["num_classes"], p)  # (B, classes)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1),
                                                "probabilities": tf.nn.softmax(logits)})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if training:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(classifier_metrics, [labels, logits]))


# --- starting from a pretrained checkpoint ------------------------------------------------------

class FromCheckpoint:
    """A variable-scope custom getter: each variable the checkpoint holds starts from the
    checkpoint's value instead of its initializer (as Google's init_from_checkpoint, but for
    either framework's format: common/bert_names.py reads it in PyTorch's names and layout).
    The classifier's own layer always starts fresh. Each shape is checked as the variable is
    made, so a checkpoint of another model size stops the run in one line before training."""

    def __init__(self, path: str):
        self.path = path
        self.weights = read_bert_weights(path)  # {torch name: array in torch layout}
        self.expected: dict[str, tuple] = {}  # torch name -> shape, of the encoder variables made
        self.loaded = 0

    def __call__(self, getter, name, *args, shape=None, initializer=None, **kwargs):
        torch_name, transpose = bert_name(name)
        if torch_name is not None and not torch_name.startswith("classifier."):
            torch_shape = tuple(reversed(shape)) if transpose else tuple(shape)
            if torch_name.startswith("bert."):
                self.expected[torch_name] = torch_shape
            if torch_name in self.weights:
                value = self.weights[torch_name]
                check_compatible({torch_name: value}, {torch_name: torch_shape}, source=self.path)
                initializer = v1.constant_initializer(value.T if transpose else value)
                self.loaded += 1
        return getter(name, *args, shape=shape, initializer=initializer, **kwargs)

    def check(self) -> None:
        """After the model is built: the checkpoint's number of layers, and no encoder weight missing."""
        check_compatible(self.weights, self.expected, source=self.path)
        logger.info("%s: %d of this model's variables start from it; the rest (the new head) start fresh",
                    self.path, self.loaded)


def bert_name(name: str) -> tuple[str | None, bool]:
    """(torch name, transpose) of a BERT variable; (None, False) for any other (optimizer slots, the step)."""
    try:
        return tf_name_to_torch(name)
    except UserError:
        return None, False


def model_fn(features: Mapping, labels, mode: str, params: Mapping) -> EstimatorSpec:
    task_fn = pretraining_fn if params["model"]["task"] == "pretraining" else classifier_fn
    checkpoint = params["model"]["pretrained_checkpoint"]
    if mode != ModeKeys.TRAIN or not checkpoint:
        return task_fn(features, labels, mode, params)
    # training starts from the checkpoint; a checkpoint of model_dir, once written, restores over it
    start = FromCheckpoint(checkpoint)
    with v1.variable_scope(v1.get_variable_scope(), custom_getter=start):
        spec = task_fn(features, labels, mode, params)
    start.check()
    return spec
