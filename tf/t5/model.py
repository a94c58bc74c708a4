"""T5 (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer"): an encoder-decoder pretrained by span corruption.

The network is Hugging Face's T5 v1.0 (``T5ForConditionalGeneration``, feed_forward_proj
"relu"), with the same keys and defaults as pytorch/t5, in TF1 ops:

    input_ids (B, S) -> shared embedding -> dropout
      -> num_layers x [x + dropout(SelfAttention(rms(x), bias_enc)); x + dropout(ffn(rms(x)))]
      -> final rms norm -> dropout                                          -> memory (B*S, d_model)
    decoder_input_ids (B, T) -> the same embedding -> dropout
      -> num_decoder_layers x [x + dropout(SelfAttention(rms(x), bias_dec, causal));
                               x + dropout(EncDecAttention(rms(x), memory, source padding));
                               x + dropout(ffn(rms(x)))]
      -> final rms norm -> dropout -> * d_model^-0.5 -> @ shared^T          -> logits (B*T, V)

    rms(x) = weight * x / sqrt(mean(x^2) + layer_norm_epsilon)   (T5LayerNorm: no mean, no bias)
    attention: q k v o without biases, heads of d_kv, scores q.k^T with NO 1/sqrt(d_kv) (T5 folds
               it into the initialisation of q), + the relative position bias, softmax, dropout
    ffn: relu: wo(dropout(relu(wi(x))));  gated-gelu: wo(dropout(gelu_tanh(wi_0(x)) * wi_1(x)))

    loss = the mean cross entropy over the labels decoder_attention_mask marks

Relative position bias: a table (relative_attention_num_buckets, num_heads) in layer 0 of
each stack; every layer of the stack adds the same (1, heads, Q, K) bias to its
self-attention scores (the cross-attention has none). Which bucket a (query, key) pair
falls in depends on the lengths alone (``relative_position_buckets``: bidirectional in the
encoder, causal in the decoder, exact up to num_buckets/4 (/2 causal) positions, then
logarithmic up to relative_attention_max_distance), so it is a numpy constant of the graph
and the graph holds only a gather of the table. The source padding mask is added to the
encoder's bias and to the cross-attention's scores as (B, 1, 1, S); the decoder's causal
mask is one (T, T) constant, broadcast over the batch and the heads. The decoder's own
padding needs no mask: it is right padding under a causal mask, so it reaches only padded
positions, which the loss leaves out.

Variable names mirror Hugging Face's module tree, so a name mapping is mechanical
("/" -> ".", ``block_i`` -> ``block.i``, ``layer_j`` -> ``layer.j``, ``kernel`` -> the
``weight`` transposed ((in, out) here, (out, in) in torch), ``embedding`` -> ``weight``):

    shared/embedding (V, d)                                            shared.weight
    encoder/block_{i}/layer_0/SelfAttention/{q,k,v,o}/kernel           encoder.block.i.layer.0.SelfAttention.q.weight ...
    encoder/block_0/layer_0/SelfAttention/relative_attention_bias/embedding (buckets, heads)
    encoder/block_{i}/layer_0/layer_norm/weight (d,)
    encoder/block_{i}/layer_1/DenseReluDense/{wi,wo}/kernel            (gated-gelu: wi_0, wi_1, wo)
    encoder/block_{i}/layer_1/layer_norm/weight, encoder/final_layer_norm/weight
    decoder/block_{i}/layer_0/SelfAttention/..., decoder/block_0/layer_0/SelfAttention/relative_attention_bias/embedding
    decoder/block_{i}/layer_1/EncDecAttention/{q,k,v,o}/kernel, decoder/block_{i}/layer_1/layer_norm/weight
    decoder/block_{i}/layer_2/DenseReluDense/..., decoder/block_{i}/layer_2/layer_norm/weight
    decoder/final_layer_norm/weight
    lm_head/kernel (d, V)                                              (only when tie_word_embeddings is false)

Initialisation as Hugging Face's ``T5PreTrainedModel._init_weights`` (factor 1): shared
N(0, 1); q N(0, (d_model d_kv)^-0.5), k and v N(0, d_model^-0.5), o N(0, (heads d_kv)^-0.5);
wi N(0, d_model^-0.5), wo N(0, d_ff^-0.5); the bias tables N(0, d_model^-0.5); norms 1.

``model_fn`` follows the Estimator contract (common/tf/estimator): TRAIN returns the loss
and train_op; EVAL the loss and, through ``host_call``, each label's loss and most likely
token under teacher forcing (the host turns them into ``accuracy`` and ``lm_perplexity``);
PREDICT greedy decoding (``greedy_decode``): the encoder once, then the decoder once per
target position in a tf.while_loop, each position's most likely token fed back, starting
from decoder_start_id (pad, 0) and padding after </s>, until every sequence has ended.
"""

import json
import math
import os
from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

v1 = tf.compat.v1

MASKED = -1.0e9  # a score that softmax turns into 0, in float32 and in 16-bit formats
FIELDS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


def compute_dtype() -> tf.DType:
    """The runner's Keras policy: float32, or the 16-bit format of mixed precision (fp32 variables)."""
    return tf.as_dtype(keras.mixed_precision.global_policy().compute_dtype)


def check_sizes(p: Mapping) -> None:
    if p["relative_attention_num_buckets"] < 4:
        raise UserError(f"model.relative_attention_num_buckets {p['relative_attention_num_buckets']}: needs at "
                        f"least 4 (half of them exact, half logarithmic, per direction)")
    if p["relative_attention_max_distance"] * 2 <= p["relative_attention_num_buckets"]:
        # the decoder's causal buckets are exact below num_buckets / 2: the logarithmic ones need a longer reach
        raise UserError(f"model.relative_attention_max_distance {p['relative_attention_max_distance']}: must be "
                        f"more than half of model.relative_attention_num_buckets "
                        f"{p['relative_attention_num_buckets']} (the decoder's exact buckets)")


# --- relative positions: numpy, when the graph is built ----------------------------------------

def relative_position_buckets(query_length: int, key_length: int, bidirectional: bool, num_buckets: int,
                              max_distance: int) -> np.ndarray:
    """(Q, K) int32: the bucket of key k seen from query q, Hugging Face's
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
    return (buckets + np.where(is_small, distance, large)).astype(np.int32)


# --- layers ------------------------------------------------------------------------------------

def weight(name: str, shape: list, stddev: float | None = None) -> tf.Tensor:
    """A float32 variable (normal of ``stddev``, or ones when None), read in the compute dtype."""
    initializer = v1.random_normal_initializer(stddev=stddev) if stddev is not None else v1.ones_initializer()
    return tf.cast(v1.get_variable(name, shape, tf.float32, initializer=initializer), compute_dtype())


def dense(x: tf.Tensor, units: int, name: str, stddev: float) -> tf.Tensor:
    """(N, in) -> (N, units): x @ kernel, kernel (in, units), no bias (T5 has none)."""
    with v1.variable_scope(name):
        return tf.matmul(x, weight("kernel", [x.shape[-1], units], stddev))


def rms_norm(x: tf.Tensor, p: Mapping, name: str) -> tf.Tensor:
    """T5LayerNorm over the last axis: x / sqrt(mean(x^2) + eps) * weight, the variance in
    float32 (as Hugging Face), back to x's dtype."""
    with v1.variable_scope(name):
        scale = v1.get_variable("weight", [x.shape[-1]], tf.float32, initializer=v1.ones_initializer())
        x32 = tf.cast(x, tf.float32)
        variance = tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True)
        y = x32 * tf.math.rsqrt(variance + p["layer_norm_epsilon"]) * scale
    return tf.cast(y, x.dtype)


def dropout(x: tf.Tensor, rate: float, training: bool) -> tf.Tensor:
    return tf.nn.dropout(x, rate=rate) if training and rate > 0 else x


def position_bias(query_length: int, key_length: int, bidirectional: bool, p: Mapping) -> tf.Tensor:
    """(1, heads, Q, K): layer 0's relative_attention_bias table gathered at the constant buckets."""
    buckets = relative_position_buckets(query_length, key_length, bidirectional,
                                        p["relative_attention_num_buckets"], p["relative_attention_max_distance"])
    with v1.variable_scope("relative_attention_bias"):
        table = weight("embedding", [p["relative_attention_num_buckets"], p["num_heads"]], p["d_model"] ** -0.5)
    bias = tf.gather(table, tf.constant(buckets, name="relative_position_buckets"))  # (Q, K, heads)
    return tf.transpose(bias, [2, 0, 1])[None]


def attention(x: tf.Tensor, kv: tf.Tensor, bias: tf.Tensor, causal: tf.Tensor | None, batch: int, q_len: int,
              kv_len: int, p: Mapping, training: bool) -> tf.Tensor:
    """x (B*Q, d), kv (B*K, d) -> (B*Q, d): q from x, k and v from kv, scores + bias
    (broadcast to (B, heads, Q, K)), the causal (Q, K) mask where given, no score scaling."""
    heads, d_kv, d_model = p["num_heads"], p["d_kv"], p["d_model"]
    inner = heads * d_kv
    q = dense(x, inner, "q", (d_model * d_kv) ** -0.5)
    k = dense(kv, inner, "k", d_model ** -0.5)
    v = dense(kv, inner, "v", d_model ** -0.5)

    def split_heads(t, length):  # (B*L, heads*d_kv) -> (B, heads, L, d_kv)
        return tf.transpose(tf.reshape(t, [batch, length, heads, d_kv]), [0, 2, 1, 3])

    q, k, v = split_heads(q, q_len), split_heads(k, kv_len), split_heads(v, kv_len)
    scores = tf.matmul(q, k, transpose_b=True) + bias  # (B, heads, Q, K)
    if causal is not None:
        scores = tf.where(causal, scores, tf.constant(MASKED, scores.dtype))
    probs = dropout(tf.nn.softmax(tf.cast(scores, tf.float32)), p["dropout_rate"], training)  # softmax in float32
    context = tf.matmul(tf.cast(probs, v.dtype), v)  # (B, heads, Q, d_kv)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [batch * q_len, inner])
    return dense(context, d_model, "o", inner ** -0.5)


def feed_forward(x: tf.Tensor, p: Mapping, training: bool) -> tf.Tensor:
    """(N, d) -> (N, d): DenseReluDense (relu) or DenseGatedActDense (gated-gelu)."""
    d_model, d_ff = p["d_model"], p["d_ff"]
    with v1.variable_scope("DenseReluDense"):
        if p["feed_forward_proj"] == "relu":
            h = tf.nn.relu(dense(x, d_ff, "wi", d_model ** -0.5))
        else:  # gated-gelu: gelu_new (the tanh form), as T5 v1.1
            h = tf.nn.gelu(dense(x, d_ff, "wi_0", d_model ** -0.5), approximate=True) * dense(x, d_ff, "wi_1",
                                                                                           d_model ** -0.5)
        return dense(dropout(h, p["dropout_rate"], training), d_model, "wo", d_ff ** -0.5)


def sublayer(x: tf.Tensor, name: str, p: Mapping, training: bool, body) -> tf.Tensor:
    """x + dropout(body(rms(x))) in variable scope ``name`` (layer_j), pre-norm."""
    with v1.variable_scope(name):
        return x + dropout(body(rms_norm(x, p, "layer_norm")), p["dropout_rate"], training)


def source_mask(attention_mask: tf.Tensor) -> tf.Tensor:
    """(B, S) 1/0 -> (B, 1, 1, S) additive: 0 on real source tokens, MASKED on padding."""
    return ((1.0 - tf.cast(attention_mask, tf.float32)) * MASKED)[:, None, None, :]


def encoder(input_ids: tf.Tensor, attention_mask: tf.Tensor, shared: tf.Tensor, p: Mapping,
            training: bool) -> tf.Tensor:
    """input_ids, attention_mask (B, S) -> memory (B*S, d_model)."""
    batch, seq = input_ids.shape
    x = dropout(tf.gather(shared, input_ids), p["dropout_rate"], training)  # (B, S, d)
    x = tf.reshape(x, [batch * seq, p["d_model"]])  # the dense layers take 2-D inputs
    with v1.variable_scope("encoder"):
        for i in range(p["num_layers"]):
            with v1.variable_scope(f"block_{i}"):
                if i == 0:  # layer 0 holds the table; later layers reuse its bias (and the mask in it)
                    with v1.variable_scope("layer_0/SelfAttention"):
                        bias = position_bias(seq, seq, True, p) + tf.cast(source_mask(attention_mask), x.dtype)

                def self_attention(h):
                    with v1.variable_scope("SelfAttention"):
                        return attention(h, h, bias, None, batch, seq, seq, p, training)

                x = sublayer(x, "layer_0", p, training, self_attention)
                x = sublayer(x, "layer_1", p, training, lambda h: feed_forward(h, p, training))
        return dropout(rms_norm(x, p, "final_layer_norm"), p["dropout_rate"], training)


def decoder_logits(decoder_input_ids: tf.Tensor, memory: tf.Tensor, attention_mask: tf.Tensor,
                   shared: tf.Tensor, p: Mapping, training: bool) -> tf.Tensor:
    """decoder_input_ids (B, T), memory (B*S, d), attention_mask (B, S) -> logits (B*T, V) float32."""
    batch, seq = decoder_input_ids.shape
    source_length = attention_mask.shape[1]
    x = dropout(tf.gather(shared, decoder_input_ids), p["dropout_rate"], training)
    x = tf.reshape(x, [batch * seq, p["d_model"]])
    cross_mask = tf.cast(source_mask(attention_mask), x.dtype)  # (B, 1, 1, S)
    # query t sees keys 0..t: one (T, T) constant for every layer, broadcast over the batch and the heads
    causal = tf.constant(np.tril(np.ones((seq, seq), dtype=bool)), name="causal_mask")
    with v1.variable_scope("decoder"):
        for i in range(p["num_decoder_layers"]):
            with v1.variable_scope(f"block_{i}"):
                if i == 0:
                    with v1.variable_scope("layer_0/SelfAttention"):
                        bias = position_bias(seq, seq, False, p)  # (1, heads, T, T)

                def self_attention(h):
                    with v1.variable_scope("SelfAttention"):
                        return attention(h, h, bias, causal, batch, seq, seq, p, training)

                def cross_attention(h):
                    with v1.variable_scope("EncDecAttention"):
                        return attention(h, memory, cross_mask, None, batch, seq, source_length, p, training)

                x = sublayer(x, "layer_0", p, training, self_attention)
                x = sublayer(x, "layer_1", p, training, cross_attention)
                x = sublayer(x, "layer_2", p, training, lambda h: feed_forward(h, p, training))
        x = dropout(rms_norm(x, p, "final_layer_norm"), p["dropout_rate"], training)
    if p["tie_word_embeddings"]:
        # the head is the embedding table; Hugging Face rescales the output first
        logits = tf.matmul(x * (p["d_model"] ** -0.5), shared, transpose_b=True)
    else:
        logits = dense(x, p["vocab_size"], "lm_head", 1.0)
    return tf.cast(logits, tf.float32)  # (B*T, V)


def shared_embedding(p: Mapping) -> tf.Tensor:
    with v1.variable_scope("shared"):
        return weight("embedding", [p["vocab_size"], p["d_model"]], 1.0)


def t5_logits(features: Mapping, p: Mapping, training: bool) -> tf.Tensor:
    """features: input_ids, attention_mask (B, S), decoder_input_ids (B, T) -> logits (B*T, V) float32."""
    check_sizes(p)
    shared = shared_embedding(p)
    memory = encoder(features["input_ids"], features["attention_mask"], shared, p, training)
    return decoder_logits(features["decoder_input_ids"], memory, features["attention_mask"], shared, p, training)


# --- greedy decoding (PREDICT) -----------------------------------------------------------------

def read_meta(data_dir: str) -> dict:
    """data_dir's meta.json (datasets/prepare_seq2seq.py's; data.py has checked it)."""
    with open(os.path.join(data_dir, "meta.json")) as f:
        return json.load(f)


def greedy_decode(input_ids: tf.Tensor, attention_mask: tf.Tensor, target_length: int, p: Mapping,
                  start_id: int, eos_id: int, pad_id: int) -> tf.Tensor:
    """(B, S) -> generated ids (B, T) int32: position t is the most likely token given the
    source and the tokens generated before it; after </s>, pad."""
    batch = input_ids.shape[0]
    shared = shared_embedding(p)
    memory = encoder(input_ids, attention_mask, shared, p, training=False)
    positions = tf.range(target_length)[None, :]  # (1, T)

    def step(t, decoder_ids, generated, done):
        """Decode position t of every sequence from decoder_ids (positions 0..t filled)."""
        with v1.variable_scope(v1.get_variable_scope(), reuse=v1.AUTO_REUSE):
            logits = tf.reshape(decoder_logits(decoder_ids, memory, attention_mask, shared, p, training=False),
                                [batch, target_length, -1])
        token = tf.argmax(tf.gather(logits, t, axis=1), axis=-1, output_type=tf.int32)  # (B,)
        token = tf.where(done, tf.fill([batch], pad_id), token)
        generated = tf.where(tf.equal(positions, t), token[:, None], generated)
        decoder_ids = tf.where(tf.equal(positions, t + 1), token[:, None], decoder_ids)
        return t + 1, decoder_ids, generated, done | tf.equal(token, eos_id)

    start = tf.concat([tf.fill([batch, 1], start_id), tf.fill([batch, target_length - 1], pad_id)], axis=1)
    pads = tf.fill([batch, target_length], pad_id)
    # position 0 outside the loop: it creates the decoder's variables (a loop body may only reuse them)
    state = step(tf.constant(0), start, pads, tf.zeros([batch], tf.bool))
    _, _, generated, _ = tf.while_loop(
        lambda t, ids, generated, done: tf.logical_and(t < target_length, tf.logical_not(tf.reduce_all(done))),
        step, state, shape_invariants=tuple(tf.TensorShape(s.shape) for s in state))
    return generated


# --- loss and metrics --------------------------------------------------------------------------

def token_losses(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The cross entropy of each label: logits (B*T, V), labels (B, T) -> (B, T) float32."""
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(labels, [-1]), logits=logits)
    return tf.reshape(losses, labels.shape)


def masked_mean(losses: tf.Tensor, decoder_attention_mask: tf.Tensor) -> tf.Tensor:
    """The mean over the real labels (every example has at least its </s>)."""
    weights = tf.cast(decoder_attention_mask, tf.float32)
    return tf.reduce_sum(losses * weights) / tf.reduce_sum(weights)


def seq2seq_metrics(token_losses, predictions, labels, decoder_attention_mask) -> dict:
    """host_call's fn: runs on the host over what the device computed (each (B, T))."""
    weights = tf.cast(decoder_attention_mask, tf.float32)
    mean_loss = v1.metrics.mean(token_losses, weights=weights)  # over every real label of the eval set
    return {
        "lm_perplexity": (tf.exp(mean_loss[0]), mean_loss[1]),
        "accuracy": v1.metrics.accuracy(labels, predictions, weights=weights),
    }


def model_fn(features: Mapping, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    """features: input_ids, attention_mask (B, S), decoder_input_ids, decoder_attention_mask (B, T)
    (and in PREDICT the labels, for the predictions file); labels (B, T)."""
    p = params["model"]
    training = mode == ModeKeys.TRAIN
    if mode == ModeKeys.PREDICT:
        check_sizes(p)
        meta = read_meta(params["eval_input"]["data_dir"])  # the data's start, end and pad ids
        generated = greedy_decode(features["input_ids"], features["attention_mask"],
                                  features["decoder_input_ids"].shape[1], p, meta["decoder_start_id"],
                                  meta["eos_id"], meta["pad_id"])
        return EstimatorSpec(mode, predictions={
            "generated_ids": generated, "input_ids": features["input_ids"], "labels": features["labels"],
            "decoder_attention_mask": features["decoder_attention_mask"]})
    logits = t5_logits(features, p, training)  # (B*T, V)
    losses = token_losses(logits, labels)  # (B, T)
    loss = masked_mean(losses, features["decoder_attention_mask"])
    if training:  # no argmax over the vocab in a training step
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    predictions = tf.reshape(tf.argmax(logits, -1, output_type=labels.dtype), labels.shape)  # (B, T)
    return CSEstimatorSpec(mode, loss=loss, host_call=(seq2seq_metrics, [losses, predictions, labels,
                                                                         features["decoder_attention_mask"]]))


# --- the predictions file ------------------------------------------------------------------------

def exact_matches(generated: np.ndarray, labels: np.ndarray, decoder_attention_mask: np.ndarray) -> np.ndarray:
    """(N,) bool: the generated ids equal the labels on every real target token, </s> included
    (greedy_decode pads what follows </s>, so nothing else can differ)."""
    return np.where(decoder_attention_mask.astype(bool), generated == labels, True).all(axis=1)


def predictions_done(arrays: Mapping[str, np.ndarray], params: Mapping, model_dir: str) -> dict[str, float]:
    """After predict (common/tf/run.py's hook): model_dir/predictions.txt, one line per example,
    ``source -> generated`` decoded with the eval data's tokenizer.json (sentinels shown), and
    the reference where the two differ; the greedy exact match is logged and returned."""
    import logging

    from tokenizers import Tokenizer

    from common.io import atomic_open

    data_dir = params["eval_input"]["data_dir"]
    meta = read_meta(data_dir)
    tokenizer = Tokenizer.from_file(os.path.join(data_dir, "tokenizer.json"))

    def text(ids: np.ndarray) -> str:
        ids = [int(i) for i in ids]
        if meta["eos_id"] in ids:
            ids = ids[:ids.index(meta["eos_id"])]
        return tokenizer.decode([i for i in ids if i != meta["pad_id"]], skip_special_tokens=False).strip()

    generated, sources, labels = arrays["generated_ids"], arrays["input_ids"], arrays["labels"]
    matches = exact_matches(generated, labels, arrays["decoder_attention_mask"])
    path = os.path.join(model_dir, "predictions.txt")
    with atomic_open(path, "w") as f:
        for source, output, reference, match in zip(sources, generated, labels, matches):
            line = f"{text(source)} -> {text(output)}"
            f.write(line + ("\n" if match else f"    (expected: {text(reference)})\n"))
    logging.getLogger("zoo").info("greedy decoding: %d of %d examples exactly right (exact match %.2f %%); %s",
                                  int(matches.sum()), len(matches), 100 * float(matches.mean()), path)
    return {"exact_match": float(matches.mean())}
