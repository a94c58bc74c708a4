"""GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): a
decoder-only language model trained to predict the next token.

The same network, keys and defaults as pytorch/gpt2, in TF1 ops:

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

The variable names are those common/gpt2_names.py maps to pytorch/gpt2's and Hugging
Face's, so that ``zoo convert`` reads and writes this folder's checkpoints:

    transformer/wte (V, H), transformer/wpe (max_position_embeddings, H)
    transformer/h_{i}/ln_1/{gamma,beta}, transformer/h_{i}/attn/c_attn/{kernel (H, 3H): q, k, v; bias}
    transformer/h_{i}/attn/c_proj, transformer/h_{i}/ln_2 (absent when parallel)
    transformer/h_{i}/mlp/c_fc, transformer/h_{i}/mlp/c_proj, transformer/ln_f
    lm_head/{kernel (H, V), bias}                                      (only when not shared)

``model_fn`` follows the Estimator contract (common/tf/estimator): TRAIN returns the loss
and train_op, EVAL the loss and, through ``host_call``, each position's loss and most likely
token (the host turns them into ``lm_perplexity`` and ``accuracy``, as pytorch/gpt2's
metrics), PREDICT each position's most likely next token.

For the device (the forms of the GPT block of tests/device/test_family_blocks_language_tf.py):
dense layers on 2-D activations; the causal mask is one (T, T) numpy constant shared by
every layer, broadcast over the batch and the heads (a (B, T, T) mask would be a
batch-sized constant); the rotary sin/cos tables are numpy constants computed when the
graph is built, so the graph holds no sin or cos.
"""

import logging
import math
import os
from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from common.data.text.lm import read_lm_meta
from common.data.text.prompts import write_completions
from common.data.text.tokenizer import read_gpt2
from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

v1 = tf.compat.v1
logger = logging.getLogger("zoo")

MASKED = -1.0e9  # the score of a key after the query: exp() of it is 0 in float32 and in 16-bit formats


def compute_dtype() -> tf.DType:
    """The runner's Keras policy: float32, or the 16-bit format of mixed precision (fp32 variables)."""
    return tf.as_dtype(keras.mixed_precision.global_policy().compute_dtype)


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


def weight(name: str, shape: list, stddev: float | None = None, init: float = 0.0) -> tf.Tensor:
    """A float32 variable (normal of ``stddev``, as GPT-2; else the constant ``init``), read in the compute dtype."""
    initializer = (v1.random_normal_initializer(stddev=stddev) if stddev is not None
                   else v1.constant_initializer(init))
    variable = v1.get_variable(name, shape, tf.float32, initializer=initializer)
    return tf.cast(variable, compute_dtype())


def dense(x: tf.Tensor, units: int, name: str, stddev: float) -> tf.Tensor:
    """(N, in) -> (N, units): x @ kernel + bias, kernel (in, units) N(0, stddev), bias 0."""
    with v1.variable_scope(name):
        return tf.matmul(x, weight("kernel", [x.shape[-1], units], stddev)) + weight("bias", [units])


def layer_norm(x: tf.Tensor, p: Mapping, name: str) -> tf.Tensor:
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


NONLINEARITIES = {"gelu_new": lambda x: tf.nn.gelu(x, approximate=True),
                  "gelu": lambda x: tf.nn.gelu(x, approximate=False), "relu": tf.nn.relu}


def rotary_tables(positions: int, rotary_dim: int) -> np.ndarray:
    """(2, positions, rotary_dim) float32: cos and sin of each position's angle for each dim
    pair, repeated for both dims of the pair (GPT-J's create_sinusoidal_positions, then
    repeat_interleave): dims 2i and 2i+1 turn by position / 10000^(2i / rotary_dim).
    (pytorch/gpt2/model.py's, deliberately copied: each folder stands alone.)"""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))  # (R/2,)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, R/2)
    angles = np.repeat(angles, 2, axis=1)  # (P, R): the pair's two dims share the angle
    return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


def rotate_every_two(x: tf.Tensor) -> tf.Tensor:
    """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) over the last axis (R even)."""
    *outer, R = x.shape.as_list()
    pairs = tf.reshape(x, outer + [R // 2, 2])  # (..., R/2, 2)
    turned = tf.concat([-pairs[..., 1:], pairs[..., :1]], axis=-1)
    return tf.reshape(turned, outer + [R])


def rotate(t: tf.Tensor, tables: np.ndarray) -> tf.Tensor:
    """(B, heads, T, D): the first R dims of each head turned by their position's angle; tables (2, T, R)."""
    R = tables.shape[-1]
    cos, sin = (tf.constant(table, dtype=t.dtype) for table in tables)  # (T, R) each, broadcast
    part = t[..., :R]
    turned = part * cos + rotate_every_two(part) * sin
    return tf.concat([turned, t[..., R:]], axis=-1) if R < t.shape[-1] else turned


def rows(batch: int | None, seq: int) -> int:
    """B*T, or -1 where the batch size is known only when the graph runs (predict's last batch of prompts)."""
    return -1 if batch is None else batch * seq


def attention(x: tf.Tensor, causal: tf.Tensor, batch: int, seq: int, p: Mapping, training: bool) -> tf.Tensor:
    """(B*T, H) -> (B*T, H): causal multi-head self-attention, then c_proj and dropout; causal (T, T) bool."""
    heads, hidden = p["num_heads"], p["hidden_size"]
    size = hidden // heads
    std = p["initializer_range"]
    qkv = dense(x, 3 * hidden, "c_attn", std)  # (B*T, 3H): q, k, v

    def split_heads(t):  # (B*T, H) -> (B, heads, T, size)
        return tf.transpose(tf.reshape(t, [-1 if batch is None else batch, seq, heads, size]), [0, 2, 1, 3])

    q, k, v = (split_heads(qkv[:, i * hidden:(i + 1) * hidden]) for i in range(3))
    if p["position_embedding_type"] == "rotary":
        tables = rotary_tables(seq, p["rotary_dim"] or size)  # (2, T, R): numpy, a constant of the graph
        q, k = rotate(q, tables), rotate(k, tables)
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(size))  # (B, heads, T, T)
    scores = tf.where(causal, scores, tf.constant(MASKED, scores.dtype))  # (T, T) broadcast over B and heads
    probs = dropout(tf.nn.softmax(scores), p["attention_dropout_rate"], training)
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [rows(batch, seq), hidden])
    # into the residual stream: N(0, std / sqrt(2 layers)), GPT-2's scaling
    out = dense(context, hidden, "c_proj", std / math.sqrt(2 * p["num_hidden_layers"]))
    return dropout(out, p["dropout_rate"], training)


def mlp(x: tf.Tensor, p: Mapping, training: bool) -> tf.Tensor:
    """(B*T, H) -> (B*T, H): c_fc (filter_size) -> nonlinearity -> c_proj -> dropout."""
    std = p["initializer_range"]
    h = NONLINEARITIES[p["nonlinearity"]](dense(x, p["filter_size"], "c_fc", std))
    out = dense(h, p["hidden_size"], "c_proj", std / math.sqrt(2 * p["num_hidden_layers"]))
    return dropout(out, p["dropout_rate"], training)


def block(x: tf.Tensor, causal: tf.Tensor, batch: int, seq: int, p: Mapping, training: bool) -> tf.Tensor:
    """(B*T, H) -> (B*T, H), pre-LN."""
    if p["use_parallel_attention"]:  # GPT-J: attention and MLP read the same normalised input
        h = layer_norm(x, p, "ln_1")
        with v1.variable_scope("attn"):
            a = attention(h, causal, batch, seq, p, training)
        with v1.variable_scope("mlp"):
            return x + a + mlp(h, p, training)
    h = layer_norm(x, p, "ln_1")
    with v1.variable_scope("attn"):
        x = x + attention(h, causal, batch, seq, p, training)
    h = layer_norm(x, p, "ln_2")
    with v1.variable_scope("mlp"):
        return x + mlp(h, p, training)


def gpt2_logits(input_ids: tf.Tensor, p: Mapping, training: bool) -> tf.Tensor:
    """input_ids (B, T) -> logits (B*T, V) float32."""
    check_sizes(p)
    batch, seq = input_ids.shape
    hidden, std = p["hidden_size"], p["initializer_range"]
    if seq > p["max_position_embeddings"]:
        raise UserError(f"the input's sequences have {seq} tokens, more than model.max_position_embeddings "
                        f"{p['max_position_embeddings']}")
    with v1.variable_scope("transformer"):
        wte = weight("wte", [p["vocab_size"], hidden], std)
        x = tf.gather(wte, input_ids)  # (B, T, H)
        if p["position_embedding_type"] == "learned":
            wpe = weight("wpe", [p["max_position_embeddings"], hidden], std)
            x = x + tf.gather(wpe, tf.range(seq))[None]  # (1, T, H), broadcast
        x = dropout(x, p["embedding_dropout_rate"], training)
        x = tf.reshape(x, [rows(batch, seq), hidden])  # (B*T, H): the dense layers take 2-D inputs
        # query t sees keys 0..t: one (T, T) constant of the graph for every layer, broadcast over the
        # batch and the heads (a (B, T, T) mask would be a batch-sized constant; a mask computed in the
        # graph, e.g. band_part of ones, would be folded once per layer by the capture)
        causal = tf.constant(np.tril(np.ones((seq, seq), dtype=bool)), name="causal_mask")
        for i in range(p["num_hidden_layers"]):
            with v1.variable_scope(f"h_{i}"):
                x = block(x, causal, batch, seq, p, training)
        x = layer_norm(x, p, "ln_f")
    if p["share_embedding_weights"]:
        logits = tf.matmul(x, wte, transpose_b=True)  # the output embedding is the input one (one variable)
    else:
        logits = dense(x, p["vocab_size"], "lm_head", std)
    return tf.cast(logits, tf.float32)  # (B*T, V)


def token_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The cross entropy of each position's label: logits (B*T, V), labels (B, T) -> (B, T) float32."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(labels, [-1]), logits=logits)
    return tf.reshape(losses, labels.shape)


def lm_loss(losses: tf.Tensor, attention_mask: tf.Tensor) -> tf.Tensor:
    """The mean over the real labels (attention_mask 1); every packed window holds at least one."""
    weights = tf.cast(attention_mask, tf.float32)
    return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


def lm_metrics(token_losses, predictions, labels, attention_mask) -> dict:
    """host_call's fn: runs on the host over what the device computed (each (B, T))."""
    weights = tf.cast(attention_mask, tf.float32)
    mean_loss = v1.metrics.mean(token_losses, weights=weights)  # over every real label of the eval set
    return {
        "lm_perplexity": (tf.exp(mean_loss[0]), mean_loss[1]),
        "accuracy": v1.metrics.accuracy(labels, predictions, weights=weights),
    }


def greedy_decode(tokens: tf.Tensor, prompt_length: tf.Tensor, p: Mapping, max_new_tokens: int) -> tf.Tensor:
    """tokens (B, L) int32, each prompt left-aligned (common/data/text/prompts.py); prompt_length (B,).
    max_new_tokens greedy steps in a tf.while_loop: token t + 1 of each row = the argmax of its
    logits at t. Each step runs the whole (B, L) sequence (no cache of keys and values); the
    causal mask keeps the padding behind a prompt out of its logits. The first step, outside
    the loop, creates the variables the loop's steps reuse."""
    length, vocab = tokens.shape[1], p["vocab_size"]
    row_ids = tf.range(tf.shape(tokens)[0])

    def step(i, tokens):
        logits = tf.reshape(gpt2_logits(tokens, p, training=False), [-1, length, vocab])  # (B, L, V)
        last = prompt_length - 1 + i  # (B,) each row's newest token
        new = tf.argmax(tf.gather(logits, last, batch_dims=1), -1, output_type=tokens.dtype)  # (B,)
        return tf.tensor_scatter_nd_update(tokens, tf.stack([row_ids, last + 1], axis=1), new)

    tokens = step(tf.constant(0, prompt_length.dtype), tokens)
    if max_new_tokens == 1:
        return tokens
    with v1.variable_scope(v1.get_variable_scope(), reuse=True):
        _, tokens = tf.while_loop(lambda i, _: i < max_new_tokens, lambda i, t: (i + 1, step(i, t)),
                                  (tf.constant(1, prompt_length.dtype), tokens))
    return tokens


def predictions_done(arrays: Mapping[str, np.ndarray], params: Mapping, model_dir: str) -> dict[str, float]:
    """After a predict from a prompt file: model_dir/completions.jsonl, each prompt's line, text
    and completion (cut at <|endoftext|>), as pytorch/gpt2 writes it."""
    predict_input = params["predict_input"]
    if predict_input["prompt_file"] is None:
        return {}
    data_dir = params["eval_input"]["data_dir"]
    tokenizer = read_gpt2(os.path.join(data_dir, "encoder.json"), os.path.join(data_dir, "vocab.bpe"))
    path = os.path.join(model_dir, "completions.jsonl")
    count = write_completions(path, predict_input["prompt_file"], tokenizer, arrays["tokens"], arrays["prompt_length"],
                              predict_input["max_new_tokens"], read_lm_meta(data_dir)["eot_id"])
    logger.info("greedy decoding: %d completions of up to %d tokens in %s", count, predict_input["max_new_tokens"],
                path)
    return {}


def model_fn(features: Mapping, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    """features: input_ids, attention_mask (B, T); labels: the next tokens (B, T). In predict
    from a prompt file (data.py): tokens (B, L) and prompt_length (B,), decoded greedily."""
    p = params["model"]
    training = mode == ModeKeys.TRAIN
    if mode == ModeKeys.PREDICT and "prompt_length" in features:
        tokens = greedy_decode(features["tokens"], features["prompt_length"], p,
                               params["predict_input"]["max_new_tokens"])
        return EstimatorSpec(mode, predictions={"tokens": tokens, "prompt_length": features["prompt_length"]})
    input_ids = features["input_ids"]
    logits = gpt2_logits(input_ids, p, training)  # (B*T, V)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"predictions": tf.reshape(
            tf.argmax(logits, -1, output_type=input_ids.dtype), input_ids.shape)})
    attention_mask = features["attention_mask"]
    losses = token_losses(logits, labels)  # (B, T)
    loss = lm_loss(losses, attention_mask)
    if training:  # no argmax over the vocab in a training step
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    predictions = tf.reshape(tf.argmax(logits, -1, output_type=labels.dtype), labels.shape)  # (B, T)
    return CSEstimatorSpec(mode, loss=loss, host_call=(lm_metrics, [losses, predictions, labels, attention_mask]))
