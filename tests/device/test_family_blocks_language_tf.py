"""One small block per language family (BERT, GPT, T5) in TensorFlow, end to end (the same in
PyTorch: test_family_blocks_language_torch.py).

Each block is written as a user of the zoo writes it, from the framework's own layers and
ops: a BERT encoder layer with a padding mask, the MLM head's masked-position gather and an
NSP head; a GPT block with a causal mask built in the graph and a head tied to the token
embedding; a T5 block with RMS norm and a relative position bias whose buckets are computed
in the graph (log, floor, integer arithmetic) from position ids that skip padding.

Each validates, compiles, and trains on the emulator for 5 Adam steps with the framework's
loss at every step: within 1e-4 relative in float32, within 2e-2 in bfloat16 and float16
(against the framework's float32 run).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.device.language_blocks import (DIM, HEADS, LR, MAX_DISTANCE, MIXED, NUM_BUCKETS, SEQ, VOCAB, step_batches,
                                          check, with_precision)

# TF1 graphs as the Estimator runner builds them: Keras layers and tf ops in a
# tf.compat.v1.Graph, trained by AdamOptimizer(lr).minimize(loss, global_step).

tf = pytest.importorskip("tensorflow")
from device.api import compile_graph, validate_graph  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers


def tf_attention(x, keep_bias=None, mask=None, scale=True, use_bias=True):
    """Multi-head self-attention in tf ops: x (B, T, C); an additive bias (B, H or 1, T, T), a bool mask."""
    batch, seq, dim = x.shape
    qkv = layers.Dense(3 * dim, use_bias=use_bias)(x)
    q, k, v = qkv[..., :dim], qkv[..., dim:2 * dim], qkv[..., 2 * dim:]
    q, k, v = (tf.transpose(tf.reshape(t, [batch, seq, HEADS, dim // HEADS]), [0, 2, 1, 3]) for t in (q, k, v))
    scores = tf.matmul(q, k, transpose_b=True)  # (B, H, T, T)
    if scale:
        scores = scores / math.sqrt(dim // HEADS)
    if keep_bias is not None:
        scores = scores + keep_bias
    if mask is not None:
        scores = tf.where(mask[:, None], scores, -1e9)
    y = tf.matmul(tf.nn.softmax(scores), v)  # (B, H, T, D)
    return layers.Dense(dim, use_bias=use_bias)(tf.reshape(tf.transpose(y, [0, 2, 1, 3]), [batch, seq, dim]))


def tf_bert(ids, positions, mlm_labels, nsp_labels):
    batch, seq = ids.shape
    word = layers.Embedding(VOCAB, DIM)
    x = word(ids) + layers.Embedding(SEQ, DIM)(tf.range(seq))
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    keep = tf.not_equal(ids, 0)  # the padding mask, from the batch
    additive = (1.0 - tf.cast(keep[:, None, None, :], tf.float32)) * -10000.0
    x = layers.LayerNormalization(epsilon=1e-12)(x + tf_attention(x, keep_bias=additive))
    ffn = layers.Dense(DIM)(layers.Dense(4 * DIM, activation="gelu")(x))
    x = layers.LayerNormalization(epsilon=1e-12)(x + ffn)
    picked = tf.gather(x, positions, axis=1, batch_dims=1)  # (B, P, C): the masked positions
    h = layers.LayerNormalization(epsilon=1e-12)(layers.Dense(DIM, activation="gelu")(picked))
    mlm_bias = v1.get_variable("mlm_bias", [VOCAB], initializer=v1.zeros_initializer())
    mlm_logits = tf.matmul(h, word.embeddings, transpose_b=True) + mlm_bias  # tied to the word embedding
    nsp_logits = layers.Dense(2)(layers.Dense(DIM, activation="tanh")(x[:, 0]))  # [CLS]
    mlm = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=mlm_labels, logits=mlm_logits)
    nsp = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=nsp_labels, logits=nsp_logits)
    return tf.reduce_mean(mlm) + tf.reduce_mean(nsp)


def tf_gpt(ids, targets):
    batch, seq = ids.shape
    tok_emb = layers.Embedding(VOCAB, DIM)
    x = tok_emb(ids) + layers.Embedding(SEQ, DIM)(tf.range(seq))
    causal = tf.cast(tf.linalg.band_part(tf.ones((seq, seq)), -1, 0), tf.bool)  # built in the graph
    x = x + tf_attention(layers.LayerNormalization(epsilon=1e-5)(x), mask=tf.broadcast_to(causal, [batch, seq, seq]))
    h = layers.LayerNormalization(epsilon=1e-5)(x)
    x = x + layers.Dense(DIM)(tf.nn.gelu(layers.Dense(4 * DIM)(h), approximate=True))
    logits = tf.matmul(layers.LayerNormalization(epsilon=1e-5)(x), tok_emb.embeddings, transpose_b=True)  # tied
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits))


def tf_rms_norm(x, name):
    weight = v1.get_variable(name, [DIM], initializer=v1.ones_initializer())
    return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + 1e-6) * weight


def tf_buckets(relative):
    """T5's bidirectional relative position buckets, in tf ops."""
    half = NUM_BUCKETS // 2
    buckets = tf.cast(relative > 0, tf.int32) * half
    distance = tf.abs(relative)
    exact = half // 2
    large = exact + tf.cast(tf.math.log(tf.cast(distance, tf.float32) / exact) / math.log(MAX_DISTANCE / exact)
                            * (half - exact), tf.int32)
    large = tf.minimum(large, half - 1)
    return buckets + tf.where(distance < exact, distance, large)


def tf_t5(ids, targets):
    keep = tf.not_equal(ids, 0)
    position = tf.cumsum(tf.cast(keep, tf.int32), axis=1) - 1  # positions that skip padding
    relative = position[:, None, :] - position[:, :, None]  # (B, T, T)
    bias = tf.transpose(layers.Embedding(NUM_BUCKETS, HEADS)(tf_buckets(relative)), [0, 3, 1, 2])  # (B, H, T, T)
    x = layers.Embedding(VOCAB, DIM)(ids)
    mask = tf.broadcast_to(keep[:, None, :], [ids.shape[0], ids.shape[1], ids.shape[1]])
    x = x + tf_attention(tf_rms_norm(x, "ln1"), keep_bias=bias, mask=mask, scale=False, use_bias=False)
    x = x + layers.Dense(DIM, use_bias=False)(layers.Dense(4 * DIM, activation="relu", use_bias=False)(
        tf_rms_norm(x, "ln2")))
    logits = layers.Dense(VOCAB, use_bias=False)(tf_rms_norm(x, "ln_f"))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits))


def tf_block(name):
    """A TRAIN graph, its inputs, loss and train_op, and the batch arrays per step."""
    model_fn = {"bert": tf_bert, "gpt": tf_gpt, "t5": tf_t5}[name]
    if name == "bert":
        batches = [[a.astype(np.int32) for a in b] for b in step_batches()]
    else:
        batches = [[b[0].astype(np.int32), np.roll(b[0], -1, axis=1).astype(np.int32)] for b in step_batches()]
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        inputs = [v1.placeholder(tf.int32, a.shape, name=f"input_{i}") for i, a in enumerate(batches[0])]
        loss = model_fn(*inputs)
        train_op = v1.train.AdamOptimizer(LR).minimize(loss, v1.train.get_or_create_global_step())
        init = v1.global_variables_initializer()
    session = v1.Session(graph=graph)
    session.run(init)
    return graph, session, inputs, loss, train_op, batches


@pytest.mark.parametrize("name", ["bert", "gpt", "t5"])
def test_tf_block_validates_compiles_and_trains_with_tf_loss(name, tmp_path):
    graph, session, inputs, loss, train_op, batches = tf_block(name)
    try:
        ir = capture_tf.capture(graph, inputs=inputs, loss=loss, train_op=train_op)
        report = validate_graph(ir, mode="train", profile_name="small")
        assert report.ok, report.to_text()
        result = compile_graph(ir, mode="train", profile_name="small", out_dir=tmp_path / "compile")
        kinds = {k.kind for k in result.kernels}
        assert "attention" in kinds and "unsupported" not in kinds  # the masked attention is one kernel
        initial = capture_tf.read_weights(session, ir)
        programs = {precision: Program(with_precision(ir, precision), initial, seed=0)
                    for precision in ("float32", *MIXED)}
        expected = [session.run([loss, train_op], dict(zip(inputs, batch)))[0] for batch in batches]
    finally:
        session.close()
    for precision, program in programs.items():
        losses = [program.train_step(batch, LR) for batch in batches]
        check(losses, expected, precision)
    moved = {key: not np.array_equal(w, initial[key]) for key, w in programs["float32"].get_weights().items()}
    assert all(moved.values()), moved
