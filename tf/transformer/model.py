"""The Transformer (Vaswani et al. 2017, "Attention Is All You Need"): an encoder-decoder
that maps a source sequence to a target sequence.

The same network, keys and defaults as pytorch/transformer, in TF1 ops:

    input_ids (B, S) -> embedding * sqrt(hidden_size) + sinusoid(position) -> dropout
      -> encoder_num_hidden_layers x [self-attention (source padding mask); ReLU FFN]   -> memory (B*S, H)
    decoder_input_ids (B, T) -> the same embedding * sqrt(hidden_size) + sinusoid -> dropout
      -> decoder_num_hidden_layers x [causal self-attention; cross-attention over memory
                                      (source padding mask); ReLU FFN]
      -> x @ embedding^T -> logits (B*T, V)

    each sublayer, post-LN as the paper: x = LayerNorm(x + dropout(sublayer(x)));
    pre_layer_norm: true gives x = x + dropout(sublayer(LayerNorm(x))) and a final LayerNorm
    after each stack (as tensor2tensor's later versions)

    loss = the label-smoothed (label_smoothing, 0.1 in the paper) cross entropy of each label,
           the mean over the positions decoder_attention_mask marks

One embedding table serves the source, the target and the output projection (the paper's
3.4, for a shared BPE vocabulary); ``share_embedding_weights: false`` gives the source, the
target and the output projection a weight each. Weights start as tensor2tensor's and
fairseq's: Xavier-uniform projections with zero biases, embeddings N(0, hidden_size^-0.5).

The variable names follow pytorch/transformer's module names (a torch ``a.0.b.weight`` is
``transformer/a_0/b/kernel`` here, transposed, and a LayerNorm's weight and bias are
``gamma`` and ``beta``), so that tests/tf/test_tf_transformer.py copies weights across:

    transformer/embedding (V, H); transformer/decoder_embedding, transformer/output_projection/kernel
                                                                    (only when not shared)
    transformer/encoder_layers_{i}/self_attn/{q_proj,k_proj,v_proj,out_proj}/{kernel,bias}
    transformer/encoder_layers_{i}/self_attn_norm/{gamma,beta}, .../ffn/{fc1,fc2}, .../ffn_norm
    transformer/decoder_layers_{i}/... the same, plus cross_attn and cross_attn_norm
    transformer/encoder_norm, transformer/decoder_norm              (only when pre_layer_norm)

``model_fn`` follows the Estimator contract (common/tf/estimator): TRAIN returns the loss
and train_op, EVAL the loss and, through ``host_call``, each position's plain loss and most
likely token (the host turns them into ``accuracy``, ``sequence_accuracy`` and
``lm_perplexity``, as pytorch/transformer's metrics); PREDICT decodes greedily (below).

For the device (the forms of tf/gpt2): dense layers on 2-D activations; the sinusoid table
is a numpy constant computed when the graph is built (the graph holds no sin or cos); the
causal mask is one (T, T) numpy constant broadcast over the batch and the heads; the source
padding mask is additive, (B, 1, 1, S), -1e9 on padding.

Greedy decoding (PREDICT, ``--mode predict``) runs on the CPU, as pytorch/transformer's
``greedy_decode``: the encoder once per batch, then a ``tf.while_loop`` over the target
positions that runs the decoder over the ids generated so far and appends each position's
most likely token, until every sequence has produced </s>. ``predictions_done`` (which
run.py hands to the runner, common/tf/run.py) writes predictions.txt and logs the greedy
exact match. The emulator refuses the PREDICT graph when it validates it (the loop's length
depends on the data; the device runs a static number of steps), naming the op and its line.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from common.data.text.seq2seq import read_seq2seq_meta
from common.errors import UserError
from common.io import atomic_open
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

logger = logging.getLogger("zoo")
v1 = tf.compat.v1

MASKED = -1.0e9  # the score of a masked key: exp() of it is 0 in float32 (and -inf in float16, also 0)


def compute_dtype() -> tf.DType:
    """The runner's Keras policy: float32, or the 16-bit format of mixed precision (fp32 variables)."""
    return tf.as_dtype(keras.mixed_precision.global_policy().compute_dtype)


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
    PE(pos, 2i+1) = cos(pos / 10000^(2i/d)). (pytorch/transformer/model.py's, deliberately
    copied: each folder stands alone.)"""
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, hidden_size, 2, dtype=np.float64) / hidden_size))  # (H/2,)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, H/2)
    table = np.empty((positions, hidden_size), dtype=np.float64)
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table.astype(np.float32)


# --- layers -----------------------------------------------------------------------------------


def variable(name: str, shape: list, initializer) -> tf.Tensor:
    """A float32 variable, read in the compute dtype."""
    return tf.cast(v1.get_variable(name, shape, tf.float32, initializer=initializer), compute_dtype())


def dense(x: tf.Tensor, units: int, name: str, bias: bool = True) -> tf.Tensor:
    """(N, in) -> (N, units): x @ kernel + bias, kernel (in, units) Xavier-uniform, bias 0."""
    with v1.variable_scope(name):
        y = tf.matmul(x, variable("kernel", [x.shape[-1], units], v1.glorot_uniform_initializer()))
        return y + variable("bias", [units], v1.zeros_initializer()) if bias else y


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


def attention(x: tf.Tensor, memory: tf.Tensor, shape: tuple[int, int, int], p: Mapping, training: bool,
              source_mask: tf.Tensor | None = None, causal: tf.Tensor | None = None) -> tf.Tensor:
    """(B*T, H) queries over (B*S, H) keys and values -> (B*T, H); shape (B, T, S). source_mask:
    additive (B, 1, 1, S); causal: a (T, S) bool constant, broadcast over the batch and the heads."""
    B, T, S = shape
    H, heads = p["hidden_size"], p["num_heads"]
    D = H // heads

    def split_heads(t, length):  # (B*L, H) -> (B, heads, L, D)
        return tf.transpose(tf.reshape(t, [B, length, heads, D]), [0, 2, 1, 3])

    q = split_heads(dense(x, H, "q_proj"), T)
    k = split_heads(dense(memory, H, "k_proj"), S)
    v = split_heads(dense(memory, H, "v_proj"), S)
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(D))  # (B, heads, T, S)
    if source_mask is not None:
        scores = scores + tf.cast(source_mask, scores.dtype)  # -1e9 on the source's padding
    if causal is not None:
        scores = tf.where(causal, scores, tf.constant(MASKED, scores.dtype))  # query t sees keys 0..t
    probs = dropout(tf.nn.softmax(scores), p["attention_dropout_rate"], training)
    context = tf.reshape(tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3]), [B * T, H])
    return dense(context, H, "out_proj")


def feed_forward(x: tf.Tensor, p: Mapping, training: bool) -> tf.Tensor:
    """(N, H) -> (N, H): fc1 (filter_size) -> ReLU -> dropout -> fc2."""
    h = dropout(tf.nn.relu(dense(x, p["filter_size"], "fc1")), p["relu_dropout_rate"], training)
    return dense(h, p["hidden_size"], "fc2")


def residual(x: tf.Tensor, name: str, fn, p: Mapping, training: bool) -> tf.Tensor:
    """One residual sublayer ``fn`` (its variables under ``name``) with its layer norm ``name``_norm:
    post-LN (the paper) LN(x + drop(fn(x))), or pre-LN x + drop(fn(LN(x)))."""
    if p["pre_layer_norm"]:
        h = layer_norm(x, p, f"{name}_norm")
        with v1.variable_scope(name):
            return x + dropout(fn(h), p["dropout_rate"], training)
    with v1.variable_scope(name):
        y = fn(x)
    return layer_norm(x + dropout(y, p["dropout_rate"], training), p, f"{name}_norm")


# --- the network ------------------------------------------------------------------------------


def embedding_tables(p: Mapping) -> tuple[tf.Tensor, tf.Tensor]:
    """(source table, target table), each (V, H) N(0, hidden_size^-0.5): one variable when shared."""
    V, H = p["vocab_size"], p["hidden_size"]
    init = v1.random_normal_initializer(stddev=H**-0.5)
    table = variable("embedding", [V, H], init)
    return table, table if p["share_embedding_weights"] else variable("decoder_embedding", [V, H], init)


def embed(table: tf.Tensor, ids: tf.Tensor, p: Mapping, positions: int, training: bool) -> tf.Tensor:
    """(B, L) -> (B*L, H): the paper's 3.4 and 3.5, the embedding scaled by sqrt(d_model) plus the sinusoid."""
    B, L = ids.shape
    if L > positions:
        raise UserError(f"a sequence of {L} tokens is longer than the {positions} positions the model was built "
                        f"for (the inputs' source_length and target_length)")
    x = tf.gather(table, ids) * math.sqrt(p["hidden_size"])  # (B, L, H)
    sinusoids = sinusoid_table(positions, p["hidden_size"])[:L]  # numpy: a constant of the graph
    x = x + tf.constant(sinusoids, dtype=x.dtype)[None]  # (1, L, H), broadcast over the batch
    x = dropout(x, p["dropout_rate"], training)
    return tf.reshape(x, [B * L, p["hidden_size"]])  # the dense layers take 2-D inputs


def encode(input_ids: tf.Tensor, attention_mask: tf.Tensor, p: Mapping, positions: int,
           training: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """(B, S) twice -> memory (B*S, H) and the additive source mask (B, 1, 1, S)."""
    B, S = input_ids.shape
    source_mask = (1.0 - tf.cast(attention_mask, tf.float32)[:, None, None, :]) * MASKED  # 0 on tokens
    source_table, _ = embedding_tables(p)
    x = embed(source_table, input_ids, p, positions, training)
    for i in range(p["encoder_num_hidden_layers"]):
        with v1.variable_scope(f"encoder_layers_{i}"):
            x = residual(x, "self_attn", lambda h: attention(h, h, (B, S, S), p, training, source_mask=source_mask),
                         p, training)
            x = residual(x, "ffn", lambda h: feed_forward(h, p, training), p, training)
    if p["pre_layer_norm"]:  # the stack's output is a sum of unnormalised residuals: one norm
        x = layer_norm(x, p, "encoder_norm")
    return x, source_mask


def decode(decoder_input_ids: tf.Tensor, memory: tf.Tensor, source_mask: tf.Tensor, p: Mapping, positions: int,
           training: bool) -> tf.Tensor:
    """(B, T) ids over memory (B*S, H) and the source mask (B, 1, 1, S) -> logits (B*T, V) float32."""
    B, T = decoder_input_ids.shape
    S = source_mask.shape[-1]
    source_table, target_table = embedding_tables(p)
    x = embed(target_table, decoder_input_ids, p, positions, training)
    # query t sees keys 0..t: one (T, T) constant of the graph for every layer, broadcast over the batch
    # and the heads (a (B, T, T) mask would be a batch-sized constant)
    causal = tf.constant(np.tril(np.ones((T, T), dtype=bool)), name="causal_mask")
    for i in range(p["decoder_num_hidden_layers"]):
        with v1.variable_scope(f"decoder_layers_{i}"):
            x = residual(x, "self_attn", lambda h: attention(h, h, (B, T, T), p, training, causal=causal),
                         p, training)
            x = residual(x, "cross_attn",
                         lambda h: attention(h, memory, (B, T, S), p, training, source_mask=source_mask),
                         p, training)
            x = residual(x, "ffn", lambda h: feed_forward(h, p, training), p, training)
    if p["pre_layer_norm"]:
        x = layer_norm(x, p, "decoder_norm")
    if p["share_embedding_weights"]:
        logits = tf.matmul(x, source_table, transpose_b=True)  # the output projection is the table (one variable)
    else:
        logits = dense(x, p["vocab_size"], "output_projection", bias=False)
    return tf.cast(logits, tf.float32)  # (B*T, V)


def transformer_logits(features: Mapping, p: Mapping, positions: int, training: bool) -> tf.Tensor:
    """The teacher-forced logits (B*T, V) float32 of a batch's features."""
    check_sizes(p)
    with v1.variable_scope("transformer", reuse=v1.AUTO_REUSE):
        memory, source_mask = encode(features["input_ids"], features["attention_mask"], p, positions, training)
        return decode(features["decoder_input_ids"], memory, source_mask, p, positions, training)


# --- the loss and the metrics -----------------------------------------------------------------


def token_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The plain cross entropy of each position's label: logits (B*T, V), labels (B, T) -> (B, T) float32."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(labels, [-1]), logits=logits)
    return tf.reshape(losses, labels.shape)


def smoothed_loss(logits: tf.Tensor, plain: tf.Tensor, decoder_attention_mask: tf.Tensor,
                  label_smoothing: float) -> tf.Tensor:
    """The label-smoothed cross entropy (as torch's: (1 - eps) on the label, eps spread evenly over
    the whole vocabulary, so each position's loss is (1 - eps) * CE + eps * mean_v(-log p_v)),
    the mean over the real target tokens (decoder_attention_mask 1); plain: token_losses (B, T)."""
    losses = plain
    if label_smoothing:
        uniform = -tf.reduce_mean(tf.nn.log_softmax(logits), axis=-1)  # (B*T,)
        losses = (1.0 - label_smoothing) * plain + label_smoothing * tf.reshape(uniform, plain.shape)
    weights = tf.cast(decoder_attention_mask, tf.float32)
    return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


def seq2seq_metrics(token_losses, predictions, labels, decoder_attention_mask) -> dict:
    """host_call's fn: runs on the host over what the device computed (each (B, T)), over the whole
    eval set: ``accuracy`` (teacher forced, per real target token), ``sequence_accuracy`` (examples
    whose every real target token is right: an upper bound of greedy exact match), ``lm_perplexity``
    (exp of the mean plain cross entropy of the real target tokens)."""
    weights = tf.cast(decoder_attention_mask, tf.float32)
    mean_loss = v1.metrics.mean(token_losses, weights=weights)
    right = tf.logical_or(tf.equal(predictions, labels), tf.equal(decoder_attention_mask, 0))
    return {
        "accuracy": v1.metrics.accuracy(labels, predictions, weights=weights),
        "sequence_accuracy": v1.metrics.mean(tf.cast(tf.reduce_all(right, axis=1), tf.float32)),
        "lm_perplexity": (tf.exp(mean_loss[0]), mean_loss[1]),
    }


# --- greedy decoding (PREDICT) ------------------------------------------------------------------


def greedy_decode(features: Mapping, p: Mapping, positions: int, start_id: int, eos_id: int,
                  pad_id: int) -> tf.Tensor:
    """(B, T) int32: the ids greedy decoding generates, pad after each sequence's </s>
    (pytorch/transformer's greedy_decode): the encoder once; then at position t the decoder over
    the ids so far (<s> and the tokens of positions < t), the most likely token at t appended."""
    check_sizes(p)
    B, T = features["decoder_input_ids"].shape
    with v1.variable_scope("transformer", reuse=v1.AUTO_REUSE):
        memory, source_mask = encode(features["input_ids"], features["attention_mask"], p, positions, False)
        columns = tf.range(T)[None, :]  # (1, T)

        def step(t, decoder_input, generated, done):
            logits = tf.reshape(decode(decoder_input, memory, source_mask, p, positions, False), [B, T, -1])
            token = tf.argmax(tf.gather(logits, t, axis=1), -1, output_type=tf.int32)  # (B,)
            token = tf.where(done, tf.fill([B], pad_id), token)
            generated = tf.where(tf.equal(columns, t), token[:, None], generated)
            decoder_input = tf.where(tf.equal(columns, t + 1), token[:, None], decoder_input)
            return t + 1, decoder_input, generated, tf.logical_or(done, tf.equal(token, eos_id))

        def not_done(t, decoder_input, generated, done):
            return tf.logical_and(t < T, tf.logical_not(tf.reduce_all(done)))

        pads = tf.fill([B, T], pad_id)
        start = tf.where(tf.equal(columns, 0), start_id, pads)  # <s>, then padding
        # position 0 outside the loop: it creates the decoder's variables, which the loop then reads
        state = step(tf.constant(0), start, pads, tf.zeros([B], tf.bool))
        _, _, generated, _ = tf.while_loop(not_done, step, state, maximum_iterations=T)
    return generated


def exact_matches(generated: np.ndarray, labels: np.ndarray, decoder_attention_mask: np.ndarray) -> np.ndarray:
    """(N,) bool: the generated ids equal the labels on every real target token, </s> included
    (greedy_decode pads what follows </s>, so nothing else can differ)."""
    return np.where(decoder_attention_mask.astype(bool), generated == labels, True).all(axis=1)


def predictions_done(arrays: Mapping[str, np.ndarray], params: Mapping, model_dir: str) -> dict[str, float]:
    """Greedy exact match over the predicted examples (logged), and model_dir/predictions.txt:
    one line per example, ``source -> generated`` decoded with the data's tokenizer.json, and
    the reference where the two differ (pytorch/transformer's predictions_done)."""
    from tokenizers import Tokenizer

    data_dir = params["eval_input"]["data_dir"]
    meta = read_seq2seq_meta(data_dir)
    matches = exact_matches(arrays["generated_ids"], arrays["labels"], arrays["decoder_attention_mask"])
    tokenizer = Tokenizer.from_file(os.path.join(data_dir, "tokenizer.json"))

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


# --- the Estimator's model_fn -------------------------------------------------------------------


def model_fn(features: Mapping, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    """features: input_ids, attention_mask (B, S), decoder_input_ids, decoder_attention_mask (B, T);
    labels: the target tokens (B, T) (in PREDICT, features["labels"]: data.py)."""
    p = params["model"]
    positions = max_length(params)
    if mode == ModeKeys.PREDICT:
        meta = read_seq2seq_meta(params["eval_input"]["data_dir"])
        generated = greedy_decode(features, p, positions, meta["decoder_start_id"], meta["eos_id"], meta["pad_id"])
        return EstimatorSpec(mode, predictions={
            "generated_ids": generated, "input_ids": features["input_ids"], "labels": features["labels"],
            "decoder_attention_mask": features["decoder_attention_mask"]})
    training = mode == ModeKeys.TRAIN
    logits = transformer_logits(features, p, positions, training)  # (B*T, V)
    decoder_attention_mask = features["decoder_attention_mask"]
    plain = token_losses(logits, labels)  # (B, T)
    loss = smoothed_loss(logits, plain, decoder_attention_mask, p["label_smoothing"])
    if training:  # no argmax over the vocab in a training step
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    predictions = tf.reshape(tf.argmax(logits, -1, output_type=labels.dtype), labels.shape)  # (B, T)
    return CSEstimatorSpec(mode, loss=loss,
                           host_call=(seq2seq_metrics, [plain, predictions, labels, decoder_attention_mask]))
