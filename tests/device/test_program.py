"""device/runtime/program.py on hand-built IR graphs, against the same models in torch.

Three models: an MLP (torch-style Linear: transpose + matmul + add), a tiny CNN
(conv -> batch_norm -> relu -> max_pool -> dense, NCHW) and a tiny attention block
(embedding, layer_norm, einsum attention, softmax, gelu, residuals; TF-style (in, out)
weights). Each is compared on loss and every gradient, then over 50 Adam steps; then in
16-bit precision; then the training-step machinery (loss scaling, non-finite loss, bad
batches, weights and optimizer state round trips).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from common.errors import UserError  # noqa: E402
from device.dtypes import round_to  # noqa: E402
from device.ir import Graph  # noqa: E402
from device.ops import OPS, KernelContext  # noqa: E402
from device.optimizer import OptimizerSpec  # noqa: E402
from device.runtime.program import Program  # noqa: E402

ADAM = OptimizerSpec("adam", "torch", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8})


class Builder:
    """Builds an IR graph by hand; runs each kernel on example arrays to learn its output shape."""

    def __init__(self, frontend="torch"):
        self.graph = Graph(frontend)
        self.examples: dict[str, np.ndarray] = {}

    def _value(self, name, example):
        dtype = "float32" if np.issubdtype(example.dtype, np.floating) else str(example.dtype)
        self.graph.add_value(name, example.shape, dtype)
        self.examples[name] = example
        return name

    def input(self, name, shape, dtype="float32"):
        self.graph.inputs.append(name)
        return self._value(name, np.zeros(shape, dtype))

    def param(self, fw_name, shape):
        self.graph.params[f"p:{fw_name}"] = fw_name
        return self._value(f"p:{fw_name}", np.ones(shape, np.float32))

    def state(self, fw_name, shape):
        self.graph.state[f"s:{fw_name}"] = fw_name
        return self._value(f"s:{fw_name}", np.ones(shape, np.float32))

    def constant(self, name, value):
        self.graph.constants[name] = np.asarray(value, np.float32)
        return self._value(name, self.graph.constants[name])

    def op(self, op, inputs, n_outputs=1, **attrs):
        """Add a node; its first output's name (or the first ``n_outputs`` names)."""
        outputs, _ = OPS[op].forward([self.examples[i] for i in inputs], attrs, KernelContext())
        names = [self._value(f"v{len(self.graph.values)}", np.asarray(y)) for y in outputs[:n_outputs]]
        self.graph.add_node(op, inputs, names, attrs)
        return names[0] if n_outputs == 1 else names

    def finish(self, loss, outputs, precision="float32", optimizer=ADAM):
        self.graph.loss = loss
        self.graph.outputs = outputs
        self.graph.precision = precision
        self.graph.optimizer = optimizer
        return self.graph


def _init(shapes, seed=0):
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in shapes.items():
        fan_in = math.prod(shape[1:]) if len(shape) > 1 else shape[0]
        scale = 0.1 if len(shape) == 1 else 1 / math.sqrt(fan_in)
        weights[name] = (scale * rng.standard_normal(shape)).astype(np.float32)
    return weights


# ---------------------------------------------------------------------------- models


def mlp(precision="float32", optimizer=ADAM, dropout=0.0):
    """x (8, 20) -> Linear 16 -> relu -> dropout -> Linear 5 -> mean cross-entropy."""
    b = Builder()
    x, labels = b.input("x", (8, 20)), b.input("labels", (8,), "int64")
    h = x
    for i, (fan_in, fan_out) in enumerate([(20, 16), (16, 5)]):
        w, bias = b.param(f"fc{i}.weight", (fan_out, fan_in)), b.param(f"fc{i}.bias", (fan_out,))
        h = b.op("add", [b.op("matmul", [h, b.op("transpose", [w], perm=[1, 0])]), bias])
        if i == 0:
            h = b.op("dropout", [b.op("relu", [h])], rate=dropout)
    loss = b.op("reduce_mean", [b.op("sparse_softmax_cross_entropy", [h, labels])], axes=None, keepdims=False)
    graph = b.finish(loss, {"logits": h}, precision, optimizer)
    shapes = {"fc0.weight": (16, 20), "fc0.bias": (16,), "fc1.weight": (5, 16), "fc1.bias": (5,)}
    return graph, _init(shapes), {}


def torch_mlp(P, S, x, labels, training=True):
    h = F.relu(x @ P["fc0.weight"].T + P["fc0.bias"])
    logits = h @ P["fc1.weight"].T + P["fc1.bias"]
    return F.cross_entropy(logits, labels), logits


def mlp_batches(n=3, seed=1):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((8, 20)).astype(np.float32), rng.integers(0, 5, 8)] for _ in range(n)]


def cnn(precision="float32", optimizer=ADAM, bn_outputs=1):
    """x (4, 3, 8, 8) -> conv 3x3 (6) -> batch_norm -> relu -> max_pool 2 -> dense 5.

    bn_outputs: 3 names the new running statistics as node outputs too (as the torch
    frontend does), 1 leaves them to the kernel's state updates alone.
    """
    b = Builder()
    x, labels = b.input("x", (4, 3, 8, 8)), b.input("labels", (4,), "int64")
    h = b.op("conv2d", [x, b.param("conv.weight", (6, 3, 3, 3))], strides=[1, 1], padding=[[1, 1], [1, 1]],
             dilations=[1, 1], layout="NCHW", weight_layout="OIHW")
    h = b.op("batch_norm", [h, b.param("bn.weight", (6,)), b.param("bn.bias", (6,)),
                            b.state("bn.running_mean", (6,)), b.state("bn.running_var", (6,))],
             n_outputs=bn_outputs, axis=1, eps=1e-5, momentum=0.1)
    h = h if bn_outputs == 1 else h[0]
    h = b.op("max_pool2d", [b.op("relu", [h])], kernel=[2, 2], strides=[2, 2], padding="VALID", layout="NCHW")
    h = b.op("reshape", [h], shape=[4, 96])
    logits = b.op("add", [b.op("matmul", [h, b.op("transpose", [b.param("fc.weight", (5, 96))], perm=[1, 0])]),
                          b.param("fc.bias", (5,))])
    loss = b.op("reduce_mean", [b.op("sparse_softmax_cross_entropy", [logits, labels])], axes=None, keepdims=False)
    graph = b.finish(loss, {"logits": logits}, precision, optimizer)
    weights = _init({"conv.weight": (6, 3, 3, 3), "fc.weight": (5, 96), "fc.bias": (5,)})
    weights["bn.weight"] = np.ones(6, np.float32) + _init({"g": (6,)}, 3)["g"]
    weights["bn.bias"] = _init({"b": (6,)}, 4)["b"]
    state = {"bn.running_mean": np.zeros(6, np.float32), "bn.running_var": np.ones(6, np.float32)}
    return graph, weights, state


def torch_cnn(P, S, x, labels, training=True):
    h = F.conv2d(x, P["conv.weight"], padding=1)
    h = F.batch_norm(h, S["bn.running_mean"], S["bn.running_var"], P["bn.weight"], P["bn.bias"], training, 0.1, 1e-5)
    h = F.max_pool2d(F.relu(h), 2).flatten(1)
    logits = h @ P["fc.weight"].T + P["fc.bias"]
    return F.cross_entropy(logits, labels), logits


def cnn_batches(n=3, seed=2):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal((4, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, 4)] for _ in range(n)]


B, T, C, HEADS, D, V, CLASSES = 2, 6, 8, 2, 4, 11, 3


def attention(precision="float32", optimizer=ADAM):
    """ids (2, 6) -> embedding + position -> pre-LN attention block + gelu MLP -> mean pool -> 3 classes."""
    b = Builder("tf")
    ids, labels = b.input("ids", (B, T), "int64"), b.input("labels", (B,), "int64")
    h = b.op("add", [b.op("embedding", [b.param("tok", (V, C)), ids]), b.param("pos", (T, C))])  # (B, T, C)
    a = b.op("layer_norm", [h, b.param("ln1.g", (C,)), b.param("ln1.b", (C,))], axes=[-1], eps=1e-5)
    q, k, v = (b.op("reshape", [b.op("matmul", [a, b.param(w, (C, C))])], shape=[B, T, HEADS, D])
               for w in ("wq", "wk", "wv"))
    scores = b.op("mul", [b.op("einsum", [q, k], equation="bthd,bshd->bhts"), b.constant("scale", 1 / math.sqrt(D))])
    p = b.op("softmax", [scores], axis=-1)  # (B, H, T, T)
    mixed = b.op("reshape", [b.op("einsum", [p, v], equation="bhts,bshd->bthd")], shape=[B, T, C])
    h = b.op("add", [h, b.op("matmul", [mixed, b.param("wo", (C, C))])])
    f = b.op("layer_norm", [h, b.param("ln2.g", (C,)), b.param("ln2.b", (C,))], axes=[-1], eps=1e-5)
    f = b.op("gelu", [b.op("add", [b.op("matmul", [f, b.param("w1", (C, 2 * C))]), b.param("b1", (2 * C,))])],
             approximate="none")
    h = b.op("add", [h, b.op("matmul", [f, b.param("w2", (2 * C, C))])])
    pooled = b.op("reduce_mean", [h], axes=[1], keepdims=False)  # (B, C)
    logits = b.op("add", [b.op("matmul", [pooled, b.param("head.w", (C, CLASSES))]), b.param("head.b", (CLASSES,))])
    loss = b.op("reduce_mean", [b.op("sparse_softmax_cross_entropy", [logits, labels])], axes=None, keepdims=False)
    graph = b.finish(loss, {"logits": logits}, precision, optimizer)
    shapes = {"tok": (V, C), "pos": (T, C), "wq": (C, C), "wk": (C, C), "wv": (C, C), "wo": (C, C),
              "w1": (C, 2 * C), "b1": (2 * C,), "w2": (2 * C, C), "head.w": (C, CLASSES), "head.b": (CLASSES,)}
    weights = _init(shapes)
    for name in ("ln1", "ln2"):
        weights[f"{name}.g"] = 1 + _init({"g": (C,)}, 5)["g"]
        weights[f"{name}.b"] = _init({"b": (C,)}, 6)["b"]
    return graph, {k: weights[k] for k in sorted(weights)}, {}


def torch_attention(P, S, ids, labels, training=True):
    h = F.embedding(ids, P["tok"]) + P["pos"]
    a = F.layer_norm(h, (C,), P["ln1.g"], P["ln1.b"], 1e-5)
    q, k, v = ((a @ P[w]).reshape(B, T, HEADS, D) for w in ("wq", "wk", "wv"))
    p = torch.softmax(torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(D), -1)
    h = h + torch.einsum("bhts,bshd->bthd", p, v).reshape(B, T, C) @ P["wo"]
    f = F.gelu(F.layer_norm(h, (C,), P["ln2.g"], P["ln2.b"], 1e-5) @ P["w1"] + P["b1"])
    h = h + f @ P["w2"]
    logits = h.mean(1) @ P["head.w"] + P["head.b"]
    return F.cross_entropy(logits, labels), logits


def attention_batches(n=3, seed=3):
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, V, (B, T)), rng.integers(0, CLASSES, B)] for _ in range(n)]


MODELS = {
    "mlp": (mlp, torch_mlp, mlp_batches),
    "cnn": (cnn, torch_cnn, cnn_batches),
    "attention": (attention, torch_attention, attention_batches),
}


def _torch_side(weights, state):
    P = {name: torch.tensor(w, requires_grad=True) for name, w in weights.items()}
    S = {name: torch.tensor(s) for name, s in state.items()}
    return P, S


def _torch_grads(torch_fn, P, S, batch):
    loss, logits = torch_fn(P, S, *[torch.tensor(a) for a in batch])
    grads = torch.autograd.grad(loss, list(P.values()))
    return loss.item(), {name: g.numpy() for name, g in zip(P, grads)}, logits.detach().numpy()


def _relative_error(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("model", MODELS)
def test_loss_and_every_gradient_match_torch(model):
    build, torch_fn, batches = MODELS[model]
    graph, weights, state = build()
    program = Program(graph, weights, state)
    batch = batches()[0]
    loss, grads = program.gradients(batch)
    P, S = _torch_side(weights, state)
    expected_loss, expected_grads, logits = _torch_grads(torch_fn, P, S, batch)
    assert loss == pytest.approx(expected_loss, rel=1e-5)
    assert set(grads) == set(weights)
    for name, g in grads.items():
        assert g.dtype == np.float32 and g.shape == weights[name].shape
        np.testing.assert_allclose(g, expected_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)
    for name, s in program.get_state().items():  # the training forward updated the running statistics
        np.testing.assert_allclose(s, S[name].numpy(), rtol=1e-5, atol=1e-7, err_msg=name)
    out = program.forward(batch, training=True)
    assert out["loss"].shape == () and out["loss"].dtype == np.float32
    np.testing.assert_allclose(out["logits"], logits, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model", MODELS)
def test_50_adam_steps_follow_torch(model):
    build, torch_fn, batches = MODELS[model]
    graph, weights, state = build()
    program = Program(graph, weights, state)
    P, S = _torch_side(weights, state)
    optimizer = torch.optim.Adam(P.values(), lr=1e-2)
    data = batches()
    losses = []
    for step in range(50):
        batch = data[step % len(data)]
        loss = program.train_step(batch, 1e-2)
        optimizer.zero_grad()
        expected, _ = torch_fn(P, S, *[torch.tensor(a) for a in batch])
        expected.backward()
        optimizer.step()
        assert isinstance(loss, float)
        assert loss == pytest.approx(expected.item(), rel=1e-4), f"step {step}"
        losses.append(loss)
    assert losses[-1] < losses[0]  # it learns
    for name, w in program.get_weights().items():
        np.testing.assert_allclose(w, P[name].detach().numpy(), rtol=1e-3, atol=1e-4, err_msg=name)
    # eval uses the running statistics, as torch in eval mode
    batch = data[0]
    expected_loss, expected_logits = torch_fn(P, S, *[torch.tensor(a) for a in batch], training=False)
    out = program.eval_step(batch)
    assert float(out["loss"]) == pytest.approx(expected_loss.item(), rel=1e-4)
    np.testing.assert_allclose(out["logits"], expected_logits.detach().numpy(), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("precision", ["bfloat16", "float16", "cb16"])
@pytest.mark.parametrize("model", MODELS)
def test_16_bit_precision_stays_close_to_fp32_torch(model, precision):
    build, torch_fn, batches = MODELS[model]
    # a static loss scale keeps small fp16 gradients out of the subnormals, as users run it
    scaled_adam = OptimizerSpec("adam", "torch", {}, loss_scale=1024.0)
    graph, weights, state = build(precision, scaled_adam)
    program = Program(graph, weights, state)
    P, S = _torch_side(weights, state)
    batch = batches()[0]
    loss, grads = program.gradients(batch)
    expected_loss, expected_grads, _ = _torch_grads(torch_fn, P, S, batch)
    assert loss == pytest.approx(expected_loss, rel=2e-2)
    for name, g in grads.items():
        assert _relative_error(g, expected_grads[name]) < 2e-2, name
    # the logits were computed in the 16-bit format
    logits = program.forward(batch, training=False)["logits"]
    np.testing.assert_array_equal(logits, round_to(logits, precision))
    # and training follows fp32 torch (at Adam's usual 1e-3: its first steps move every
    # weight by about lr whatever the gradient's size, so a larger lr magnifies the
    # sign noise of gradients near zero)
    optimizer = torch.optim.Adam(P.values(), lr=1e-3)
    for step in range(10):
        batch = batches()[step % 3]
        loss = program.train_step(batch, 1e-3)
        optimizer.zero_grad()
        expected, _ = torch_fn(P, S, *[torch.tensor(a) for a in batch])
        expected.backward()
        optimizer.step()
        assert loss == pytest.approx(expected.item(), rel=2e-2), f"step {step}"


def test_dynamic_loss_scaling_skips_overflowing_steps_and_halves_the_scale():
    spec = OptimizerSpec("adam", "torch", {}, loss_scale="dynamic", initial_loss_scale=2.0**24,
                         steps_per_increase=2)
    graph, weights, _ = mlp("float16", spec)
    program = Program(graph, weights)
    batch = mlp_batches()[0]
    # fp16 holds at most 65504: gradients scaled by 2**24 overflow in the backward pass
    loss = program.train_step(batch, 1e-2)
    assert math.isfinite(loss)
    state = program.get_optimizer_state()
    assert state["loss_scale"] == 2.0**23 and state["step"] == 0
    for name, w in program.get_weights().items():
        np.testing.assert_array_equal(w, weights[name])
    scales = [state["loss_scale"]]
    for _ in range(12):
        program.train_step(batch, 1e-2)
        scales.append(program.get_optimizer_state()["loss_scale"])
    # halves until the gradients fit, then doubles after every 2 finite steps
    first_finite = next(i for i in range(1, len(scales)) if scales[i] == scales[i - 1])
    assert all(scales[i] == scales[i - 1] / 2 for i in range(1, first_finite))
    assert scales[first_finite + 1] == 2 * scales[first_finite]
    assert program.get_optimizer_state()["step"] > 0
    assert not np.array_equal(program.get_weights()["fc0.weight"], weights["fc0.weight"])


def test_non_finite_loss_returns_without_an_update():
    graph, weights, state = cnn()
    program = Program(graph, weights, state)
    x, labels = cnn_batches()[0]
    x[0, 0, 0, 0] = np.inf
    loss = program.train_step([x, labels], 1e-2)
    assert not math.isfinite(loss)
    for name, w in program.get_weights().items():
        np.testing.assert_array_equal(w, weights[name])
    for name, s in program.get_state().items():
        np.testing.assert_array_equal(s, state[name])
    assert program.get_optimizer_state()["step"] == 0


@pytest.mark.parametrize("batch, message", [
    ([np.zeros((8, 21), np.float32), np.zeros(8, np.int64)], r"'x': expected shape \(8, 20\), given \(8, 21\)"),
    ([np.zeros((8, 20), np.float32), np.zeros((8, 1), np.int64)], r"'labels': expected shape \(8,\), given \(8, 1\)"),
    ([np.zeros((8, 20), np.float32), np.zeros(8, np.float32)], "'labels': expected int64 values, given float32"),
    ([np.zeros((8, 20), np.float32)], "the batch has 1 arrays, the graph takes 2"),
])
def test_a_bad_batch_raises_user_error(batch, message):
    graph, weights, _ = mlp()
    with pytest.raises(UserError, match=message):
        Program(graph, weights).train_step(batch, 0.1)


def test_out_of_range_labels_name_the_node():
    graph, weights, _ = mlp()
    x, labels = mlp_batches()[0]
    labels[0] = 5
    with pytest.raises(UserError, match="sparse_softmax_cross_entropy.*labels out of range"):
        Program(graph, weights).forward([x, labels], training=False)


@pytest.mark.parametrize("change, message", [
    (lambda w: w.pop("fc0.bias"), "'fc0.bias' is missing"),
    (lambda w: w.update({"fc0.bias": np.zeros(3)}), r"'fc0.bias' has shape \(3,\), the graph expects \(16,\)"),
    (lambda w: w.update({"fc9.bias": np.zeros(3)}), "'fc9.bias' is not a name of this graph"),
])
def test_bad_weights_raise_user_error(change, message):
    graph, weights, _ = mlp()
    change(weights)
    with pytest.raises(UserError, match=message):
        Program(graph, weights)


def test_weights_are_copies_and_set_weights_keeps_training():
    graph, weights, _ = mlp()
    program = Program(graph, weights)
    original = weights["fc0.weight"].copy()
    weights["fc0.weight"][...] = 0  # the caller's array is not the program's
    program.train_step(mlp_batches()[0], 0.1)
    got = program.get_weights()
    assert not np.array_equal(got["fc0.weight"], original)  # trained
    got["fc0.weight"][...] = 7  # nor is what get_weights returns
    assert not np.any(program.get_weights()["fc0.weight"] == 7)
    program.set_weights({"fc0.weight": original})
    np.testing.assert_array_equal(program.get_weights()["fc0.weight"], original)
    assert program.get_weights()["fc0.weight"].dtype == np.float32


def test_resuming_from_saved_weights_state_and_optimizer_continues_identically():
    graph, weights, state = cnn()
    data = cnn_batches()
    first = Program(graph, weights, state)
    for batch in data:
        first.train_step(batch, 1e-2)
    resumed = Program(graph, first.get_weights(), first.get_state())
    resumed.set_optimizer_state(first.get_optimizer_state())
    for batch in data:
        assert first.train_step(batch, 1e-2) == resumed.train_step(batch, 1e-2)
    for name, w in first.get_weights().items():
        np.testing.assert_array_equal(w, resumed.get_weights()[name])
    assert set(first.get_optimizer_state()["conv.weight"]) == {"m", "v"}


def test_dropout_is_seeded_and_off_in_eval():
    graph, weights, _ = mlp(dropout=0.5)
    batch = mlp_batches()[0]
    a, b, c = Program(graph, weights, seed=1), Program(graph, weights, seed=1), Program(graph, weights, seed=2)
    train_a, train_b, train_c = (p.forward(batch, training=True)["loss"] for p in (a, b, c))
    assert train_a == train_b and train_a != train_c
    assert a.eval_step(batch)["loss"] == c.eval_step(batch)["loss"]


def test_a_value_used_twice_sums_its_gradients():
    b = Builder()
    x = b.input("x", (3,))
    w = b.param("w", (3,))
    y = b.op("mul", [b.op("mul", [x, w]), w])  # x * w * w: d/dw = 2 x w
    graph = b.finish(b.op("reduce_sum", [y], axes=None, keepdims=False), {})
    x_value, w_value = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, -1.0, 2.0], np.float32)
    loss, grads = Program(graph, {"w": w_value}).gradients([x_value])
    assert loss == pytest.approx(float(np.sum(x_value * w_value**2)))
    np.testing.assert_allclose(grads["w"], 2 * x_value * w_value)


def test_running_statistics_stay_fp32_in_16_bit_precision():
    graph, weights, state = cnn("bfloat16", bn_outputs=3)
    assert len(graph.nodes[1].outputs) == 3
    program = Program(graph, weights, state)
    program.train_step(cnn_batches()[0], 1e-2)
    reference = Program(*cnn("bfloat16"))  # the same model, statistics as state updates only
    reference.train_step(cnn_batches()[0], 1e-2)
    for name, s in program.get_state().items():
        np.testing.assert_array_equal(s, reference.get_state()[name])
        assert not np.array_equal(s, round_to(s, "bfloat16")), name  # not rounded to 16 bits


def test_stop_gradient_blocks_the_gradient():
    b = Builder("tf")
    x = b.input("x", (3,))
    w = b.param("w", (3,))
    # x * w + stop_gradient(w) * w: d/dw = x + w (the stopped path counts as a constant)
    y = b.op("add", [b.op("mul", [x, w]), b.op("mul", [b.op("identity", [w], stop_gradient=True), w])])
    graph = b.finish(b.op("reduce_sum", [y], axes=None, keepdims=False), {})
    x_value, w_value = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5, -1.0, 2.0], np.float32)
    _, grads = Program(graph, {"w": w_value}).gradients([x_value])
    np.testing.assert_allclose(grads["w"], x_value + w_value)


# --- the survivors of mutation testing (tests/MUTATION.md, the program group) --------------------

def _sum_graph(n_params=1, loss=True, optimizer=ADAM, precision="float32"):
    """x (3,) -> x * p0 * ... -> sum: a graph with ``n_params`` weights named w0, w1, ..."""
    b = Builder()
    y = b.input("x", (3,))
    for i in range(n_params):
        y = b.op("mul", [y, b.param(f"w{i}", (3,))])
    total = b.op("reduce_sum", [y], axes=None, keepdims=False)
    return b.finish(total if loss else None, {"y": y}, precision, optimizer)


def _ones(n):
    return {f"w{i}": np.ones(3, np.float32) for i in range(n)}


def test_constants_keep_integers_and_take_floats_to_float32():
    from device.runtime.program import _constant

    assert _constant(np.array([1, 2])).dtype == np.int64
    assert _constant(np.array([True])).dtype == np.bool_
    assert _constant(np.array([0.1])).dtype == np.float32 and _constant(0.5).dtype == np.float32
    assert _constant(np.array([0.5], np.float16)).dtype == np.float32


def test_a_graph_in_another_precision_or_with_an_unknown_op_is_refused_in_one_line():
    graph = _sum_graph()
    graph.precision = "float64"
    with pytest.raises(UserError, match=r"^graph precision 'float64' is not one of float32, float16, bfloat16, cb16$"):
        Program(graph, _ones(1))
    graph = _sum_graph()
    graph.nodes[0].op = "fancy_op"
    with pytest.raises(UserError, match=r"op 'fancy_op' has no kernel on the device$"):
        Program(graph, _ones(1))


@pytest.mark.parametrize("n, listed", [
    (1, "w0"),
    (6, "w0, w1, w2, w3, w4, w5"),
    (7, "w0, w1, w2, w3, w4, w5, ..."),  # the first six, then "..."
])
def test_an_unknown_weight_names_the_graphs_names(n, listed):
    with pytest.raises(UserError, match=rf"^weights: 'zz' is not a name of this graph \(its names: {listed}\)$"):
        Program(_sum_graph(n), {**_ones(n), "zz": np.ones(3)})
    program = Program(_sum_graph(n), _ones(n))
    with pytest.raises(UserError, match=rf"^weights: 'zz' is not a name of this graph \(its names: {listed}\)$"):
        program.set_weights({"zz": np.ones(3)})
    # a graph without state lists none
    with pytest.raises(UserError, match=r"^state: 'zz' is not a name of this graph \(its names: none\)$"):
        program.set_state({"zz": np.ones(3)})


def test_state_given_is_used_checked_and_set_in_part():
    graph, weights, state = cnn()
    batch = cnn_batches()[0]
    fresh = Program(graph, weights).eval_step(batch)["loss"]  # running mean 0, variance 1
    moved = {"bn.running_mean": np.full(6, 0.5, np.float32), "bn.running_var": np.full(6, 2.0, np.float32)}
    program = Program(graph, weights, moved)
    assert program.eval_step(batch)["loss"] != fresh
    np.testing.assert_array_equal(program.get_state()["bn.running_var"], moved["bn.running_var"])
    with pytest.raises(UserError, match=r"^state: 'bn.running_var' is missing$"):
        Program(graph, weights, {"bn.running_mean": state["bn.running_mean"]})
    # set_state: some names, shapes checked, copies
    update = np.full(6, 3.0, np.float32)
    program.set_state({"bn.running_var": update})
    update[...] = 0
    state_now = program.get_state()
    np.testing.assert_array_equal(state_now["bn.running_var"], np.full(6, 3.0, np.float32))
    np.testing.assert_array_equal(state_now["bn.running_mean"], moved["bn.running_mean"])
    assert state_now["bn.running_var"].dtype == np.float32 and state_now["bn.running_var"].flags.c_contiguous
    with pytest.raises(UserError, match=r"^state: 'bn.running_mean' has shape \(3,\), the graph expects \(6,\)$"):
        program.set_state({"bn.running_mean": np.zeros(3)})


def test_fresh_state_is_what_a_fresh_layer_starts_at():
    graph, weights, state = cnn()
    fresh = Program(graph, weights).get_state()
    assert set(fresh) == {"bn.running_mean", "bn.running_var"}
    np.testing.assert_array_equal(fresh["bn.running_mean"], np.zeros(6, np.float32))
    np.testing.assert_array_equal(fresh["bn.running_var"], np.ones(6, np.float32))
    assert all(s.dtype == np.float32 and s.shape == (6,) for s in fresh.values())


def test_weights_are_stored_float32_in_c_order():
    weights = {"w0": np.asfortranarray(np.arange(3, dtype=np.float64))}
    stored = Program(_sum_graph(1), weights).get_weights()["w0"]
    assert stored.dtype == np.float32 and stored.flags.c_contiguous
    graph, weights, _ = mlp()
    weights["fc0.weight"] = np.asfortranarray(weights["fc0.weight"])
    program = Program(graph, weights)
    assert program._weights["fc0.weight"].flags.c_contiguous  # the kernels' layout, whatever the caller's


def test_a_loss_of_one_element_is_a_scalar_and_a_loss_of_unknown_size_is_not():
    b = Builder()
    y = b.op("mul", [b.input("x", (3,)), b.param("w0", (3,))])
    one = b.op("reduce_sum", [y], axes=[0], keepdims=True)  # shape (1,)
    graph = b.finish(one, {}, "float32", ADAM)
    loss, grads = Program(graph, _ones(1)).gradients([np.array([1.0, 2.0, 3.0], np.float32)])
    assert loss == 6.0 and Program(graph, _ones(1)).forward([np.ones(3, np.float32)], False)["loss"].shape == ()
    np.testing.assert_array_equal(grads["w0"], [1.0, 2.0, 3.0])
    assert Program(graph, _ones(1)).train_step([np.array([1.0, 2.0, 3.0], np.float32)], 0.1) == 6.0
    graph.values[one].shape = (None,)
    with pytest.raises(UserError, match=rf"^the loss '{one}' must be a scalar, its shape is \(None,\)$"):
        Program(graph, _ones(1))


def test_a_graph_without_a_loss_or_optimizer_evaluates_and_refuses_training_in_one_line():
    batch = [np.array([1.0, 2.0, 3.0], np.float32)]
    no_loss = Program(_sum_graph(1, loss=False), _ones(1))
    out = no_loss.eval_step(batch)
    assert set(out) == {"y"} and list(out["y"]) == [1.0, 2.0, 3.0]
    with pytest.raises(UserError, match=r"^gradients needs a loss, and the graph has none$"):
        no_loss.gradients(batch)
    with pytest.raises(UserError, match=r"^train_step needs a loss, and the graph has none$"):
        no_loss.train_step(batch, 0.1)
    no_optimizer = Program(_sum_graph(1, optimizer=None), _ones(1))
    assert no_optimizer.optimizer is None and no_optimizer.gradients(batch)[0] == 6.0
    with pytest.raises(UserError, match=r"^train_step needs an optimizer, and the graph has none$"):
        no_optimizer.train_step(batch, 0.1)
    with pytest.raises(UserError, match=r"^the graph has no optimizer, so there is no optimizer state$"):
        no_optimizer.get_optimizer_state()
    with pytest.raises(UserError, match=r"^the graph has no optimizer, so there is no optimizer state to set$"):
        no_optimizer.set_optimizer_state({})


def test_the_batch_count_error_names_the_inputs():
    graph, weights, _ = mlp()
    with pytest.raises(UserError, match=r"^the batch has 1 arrays, the graph takes 2 \(x, labels\)$"):
        Program(graph, weights).eval_step([np.zeros((8, 20), np.float32)])


def test_the_default_seed_is_0():
    graph, weights, _ = mlp(dropout=0.5)
    batch = mlp_batches()[0]
    default, zero = Program(graph, weights), Program(graph, weights, seed=0)
    assert default.forward(batch, training=True)["loss"] == zero.forward(batch, training=True)["loss"]


def test_eval_step_runs_in_eval_mode():
    # dropout off and running statistics untouched in eval
    graph, weights, state = cnn()
    program = Program(graph, weights, state)
    program.eval_step(cnn_batches()[0])
    for name, s in program.get_state().items():
        np.testing.assert_array_equal(s, state[name])
    graph, weights, _ = mlp(dropout=0.9)
    batch = mlp_batches()[0]
    program = Program(graph, weights)
    assert program.eval_step(batch)["loss"] == program.eval_step(batch)["loss"]


def test_values_are_every_nodes_outputs_and_leave_the_state():
    graph, weights, state = cnn()
    program = Program(graph, weights, state)
    batch = cnn_batches()[0]
    values = program.values(batch, training=True)
    (conv,) = [n for n in graph.nodes if n.op == "conv2d"]
    expected = F.conv2d(torch.tensor(batch[0]), torch.tensor(weights["conv.weight"]), padding=1).numpy()
    np.testing.assert_allclose(values[conv.outputs[0]], expected, rtol=1e-5, atol=1e-5)
    logits = Program(graph, weights, state).forward(batch, training=True)["logits"]
    np.testing.assert_array_equal(values[graph.outputs["logits"]], logits)
    assert set(graph.inputs) | set(graph.params) <= set(values)
    for name, s in program.get_state().items():  # training mode, and still the running statistics given
        np.testing.assert_array_equal(s, state[name])


def test_overflow_on_the_way_warns_nothing():
    # numpy's overflow and invalid-value warnings inside the kernels are noise: the loss and loss
    # scaling check what matters (an overflowing fp16 backward pass here)
    import warnings

    spec = OptimizerSpec("adam", "torch", {}, loss_scale="dynamic", initial_loss_scale=2.0**24)
    graph, weights, _ = mlp("float16", spec)
    batch = mlp_batches()[0]
    large = [batch[0] * 1e4, batch[1]]  # the scaled gradients overflow fp16
    huge = [batch[0] * 1e6, batch[1]]  # beyond fp16's 65504: inf - inf in the forward pass
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Program(graph, weights).train_step(large, 1e-2)
        assert not math.isfinite(float(Program(graph, weights).forward(huge, training=True)["loss"]))


def test_the_backward_pass_computes_in_float32():
    graph, weights, _ = mlp()
    program = Program(graph, weights)
    env, saved, _ = program._forward(mlp_batches()[0], training=True)
    grads = program._backward(env, saved, 1.0)
    assert set(grads) == set(weights) and all(g.dtype == np.float32 for g in grads.values())


def test_in_16_bit_precision_the_node_that_makes_the_loss_stays_float32():
    # the loss is summed in float32 even when no loss op precedes it: 1 + 2**-8 + 2**-9 needs 10
    # bits of mantissa, which bfloat16 (8) would round away
    graph = _sum_graph(1, precision="bfloat16")
    x = np.array([1.0, 2.0**-8, 2.0**-9], np.float32)
    assert Program(graph, _ones(1)).forward([x], training=False)["loss"] == np.float32(1 + 2.0**-8 + 2.0**-9)


def test_in_16_bit_precision_float_constants_outside_the_value_table_are_rounded_and_integers_kept():
    b = Builder()
    x = b.input("x", (3,))
    y = b.op("mul", [x, b.param("w0", (3,))])
    third = b.constant("third", np.float32(1 / 3))
    y = b.op("mul", [y, third])
    index = "index"
    b.graph.constants[index] = np.array([2, 0], np.int64)
    b.examples[index] = b.graph.constants[index]
    picked = b.op("gather", [y, index], axis=0)
    total = b.op("reduce_sum", [picked], axes=None, keepdims=False)
    graph = b.finish(total, {"y": y}, "bfloat16", ADAM)
    del graph.values[third]  # constants as the frontends leave them: not in the value table
    x_value = np.array([100.0, 200.0, 400.0], np.float32)
    out = Program(graph, _ones(1)).forward([x_value], training=False)
    third16 = round_to(np.float32(1 / 3), "bfloat16")
    # 200 / 3 = 66.67 rounds to 66.5 in bfloat16; 200 x bfloat16(1/3) = 66.80 to 67.0
    np.testing.assert_array_equal(out["y"], round_to(x_value * third16, "bfloat16"))
    assert out["y"][1] == 67.0
    assert out["loss"] == np.float32(out["y"][2] + out["y"][0])


def test_fresh_state_of_a_batch_norm_whose_statistics_are_constants():
    # an inference-style batch norm (statistics frozen as constants): no state to start
    graph, weights, _ = cnn()
    for name in ("s:bn.running_mean", "s:bn.running_var"):
        graph.constants[name] = np.zeros(6, np.float32) if name.endswith("mean") else np.ones(6, np.float32)
        del graph.state[name]
    program = Program(graph, weights)
    assert program.get_state() == {}
    assert math.isfinite(float(program.eval_step(cnn_batches()[0])["loss"]))


def test_a_branch_whose_gradient_is_stopped_does_not_end_the_backward_pass():
    # plan: w1's product first, then w0's product, stopped; in reverse order the stopped branch
    # (no gradient) comes before w1's, which must still get its gradient
    b = Builder("tf")
    x = b.input("x", (3,))
    kept = b.op("mul", [x, b.param("w1", (3,))])
    stopped = b.op("identity", [b.op("mul", [x, b.param("w0", (3,))])], stop_gradient=True)
    total = b.op("reduce_sum", [b.op("add", [stopped, kept])], axes=None, keepdims=False)
    graph = b.finish(total, {}, "float32", ADAM)
    x_value = np.array([1.0, 2.0, 3.0], np.float32)
    _, grads = Program(graph, _ones(2)).gradients([x_value])
    np.testing.assert_array_equal(grads["w1"], x_value)
    assert "w0" not in grads or not np.any(grads["w0"])
