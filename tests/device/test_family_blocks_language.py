"""One small block per language family (BERT, GPT, T5), in PyTorch and in TensorFlow, end to end.

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

VOCAB, SEQ, DIM, HEADS, BATCH = 13, 6, 16, 2, 3
STEPS, LR = 5, 1e-3
MIXED = ("bfloat16", "float16")

# token ids with padding (0) at the end of two of the three sequences; [CLS] = 1
IDS = np.array([[1, 5, 7, 2, 9, 0], [1, 3, 12, 4, 0, 0], [1, 8, 6, 11, 10, 2]], np.int64)
MLM_POSITIONS = np.array([[2, 4], [1, 3], [5, 2]], np.int64)  # two masked positions per sequence
MLM_LABELS = np.array([[3, 4], [6, 7], [8, 2]], np.int64)
NSP_LABELS = np.array([0, 1, 1], np.int64)
NUM_BUCKETS, MAX_DISTANCE = 8, 16  # T5's relative position buckets (bidirectional)


def _batches():
    """Five batches: the ids shifted in the vocabulary, so that each step sees new data."""
    out = []
    for step in range(STEPS):
        ids = np.where(IDS > 1, (IDS - 2 + step) % (VOCAB - 2) + 2, IDS)
        out.append((ids, MLM_POSITIONS, (MLM_LABELS + step) % VOCAB, (NSP_LABELS + step) % 2))
    return out


def _check(losses, expected, precision):
    rtol = 1e-4 if precision == "float32" else 2e-2
    np.testing.assert_allclose(losses, expected, rtol=rtol, err_msg=precision)


# ========================================================================== PyTorch

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.api import compile_graph, validate_graph  # noqa: E402
from device.capture.torch import capture, state_of, weights_of  # noqa: E402
from device.runtime.program import Program  # noqa: E402


class TorchAttention(nn.Module):
    def __init__(self, scale: bool = True, bias: bool = True):
        super().__init__()
        self.qkv = nn.Linear(DIM, 3 * DIM, bias=bias)
        self.out = nn.Linear(DIM, DIM, bias=bias)
        self.scale = scale

    def forward(self, x, mask=None, additive=None):  # x (B, T, C); mask (B, 1 or T, T) bool; additive (.., T, T)
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = [t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v)]  # (B, H, T, D)
        scores = q @ k.transpose(-2, -1)  # (B, H, T, T)
        if self.scale:
            scores = scores / math.sqrt(C // HEADS)
        if additive is not None:
            scores = scores + additive
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None], float("-inf"))
        y = scores.softmax(-1) @ v  # (B, H, T, D)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class TorchBert(nn.Module):
    """A BERT encoder layer (post-norm), the MLM head on the masked positions and the NSP head."""

    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.position = nn.Embedding(SEQ, DIM)
        self.ln_embed = nn.LayerNorm(DIM, eps=1e-12)
        self.attn = TorchAttention()
        self.ln1 = nn.LayerNorm(DIM, eps=1e-12)
        self.ffn = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))
        self.ln2 = nn.LayerNorm(DIM, eps=1e-12)
        self.mlm_dense = nn.Linear(DIM, DIM)
        self.mlm_ln = nn.LayerNorm(DIM, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(VOCAB))
        self.pooler = nn.Linear(DIM, DIM)
        self.nsp = nn.Linear(DIM, 2)

    def forward(self, ids, positions):  # (B, T), (B, P)
        B, T = ids.shape
        x = self.ln_embed(self.word(ids) + self.position(torch.arange(T)))  # (B, T, C)
        keep = ids != 0  # the padding mask, from the batch
        additive = (1.0 - keep[:, None, None, :].float()) * -10000.0  # BERT's additive form
        x = self.ln1(x + self.attn(x, additive=additive))
        x = self.ln2(x + self.ffn(x))
        picked = x[torch.arange(B)[:, None], positions]  # (B, P, C): the masked positions
        h = self.mlm_ln(F.gelu(self.mlm_dense(picked)))
        mlm_logits = h @ self.word.weight.t() + self.mlm_bias  # decoder tied to the word embedding
        nsp_logits = self.nsp(torch.tanh(self.pooler(x[:, 0])))  # [CLS]
        return mlm_logits, nsp_logits


class TorchGpt(nn.Module):
    """A GPT-2 block: pre-norm, causal mask built in the graph, tanh GELU, tied head."""

    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, DIM)
        self.pos_emb = nn.Embedding(SEQ, DIM)
        self.ln1 = nn.LayerNorm(DIM)
        self.attn = TorchAttention()
        self.ln2 = nn.LayerNorm(DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(approximate="tanh"), nn.Linear(4 * DIM, DIM))
        self.ln_f = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        self.head.weight = self.tok_emb.weight  # tied, as GPT-2

    def forward(self, ids):  # (B, T)
        B, T = ids.shape
        x = self.tok_emb(ids) + self.pos_emb(torch.arange(T, device=ids.device))
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))[None].expand(B, T, T)
        x = x + self.attn(self.ln1(x), mask=causal)
        x = x + self.mlp(self.ln2(x))
        return self.head(self.ln_f(x))  # (B, T, V)


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(DIM))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def torch_buckets(relative):
    """T5's bidirectional relative position buckets (HF's _relative_position_bucket)."""
    half = NUM_BUCKETS // 2
    buckets = (relative > 0).long() * half
    distance = torch.abs(relative)
    exact = half // 2
    is_small = distance < exact
    large = exact + (torch.log(distance.float() / exact) / math.log(MAX_DISTANCE / exact)
                     * (half - exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, half - 1))
    return buckets + torch.where(is_small, distance, large)


class TorchT5(nn.Module):
    """A T5 encoder block: RMS norm, unscaled attention with a relative position bias, ReLU FFN."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.ln1 = RMSNorm()
        self.attn = TorchAttention(scale=False, bias=False)
        self.relative_bias = nn.Embedding(NUM_BUCKETS, HEADS)
        self.ln2 = RMSNorm()
        self.wi = nn.Linear(DIM, 4 * DIM, bias=False)
        self.wo = nn.Linear(4 * DIM, DIM, bias=False)
        self.ln_f = RMSNorm()
        self.head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids):  # (B, T)
        keep = ids != 0
        position = torch.cumsum(keep.long(), dim=1) - 1  # (B, T): positions that skip padding
        relative = position[:, None, :] - position[:, :, None]  # (B, T, T): key - query
        bias = self.relative_bias(torch_buckets(relative)).permute(0, 3, 1, 2)  # (B, H, T, T)
        x = self.embed(ids)
        mask = keep[:, None, :].expand(-1, ids.shape[1], -1)  # (B, T, T)
        x = x + self.attn(self.ln1(x), mask=mask, additive=bias)
        x = x + self.wo(F.relu(self.wi(self.ln2(x))))
        return self.head(self.ln_f(x))  # (B, T, V)


def torch_block(name):
    """(model, step_fn, batch maker): each step_fn returns the scalar loss."""
    if name == "bert":
        model = TorchBert()

        def step(batch):
            ids, positions, mlm_labels, nsp_labels = batch
            mlm_logits, nsp_logits = model(ids, positions)
            return (F.cross_entropy(mlm_logits.reshape(-1, VOCAB), mlm_labels.reshape(-1))
                    + F.cross_entropy(nsp_logits, nsp_labels))

        return model, step, lambda b: [torch.tensor(a) for a in b]
    model = TorchGpt() if name == "gpt" else TorchT5()

    def step(batch):
        ids, targets = batch
        logits = model(ids)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    # next-token targets for GPT; T5 (an encoder block here) predicts the token itself shifted
    return model, step, lambda b: [torch.tensor(b[0]), torch.tensor(np.roll(b[0], -1, axis=1))]


@pytest.mark.parametrize("name", ["bert", "gpt", "t5"])
def test_torch_block_validates_compiles_and_trains_with_torch_loss(name, tmp_path):
    torch.manual_seed(0)
    model, step, make = torch_block(name)
    batches = [make(b) for b in _batches()]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    graph = capture(step, model, batches[0], optimizer=optimizer)
    report = validate_graph(graph, mode="train", profile_name="small")
    assert report.ok, report.to_text()
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    kinds = {k.kind for k in result.kernels}
    assert "attention" in kinds and "unsupported" not in kinds  # the masked attention is one kernel
    initial = weights_of(model, graph)
    programs = {precision: Program(_with_precision(graph, precision), weights_of(model, graph),
                                   state_of(model, graph), seed=0) for precision in ("float32", *MIXED)}
    expected = []
    for batch in batches:
        optimizer.zero_grad()
        loss = step(batch)
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
    for precision, program in programs.items():
        losses = [program.train_step([t.numpy() for t in batch], LR) for batch in batches]
        _check(losses, expected, precision)
    # every weight was updated (the losses above agree step by step; the weights themselves
    # can differ by up to the learning rate where a gradient is zero but for rounding, as
    # the key bias of attention, which Adam scales up: device/README.md, "How close")
    moved = {key: not np.array_equal(w, initial[key]) for key, w in programs["float32"].get_weights().items()}
    assert all(moved.values()), moved


def _with_precision(graph, precision):
    import copy

    copied = copy.copy(graph)
    copied.precision = precision
    return copied


def test_gpt_tied_head_is_one_weight_saved_under_both_keys():
    torch.manual_seed(0)
    model, step, make = torch_block("gpt")
    batch = make(_batches()[0])
    graph = capture(step, model, batch, optimizer=torch.optim.Adam(model.parameters(), lr=LR))
    assert "tok_emb.weight" in graph.params.values() and "head.weight" not in graph.params.values()
    program = Program(graph, weights_of(model, graph), seed=0)
    program.train_step([t.numpy() for t in batch], LR)
    from device.capture.torch import load_weights

    load_weights(model, program.get_weights())
    saved = model.state_dict()
    np.testing.assert_array_equal(saved["head.weight"].numpy(), program.get_weights()["tok_emb.weight"])


# ======================================================================= TensorFlow
# TF1 graphs as the Estimator runner builds them: Keras layers and tf ops in a
# tf.compat.v1.Graph, trained by AdamOptimizer(lr).minimize(loss, global_step).

tf = pytest.importorskip("tensorflow")
from device.capture import tf as capture_tf  # noqa: E402

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
        batches = [[a.astype(np.int32) for a in b] for b in _batches()]
    else:
        batches = [[b[0].astype(np.int32), np.roll(b[0], -1, axis=1).astype(np.int32)] for b in _batches()]
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
        programs = {precision: Program(_with_precision(ir, precision), initial, seed=0)
                    for precision in ("float32", *MIXED)}
        expected = [session.run([loss, train_op], dict(zip(inputs, batch)))[0] for batch in batches]
    finally:
        session.close()
    for precision, program in programs.items():
        losses = [program.train_step(batch, LR) for batch in batches]
        _check(losses, expected, precision)
    moved = {key: not np.array_equal(w, initial[key]) for key, w in programs["float32"].get_weights().items()}
    assert all(moved.values()), moved
