"""Llama (Touvron et al. 2023, "LLaMA" and "Llama 2"; Grattafiori et al. 2024, "The Llama 3
Herd of Models") and Mistral (Jiang et al. 2023, "Mistral 7B"): a decoder-only language model
trained to predict the next token, as transformers' LlamaForCausalLM computes it.

The same network, keys and defaults as pytorch/llama, in TF1 ops:

    input_ids (B, T) -> embed_tokens
      -> num_hidden_layers x [h = x + o_proj(attn(rms(x))); x = h + down(silu(gate(rms(h))) * up(rms(h)))]
         attn: causal self-attention; q k v from three projections, q and k rotated by their
               position (rotary, rotate_half), num_kv_heads k/v heads each shared by
               num_heads / num_kv_heads query heads (grouped-query attention)
      -> norm (RMS) -> lm_head (its own table; the embedding's with share_embedding_weights) -> logits (B, T, V)

    rms(x) = x * rsqrt(mean(x^2) + rms_norm_eps) * weight, in float32 (as Hugging Face)
    loss   = the mean cross entropy of the next token over the positions attention_mask marks

No biases, no dropout. The rotary frequencies are 1 / rope_theta^(2i / D) over the whole head
(D = hidden_size / num_heads), rescaled as Llama 3.1 does with ``rope_scaling: {rope_type:
llama3, ...}`` (transformers' ``_compute_llama3_parameters``). ``sliding_window: W`` is
Mistral's: position i attends to j with i - W < j <= i.

The variable names are Hugging Face's state_dict names with '/' and Dense kernels [in, out]:

    model/embed_tokens (V, H)
    model/layers_{i}/input_layernorm/weight, model/layers_{i}/post_attention_layernorm/weight (H,)
    model/layers_{i}/self_attn/{q_proj (H, nH*D), k_proj, v_proj (H, nKV*D), o_proj (nH*D, H)}/kernel
    model/layers_{i}/mlp/{gate_proj, up_proj (H, F), down_proj (F, H)}/kernel
    model/norm/weight, lm_head/kernel (H, V)                           (lm_head only when not shared)

``model_fn`` follows the Estimator contract (common/tf/estimator), as tf/gpt2's: TRAIN returns
the loss and train_op, EVAL the loss and, through ``host_call``, each position's loss and most
likely token (the host computes ``lm_perplexity`` and ``accuracy``), PREDICT each position's
most likely next token, or, from a prompt file, greedy completions decoded with a cache of
each layer's keys and values (one new position per step: linear in the tokens generated).

For the device (the forms of the GPT block of tests/device/test_family_blocks_language_tf.py):
dense layers on 2-D activations; the causal (and sliding-window) mask is one (T, T) numpy
constant shared by every layer, broadcast over the batch and the heads; the rotary cos/sin
tables are numpy constants computed when the graph is built, so the graph holds no sin or cos.
"""

import logging
import math
import os
from typing import Mapping

import keras
import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2

from common.data.text.lm import read_lm_meta
from common.data.text.prompts import write_completions
from common.data.text.tokenizer import read_tokenizer_json
from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

v1 = tf.compat.v1
logger = logging.getLogger("zoo")

MASKED = -1.0e9  # the score of a key the query may not see: exp() of it is 0 in float32 and in 16-bit formats
ROPE_SCALING_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def compute_dtype() -> tf.DType:
    """The runner's Keras policy: float32, or the 16-bit format of mixed precision (fp32 variables)."""
    return tf.as_dtype(keras.mixed_precision.global_policy().compute_dtype)


def kv_heads(p: Mapping) -> int:
    return p["num_kv_heads"] or p["num_heads"]


def check_sizes(p: Mapping) -> None:
    """(max_sequence_length against max_position_embeddings: data.py, which runs first)"""
    hidden, heads = p["hidden_size"], p["num_heads"]
    if hidden % heads:
        raise UserError(f"model.hidden_size {hidden} is not a multiple of model.num_heads {heads}")
    if (hidden // heads) % 2:
        raise UserError(f"the head size {hidden // heads} (model.hidden_size {hidden} / model.num_heads {heads}) "
                        f"is odd; rotary positions turn pairs of dims, so it must be even")
    if heads % kv_heads(p):
        raise UserError(f"model.num_kv_heads {p['num_kv_heads']} does not divide model.num_heads {heads} "
                        f"(each key/value head serves the same number of query heads)")
    check_rope_scaling(p["rope_scaling"])


def check_rope_scaling(scaling: Mapping | None) -> None:
    """null, or Llama 3.1's rescaling with every key of ROPE_SCALING_KEYS and no other."""
    if scaling is None:
        return
    for key in scaling:
        if key not in ROPE_SCALING_KEYS:
            raise UserError(f"model.rope_scaling.{key}: not a key of rope_scaling (its keys: "
                            f"{', '.join(ROPE_SCALING_KEYS)})")
    for key in ROPE_SCALING_KEYS:
        if key not in scaling:
            raise UserError(f"model.rope_scaling.{key} is missing (rope_scaling needs {', '.join(ROPE_SCALING_KEYS)})")
    if scaling["rope_type"] != "llama3":
        raise UserError(f"model.rope_scaling.rope_type {scaling['rope_type']!r}: only llama3 (Llama 3.1's "
                        f"rescaling) is supported; null rope_scaling for plain rotary positions")
    for key in ROPE_SCALING_KEYS[1:]:
        value = scaling[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise UserError(f"model.rope_scaling.{key} {value!r}: must be a number greater than 0")
    if scaling["high_freq_factor"] <= scaling["low_freq_factor"]:
        raise UserError(f"model.rope_scaling.high_freq_factor {scaling['high_freq_factor']} must be greater than "
                        f"model.rope_scaling.low_freq_factor {scaling['low_freq_factor']}")


def weight(name: str, shape: list, stddev: float | None = None) -> tf.Tensor:
    """A float32 variable (normal of ``stddev``, as Hugging Face's Llama; else ones), read in the compute dtype."""
    initializer = v1.random_normal_initializer(stddev=stddev) if stddev is not None else v1.ones_initializer()
    variable = v1.get_variable(name, shape, tf.float32, initializer=initializer)
    return tf.cast(variable, compute_dtype())


def dense(x: tf.Tensor, units: int, name: str, stddev: float) -> tf.Tensor:
    """(N, in) -> (N, units): x @ kernel, kernel (in, units) N(0, stddev); no bias (Llama has none)."""
    with v1.variable_scope(name):
        return tf.matmul(x, weight("kernel", [x.shape[-1], units], stddev))


def rms_norm(x: tf.Tensor, p: Mapping, name: str) -> tf.Tensor:
    """LlamaRMSNorm over the last axis: x * rsqrt(mean(x^2) + eps) in float32, back to x's
    dtype, then times the weight (ones at first)."""
    with v1.variable_scope(name):
        scale = weight("weight", [x.shape[-1]])
        x32 = tf.cast(x, tf.float32)
        variance = tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True)
        return tf.cast(x32 * tf.math.rsqrt(variance + p["rms_norm_eps"]), x.dtype) * scale


def rotary_frequencies(head_size: int, p: Mapping) -> np.ndarray:
    """(D/2,) float64: the angle per position of each dim pair, 1 / rope_theta^(2i / D); with
    rope_scaling, Llama 3.1's rescaling (transformers' _compute_llama3_parameters): wavelengths
    above original_max_position_embeddings / low_freq_factor slowed by ``factor``, those below
    original_max_position_embeddings / high_freq_factor kept, those between interpolated."""
    inv_freq = 1.0 / (p["rope_theta"] ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size))
    scaling = p["rope_scaling"]
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    scaled = np.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)  # 0 at the low-frequency end, 1 at the high
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelength >= context / high) & (wavelength <= context / low)
    return np.where(medium, smoothed, scaled)


def rotary_tables(positions: int, head_size: int, p: Mapping) -> np.ndarray:
    """(2, positions, D) float32: cos and sin of each position's angle, the D/2 angles twice
    over (Hugging Face's ``cat((freqs, freqs))``: dim i pairs with dim i + D/2)."""
    angles = np.arange(positions, dtype=np.float64)[:, None] * rotary_frequencies(head_size, p)[None, :]  # (P, D/2)
    angles = np.concatenate([angles, angles], axis=1)  # (P, D)
    return np.stack([np.cos(angles), np.sin(angles)]).astype(np.float32)


def rotate_half(x: tf.Tensor) -> tf.Tensor:
    """(x1, x2) -> (-x2, x1), the halves of the last axis (Hugging Face's rotate_half)."""
    half = x.shape[-1] // 2
    return tf.concat([-x[..., half:], x[..., :half]], axis=-1)


def rotate(t: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """(B, heads, T, D) turned by each position's angle; cos, sin broadcast to it ((T, D) or (B, 1, 1, D))."""
    return t * cos + rotate_half(t) * sin


def attention_mask(seq: int, sliding_window: int | None) -> np.ndarray:
    """(T, T) bool: query i sees key j where j <= i and, with a window W, i - W < j (Mistral)."""
    query, key = np.arange(seq)[:, None], np.arange(seq)[None, :]
    keep = key <= query
    if sliding_window is not None:
        keep &= key > query - sliding_window
    return keep


def bool_constant(array: np.ndarray, name: str) -> tf.Tensor:
    """A bool constant of the graph from its bytes at once: TF's make_tensor_proto copies a bool
    array element by element (no tensor_content for bool), some 25 s for a (4096, 4096) mask."""
    proto = tensor_pb2.TensorProto(dtype=types_pb2.DT_BOOL, tensor_shape=tf.TensorShape(array.shape).as_proto(),
                                   tensor_content=np.ascontiguousarray(array, dtype=np.bool_).tobytes())
    return tf.constant(proto, name=name)


def repeat_kv(t: tf.Tensor, groups: int) -> tf.Tensor:
    """(B, nKV, T, D) -> (B, nKV * groups, T, D): each key/value head once for each query head of
    its group, in Hugging Face's order (query head h reads key/value head h // groups)."""
    if groups == 1:
        return t
    _, heads, seq, size = t.shape.as_list()
    batch = tf.shape(t)[0] if t.shape[0] is None else t.shape[0]
    repeated = tf.broadcast_to(t[:, :, None], [batch, heads, groups, seq, size])  # (B, nKV, groups, T, D)
    return tf.reshape(repeated, [batch, heads * groups, seq, size])


def rows(batch: int | None, seq: int) -> int:
    """B*T, or -1 where the batch size is known only when the graph runs (predict's last batch of prompts)."""
    return -1 if batch is None else batch * seq


def self_attention(x: tf.Tensor, keep: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, batch: int | None, seq: int,
                   p: Mapping, past: tuple | None = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
    """(B*T, H) -> (B*T, H) and this layer's keys and values (B, nKV, T, D), rotated.

    keep: bool, broadcast to the scores (B, nH, T, S): the (T, T) mask constant, or in decoding
    (B, 1, 1, S). past (decoding, T = 1): (keys, values, write) with the cache (B, nKV, S, D)
    and write (B, 1, S, 1) marking each row's new position: the new key and value replace the
    cache's there, and the query attends over the whole cache."""
    heads, kv, hidden = p["num_heads"], kv_heads(p), p["hidden_size"]
    size, std = hidden // heads, p["initializer_range"]

    def split_heads(t, n):  # (B*T, n*D) -> (B, n, T, D)
        return tf.transpose(tf.reshape(t, [-1 if batch is None else batch, seq, n, size]), [0, 2, 1, 3])

    q = rotate(split_heads(dense(x, heads * size, "q_proj", std), heads), cos, sin)  # (B, nH, T, D)
    k = rotate(split_heads(dense(x, kv * size, "k_proj", std), kv), cos, sin)  # (B, nKV, T, D)
    v = split_heads(dense(x, kv * size, "v_proj", std), kv)
    if past is not None:
        cached_k, cached_v, write = past
        k, v = tf.where(write, k, cached_k), tf.where(write, v, cached_v)  # (B, nKV, S, D)
    scores = tf.matmul(q, repeat_kv(k, heads // kv), transpose_b=True) * (1.0 / math.sqrt(size))  # (B, nH, T, S)
    scores = tf.where(keep, scores, tf.constant(MASKED, scores.dtype))
    context = tf.matmul(tf.nn.softmax(scores), repeat_kv(v, heads // kv))  # (B, nH, T, D)
    context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]), [rows(batch, seq), heads * size])
    return dense(context, hidden, "o_proj", std), (k, v)


def mlp(x: tf.Tensor, p: Mapping) -> tf.Tensor:
    """(B*T, H) -> (B*T, H): SwiGLU (Shazeer 2020), down(silu(gate(x)) * up(x)), inner size filter_size."""
    std = p["initializer_range"]
    gate = dense(x, p["filter_size"], "gate_proj", std)
    up = dense(x, p["filter_size"], "up_proj", std)
    return dense(gate * tf.sigmoid(gate) * up, p["hidden_size"], "down_proj", std)


def decoder_layer(x: tf.Tensor, keep: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, batch: int | None, seq: int,
                  p: Mapping, past: tuple | None = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
    """(B*T, H) -> (B*T, H), pre-norm, and the layer's keys and values (self_attention)."""
    normed = rms_norm(x, p, "input_layernorm")
    with v1.variable_scope("self_attn"):
        attended, cache = self_attention(normed, keep, cos, sin, batch, seq, p, past)
    h = x + attended
    normed = rms_norm(h, p, "post_attention_layernorm")
    with v1.variable_scope("mlp"):
        return h + mlp(normed, p), cache


def llama_forward(input_ids: tf.Tensor, keep: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor, p: Mapping,
                  past: list | None = None) -> tuple[tf.Tensor, list]:
    """input_ids (B, T) -> logits (B*T, V) float32 and each layer's (keys, values); keep, cos,
    sin and past as self_attention takes them (past: one (keys, values, write) a layer)."""
    batch, seq = input_ids.shape
    hidden, std = p["hidden_size"], p["initializer_range"]
    caches = []
    with v1.variable_scope("model"):
        embed_tokens = weight("embed_tokens", [p["vocab_size"], hidden], std)
        # (B*T, H): the dense layers take 2-D inputs
        x = tf.reshape(tf.gather(embed_tokens, input_ids), [rows(batch, seq), hidden])
        for i in range(p["num_hidden_layers"]):
            with v1.variable_scope(f"layers_{i}"):
                x, cache = decoder_layer(x, keep, cos, sin, batch, seq, p, None if past is None else past[i])
            caches.append(cache)
        x = rms_norm(x, p, "norm")
    if p["share_embedding_weights"]:
        logits = tf.matmul(x, embed_tokens, transpose_b=True)  # the output embedding is the input one (one variable)
    else:
        logits = dense(x, p["vocab_size"], "lm_head", std)
    return tf.cast(logits, tf.float32), caches  # (B*T, V)


def check_positions(seq: int, p: Mapping) -> None:
    if seq > p["max_position_embeddings"]:
        raise UserError(f"the input's sequences have {seq} tokens, more than model.max_position_embeddings "
                        f"{p['max_position_embeddings']}")


def llama_logits(input_ids: tf.Tensor, p: Mapping) -> tf.Tensor:
    """input_ids (B, T) -> logits (B*T, V) float32."""
    check_sizes(p)
    seq = input_ids.shape[1]
    check_positions(seq, p)
    # query t sees keys 0..t (and no further back than the window): one (T, T) constant of the graph for
    # every layer, broadcast over the batch and the heads (a (B, T, T) mask would be a batch-sized
    # constant; a mask computed in the graph, e.g. band_part of ones, would be folded once per layer by
    # the capture); the cos/sin tables likewise, (T, D) each
    keep = bool_constant(attention_mask(seq, p["sliding_window"]), "causal_mask")
    cos, sin = (tf.constant(t, compute_dtype()) for t in rotary_tables(seq, p["hidden_size"] // p["num_heads"], p))
    return llama_forward(input_ids, keep, cos, sin, p)[0]


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

    Greedy: token t + 1 of each row is the argmax of its logits at t. The first step runs the
    whole (B, L) sequence once (the causal mask keeps the padding behind a prompt out of its
    logits) and keeps each layer's keys and values (B, nKV, L, D) as the cache; each later
    step, in a tf.while_loop, runs one position per row, the token the step before wrote:
    its key and value go into the cache at its position, its query attends over the cache
    (keys up to its position, within the window), so a step costs one token's layers,
    not the whole sequence's. The padding's keys in the first cache are never read: a
    position is written before any query reaches it."""
    check_sizes(p)
    length = tokens.shape[1]
    check_positions(length, p)
    size, window = p["hidden_size"] // p["num_heads"], p["sliding_window"]
    tables = rotary_tables(length, size, p)  # (2, L, D)
    row_ids = tf.range(tf.shape(tokens)[0])

    def write_argmax(tokens, logits, position):  # logits (B, V) at each row's position -> token position + 1
        new = tf.argmax(logits, -1, output_type=tokens.dtype)  # (B,)
        return tf.tensor_scatter_nd_update(tokens, tf.stack([row_ids, position + 1], axis=1), new)

    keep = bool_constant(attention_mask(length, window), "causal_mask")
    cos, sin = (tf.constant(t, compute_dtype()) for t in tables)
    logits, caches = llama_forward(tokens, keep, cos, sin, p)
    last = prompt_length - 1  # (B,) each row's newest token
    tokens = write_argmax(tokens, tf.gather(tf.reshape(logits, [-1, length, p["vocab_size"]]), last, batch_dims=1),
                          last)
    if max_new_tokens == 1:
        return tokens
    keys = tf.constant(np.arange(length)[None, :], prompt_length.dtype)  # (1, S): the cache's positions

    def step(i, tokens, caches):
        position = prompt_length - 1 + i  # (B,) the token the step before wrote
        ids = tf.gather(tokens, position, batch_dims=1)[:, None]  # (B, 1)
        seen = keys <= position[:, None]  # (B, S)
        if window is not None:
            seen = tf.logical_and(seen, keys > position[:, None] - window)
        write = tf.equal(keys, position[:, None])[:, None, :, None]  # (B, 1, S, 1)
        cos, sin = (tf.reshape(tf.gather(tf.constant(t, compute_dtype()), position), [-1, 1, 1, size])
                    for t in tables)  # (B, 1, 1, D) each
        past = [(k, v, write) for k, v in caches]
        logits, caches = llama_forward(ids, seen[:, None, None, :], cos, sin, p, past)  # logits (B, V)
        return i + 1, write_argmax(tokens, logits, position), caches

    with v1.variable_scope(v1.get_variable_scope(), reuse=True):
        _, tokens, _ = tf.while_loop(lambda i, *_: i < max_new_tokens, step,
                                     (tf.constant(1, prompt_length.dtype), tokens, caches))
    return tokens


def predictions_done(arrays: Mapping[str, np.ndarray], params: Mapping, model_dir: str) -> dict[str, float]:
    """After a predict from a prompt file: model_dir/completions.jsonl, each prompt's line, text
    and completion (cut at <|endoftext|>), as tf/gpt2 writes it, decoded with data_dir's tokenizer.json."""
    predict_input = params["predict_input"]
    if predict_input["prompt_file"] is None:
        return {}
    data_dir = params["eval_input"]["data_dir"]
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
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
    if mode == ModeKeys.PREDICT and "prompt_length" in features:
        tokens = greedy_decode(features["tokens"], features["prompt_length"], p,
                               params["predict_input"]["max_new_tokens"])
        return EstimatorSpec(mode, predictions={"tokens": tokens, "prompt_length": features["prompt_length"]})
    input_ids = features["input_ids"]
    logits = llama_logits(input_ids, p)  # (B*T, V)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"predictions": tf.reshape(
            tf.argmax(logits, -1, output_type=input_ids.dtype), input_ids.shape)})
    attention_mask = features["attention_mask"]
    losses = token_losses(logits, labels)  # (B, T)
    loss = lm_loss(losses, attention_mask)
    if mode == ModeKeys.TRAIN:  # no argmax over the vocab in a training step
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    predictions = tf.reshape(tf.argmax(logits, -1, output_type=labels.dtype), labels.shape)  # (B, T)
    return CSEstimatorSpec(mode, loss=loss, host_call=(lm_metrics, [losses, predictions, labels, attention_mask]))
