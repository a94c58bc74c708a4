"""The PyTorch capture frontend (device/capture/torch/): structure, source lines, numerics.

Structure: op counts, parameter names (state_dict keys), state, unsupported ops reported
as aten nodes at the user's line. Numerics: the emulator (device.runtime.program) runs
the captured graph and must agree with torch's own loss, gradients and Adam steps.
"""

from __future__ import annotations

import collections
import inspect
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.errors import UserError  # noqa: E402
from device.capture.torch import (  # noqa: E402
    capture, load_weights, optimizer_spec, state_of, weights_of)
from device.ops import OPS  # noqa: E402
from device.passes.validate import validate  # noqa: E402


# ---------------------------------------------------------------------------- models

class MLP(nn.Module):
    def __init__(self, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(784, 32)
        self.fc2 = nn.Linear(32, 16)
        self.fc3 = nn.Linear(16, 10)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = self.drop(F.relu(self.fc1(x)))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):  # (N, 1, 8, 8)
        x = self.pool(F.relu(self.bn(self.conv(x))))  # (N, 4, 4, 4)
        return self.fc(x.flatten(1))


class TinyTransformer(nn.Module):
    """One pre-norm block with hand-written causal attention, and a linear head."""

    def __init__(self, vocab: int = 11, dim: int = 16, heads: int = 2, seq: int = 6):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(0.1 * torch.randn(seq, dim))
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)), persistent=False)

    def forward(self, ids):  # (B, T)
        B, T = ids.shape
        x = self.embed(ids) + self.pos  # (B, T, C)
        q, k, v = self.qkv(self.ln1(x)).split(x.shape[-1], dim=-1)
        q, k, v = [t.view(B, T, self.heads, -1).transpose(1, 2) for t in (q, k, v)]  # (B, H, T, D)
        att = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        att = att.masked_fill(~self.causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, -1)  # (B, T, C)
        x = x + self.proj(y)
        x = x + self.mlp(self.ln2(x))
        return self.head(x)  # (B, T, vocab)


class TorchAttentionBlock(nn.Module):
    """nn.MultiheadAttention (scaled_dot_product_attention inside) with a residual."""

    def __init__(self, vocab: int = 11, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.ln = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, vocab)

    def forward(self, ids):
        x = self.embed(ids)
        h = self.ln(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return self.head(x)


class Unsupported(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        values, _ = torch.sort(self.fc(x), dim=1)
        running = torch.cumprod(values, dim=1)
        return running.mean()


class OpMix(nn.Module):
    """Less common ops, each lowered to a few IR ops; the loss sums them all."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(7, 8, padding_idx=0)
        self.fc = nn.Linear(8, 8)
        self.conv = nn.Conv2d(2, 2, 3, stride=2, padding=1)
        self.register_buffer("keep", torch.rand(4, 8, generator=torch.Generator().manual_seed(3)) > 0.5,
                             persistent=False)

    def forward(self, ids, img):  # (2, 4) ids with padding zeros, (2, 2, 6, 6)
        x = self.fc(self.embed(ids)).masked_fill(~self.keep, 0.5)  # (2, 4, 8)
        a = F.leaky_relu(x, 0.1) + F.selu(x) + F.elu(x) + torch.clamp(x, -0.5, 0.5) + torch.sigmoid(x) * torch.tanh(x)
        b = x.var(dim=-1, keepdim=True) + x.pow(2).mean(-1, keepdim=True).sqrt() + x.amax(-1, keepdim=True)
        c = F.avg_pool2d(self.conv(img), 3, stride=1, padding=1).flatten(1)  # (2, 18)
        d = torch.stack([c, 2 * c], dim=1).sum(dim=(1, 2))  # (2,)
        e = torch.cat([a, b], dim=-1)[..., 1:8:2]  # (2, 4, 4)
        return e.sum() + d.sum() + F.gelu(x, approximate="tanh").mean() - (x / 3).exp().mean()


def classify(model):
    """step_fn for a classifier: cross entropy, logits as an output."""
    def step(batch):
        x, labels = batch
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return loss, {"logits": logits}
    return step


def mlp_batch(n=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)]


def cnn_batch():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(2, 1, 8, 8, generator=g), torch.randint(0, 10, (2,), generator=g)]


def token_batch():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(0, 11, (2, 6), generator=g), torch.randint(0, 11, (2, 6), generator=g)]


def line_in(fn, text: str) -> int:
    """The line number, in this file, of the one line of ``fn``'s source containing ``text``."""
    lines, start = inspect.getsourcelines(fn)
    found = [start + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, (text, found)
    return found[0]


def op_counts(graph) -> dict[str, int]:
    return dict(collections.Counter(node.op for node in graph.nodes))


def unsupported(graph) -> list[str]:
    return [node.op for node in graph.nodes if node.op not in OPS]


@pytest.fixture(scope="module")
def mlp_capture():
    torch.manual_seed(0)
    model = MLP()
    return model, capture(classify(model), model, mlp_batch())


# ------------------------------------------------------------------------- structure

def test_mlp_ops_params_inputs_and_outputs(mlp_capture):
    model, graph = mlp_capture
    assert graph.frontend == "torch"
    assert op_counts(graph) == {"transpose": 3, "matmul": 3, "add": 3, "relu": 2,
                                "cross_entropy_loss": 1}
    assert graph.params == {k: k for k in model.state_dict()}  # fc1.weight, fc1.bias, ...
    assert graph.state == {} and graph.constants == {}
    assert [graph.values[v].shape for v in graph.inputs] == [(4, 784), (4,)]
    assert [graph.values[v].dtype for v in graph.inputs] == ["float32", "int64"]
    assert graph.values[graph.loss].shape == ()
    assert list(graph.outputs) == ["logits"]
    assert graph.values[graph.outputs["logits"]].shape == (4, 10)
    # the weights reach the matmuls transposed, as torch's x @ W.T
    transposes = [n for n in graph.nodes if n.op == "transpose"]
    assert [n.inputs for n in transposes] == [["fc1.weight"], ["fc2.weight"], ["fc3.weight"]]
    assert all(n.attrs["perm"] == [1, 0] for n in transposes)


def test_mlp_source_lines_point_at_the_forward_and_the_loss(mlp_capture):
    _, graph = mlp_capture
    forward_lines = [line_in(MLP.forward, f"self.fc{i}(x)") for i in (1, 2, 3)]
    matmuls = [n for n in graph.nodes if n.op == "matmul"]
    assert [n.loc.file for n in matmuls] == [__file__] * 3
    assert [n.loc.line for n in matmuls] == forward_lines
    assert matmuls[0].loc.framework_op == "aten.linear.default"
    assert [n.loc.line for n in graph.nodes if n.op == "relu"] == forward_lines[:2]
    loss_line = line_in(classify, "F.cross_entropy")
    assert [n.loc.line for n in graph.nodes if n.op == "cross_entropy_loss"] == [loss_line]


def test_dropout_rate_and_train_mode_restored():
    model = MLP(dropout=0.25).eval()
    graph = capture(classify(model), model, mlp_batch())
    assert [n.attrs for n in graph.nodes if n.op == "dropout"] == [{"rate": 0.25}]
    assert not model.training and not model.drop.training


def test_cnn_captures_with_batch_norm_state():
    model = CNN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = capture(classify(model), model, cnn_batch())
    assert unsupported(graph) == []
    counts = op_counts(graph)
    assert {op: counts[op] for op in ("conv2d", "batch_norm", "relu", "max_pool2d", "matmul")} == \
        {"conv2d": 1, "batch_norm": 1, "relu": 1, "max_pool2d": 1, "matmul": 1}
    assert graph.state == {"bn.running_mean": "bn.running_mean", "bn.running_var": "bn.running_var"}
    assert set(graph.params) == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"}
    (conv,) = [n for n in graph.nodes if n.op == "conv2d"]
    assert conv.attrs == {"strides": [1, 1], "padding": [[1, 1], [1, 1]], "dilations": [1, 1],
                          "layout": "NCHW", "weight_layout": "OIHW"}
    (bn,) = [n for n in graph.nodes if n.op == "batch_norm"]
    assert bn.inputs[3:] == ["bn.running_mean", "bn.running_var"]
    assert len(bn.outputs) == 3  # y and the two new running statistics
    assert bn.attrs == {"axis": 1, "eps": 1e-5, "momentum": 0.1}
    (pool,) = [n for n in graph.nodes if n.op == "max_pool2d"]
    assert pool.attrs["kernel"] == [2, 2] and pool.attrs["strides"] == [2, 2]
    # capture traces with fake tensors: the module's weights and statistics are untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_transformer_block_captures_with_folded_causal_mask():
    model = TinyTransformer()
    graph = capture(classify(model), model, token_batch())
    assert unsupported(graph) == []
    counts = op_counts(graph)
    for op in ("embedding", "layer_norm", "softmax", "gelu", "cross_entropy_loss"):
        assert counts.get(op, 0) >= 1, op
    assert counts["layer_norm"] == 2 and counts["softmax"] == 1
    assert "causal" not in graph.state and "pos" in graph.params
    # the mask buffer is known at capture time: masked_fill becomes a constant mask and fill
    assert any(c.shape == (6, 6) for c in graph.constants.values())
    (softmax,) = [n for n in graph.nodes if n.op == "softmax"]
    assert softmax.loc.line == line_in(TinyTransformer.forward, "masked_fill")


def test_multihead_attention_captures():
    model = TorchAttentionBlock()
    graph = capture(classify(model), model, token_batch())
    assert unsupported(graph) == []
    assert op_counts(graph)["softmax"] == 1
    assert {"attn.in_proj_weight", "attn.out_proj.weight"} <= set(graph.params)


def test_unsupported_ops_become_aten_nodes_at_their_lines():
    model = Unsupported()
    graph = capture(lambda batch: model(batch[0]), model, [torch.randn(2, 4)])
    nodes = [n for n in graph.nodes if n.op not in OPS]
    assert [n.op for n in nodes] == ["aten.sort.default", "aten.cumprod.default"]
    assert [(n.loc.file, n.loc.line) for n in nodes] == [
        (__file__, line_in(Unsupported.forward, "torch.sort")),
        (__file__, line_in(Unsupported.forward, "torch.cumprod"))]
    sort, cumsum = nodes
    assert [graph.values[v].dtype for v in sort.outputs] == ["float32", "int64"]  # values and indices
    assert cumsum.inputs == [sort.outputs[0]]
    assert graph.values[cumsum.outputs[0]].shape == (2, 4)


def test_an_unsupported_variant_keeps_the_aten_name_and_a_reason():
    model = nn.ConvTranspose2d(4, 4, 3, groups=2)
    graph = capture(lambda batch: model(batch[0]).sum(), model, [torch.randn(1, 4, 5, 5)])
    (node,) = [n for n in graph.nodes if n.op not in OPS]
    assert node.op == "aten.convolution.default"
    assert "groups=2" in node.attrs["reason"]


def test_float64_and_mismatched_batch_come_through_as_they_are():
    model = MLP().double()

    def step(batch):
        x, weights = batch
        return model(x).mean() + weights.mean()

    graph = capture(step, model, [torch.randn(4, 784, dtype=torch.float64), torch.rand(3, dtype=torch.float64)],
                    precision="bfloat16")
    assert [graph.values[v].shape for v in graph.inputs] == [(4, 784), (3,)]
    assert {graph.values[p].dtype for p in graph.params} == {"float64"}
    assert graph.values[graph.loss].dtype == "float64"
    assert graph.precision == "bfloat16"


class Spectral(nn.Module):
    """Features through an FFT (complex64), and a complex scalar: the user's dtypes, not the frontend's."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)

    def forward(self, x):  # (N, 8)
        magnitude = torch.fft.rfft(x, dim=-1).abs()  # (N, 5) complex64 -> float32
        rotated = (x * 1j).real  # a Python complex scalar
        return self.fc(magnitude).sum() + rotated.sum()


def test_complex_values_are_validation_errors_at_the_users_lines():
    model = Spectral()
    graph = capture(lambda batch: model(batch[0]), model, [torch.randn(4, 8)])  # a TypeError before
    report = validate(graph, mode="train", profile=None)
    dtype_lines = {(f.file, f.line) for f in report.errors if f.kind == "dtype"}
    assert dtype_lines == {(__file__, line_in(Spectral.forward, "rfft")), (__file__, line_in(Spectral.forward, "1j"))}
    fft = next(f for f in report.errors if f.kind == "dtype" and f.framework_op == "aten._fft_r2c.default")
    assert "has dtype complex64" in fft.message and "input pipeline" in fft.suggestion
    assert "frontend bug" not in report.to_text()


def test_frozen_parameters_are_state():
    model = MLP()
    model.fc1.requires_grad_(False)
    graph = capture(classify(model), model, mlp_batch())
    assert set(graph.state) == {"fc1.weight", "fc1.bias"}
    assert set(graph.params) == {"fc2.weight", "fc2.bias", "fc3.weight", "fc3.bias"}
    assert set(weights_of(model, graph)) == set(graph.params)
    assert set(state_of(model, graph)) == set(graph.state)


def test_bad_steps_raise_user_errors():
    model = MLP()
    with pytest.raises(UserError, match="must return the loss"):
        capture(lambda batch: "loss", model, mlp_batch())
    with pytest.raises(UserError, match=r"^batch\[0\] is a ndarray; the device takes a batch whose values are tensors"):
        capture(classify(model), model, [np.zeros((4, 784))])

    def data_dependent(batch):
        out = model(batch[0])
        return out.sum() if out.sum() > 0 else -out.sum()

    with pytest.raises(UserError, match="torch.export could not capture"):
        capture(data_dependent, model, mlp_batch())


# ------------------------------------------------------------------------- optimizer

def test_sgd_and_momentum():
    model = MLP()
    spec = optimizer_spec(torch.optim.SGD(model.parameters(), lr=0.1), model)
    assert (spec.kind, spec.semantics, spec.hyper["lr"], spec.hyper["momentum"]) == ("sgd", "torch", 0.1, 0.0)
    spec = optimizer_spec(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                                          weight_decay=1e-4), model)
    assert spec.kind == "momentum"
    assert (spec.hyper["momentum"], spec.hyper["nesterov"], spec.hyper["weight_decay"]) == (0.9, True, 1e-4)


def test_adam_and_adamw_with_weight_decay_exclusions():
    model = MLP()
    spec = optimizer_spec(torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.8, 0.99), eps=1e-7), model)
    assert spec.kind == "adam"
    assert {k: spec.hyper[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay")} == \
        {"lr": 1e-3, "beta1": 0.8, "beta2": 0.99, "eps": 1e-7, "weight_decay": 0.0}
    biases = [p for name, p in model.named_parameters() if name.endswith("bias")]
    others = [p for name, p in model.named_parameters() if not name.endswith("bias")]
    adamw = torch.optim.AdamW([{"params": others}, {"params": biases, "weight_decay": 0.0}], lr=1e-3,
                              weight_decay=0.01)
    spec = optimizer_spec(adamw, model)
    assert spec.kind == "adamw" and spec.hyper["weight_decay"] == 0.01
    assert spec.weight_decay_exclude == ("fc1.bias", "fc2.bias", "fc3.bias")


def test_capture_carries_the_optimizer_clipping_and_loss_scaling(mlp_capture):
    model = MLP()
    graph = capture(classify(model), model, mlp_batch(), optimizer=torch.optim.Adam(model.parameters()),
                    max_gradient_norm=1.0, loss_scale="dynamic", steps_per_increase=100)
    spec = graph.optimizer
    assert (spec.kind, spec.max_gradient_norm, spec.loss_scale, spec.steps_per_increase) == \
        ("adam", 1.0, "dynamic", 100)


def test_unsupported_optimizers_and_groups_are_user_errors():
    model = MLP()
    with pytest.raises(UserError, match=r"RMSprop.*SGD, Adam, AdamW"):
        optimizer_spec(torch.optim.RMSprop(model.parameters()), model)
    groups = [{"params": model.fc1.parameters(), "lr": 0.1}, {"params": model.fc2.parameters()}]
    with pytest.raises(UserError, match="different lr"):
        optimizer_spec(torch.optim.SGD(groups, lr=0.01), model)
    with pytest.raises(UserError, match="amsgrad"):
        optimizer_spec(torch.optim.Adam(model.parameters(), amsgrad=True), model)


# ---------------------------------------------------------------- weights and state

def test_weights_and_state_round_trip():
    model, other = CNN(), CNN()
    load_weights(other, weights_of(model))
    load_weights(other, state_of(model))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    assert set(state_of(model)) == {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"}
    with pytest.raises(UserError, match="'nope' is not a parameter or buffer"):
        load_weights(model, {"nope": np.zeros(1)})
    with pytest.raises(UserError, match="has shape"):
        load_weights(model, {"fc.bias": np.zeros(3)})


# ------------------------------------------------------------------------- numerics

def torch_loss_and_grads(model, step, batch):
    model.train()
    model.zero_grad()
    loss = step(batch)[0]
    loss.backward()
    return loss.item(), {name: p.grad.numpy() for name, p in model.named_parameters()}


def assert_matches_torch(graph, model, step, batch, loss_rtol=1e-5):
    """The emulator's loss of ``step(batch)`` (a scalar) and every parameter's gradient against
    torch's; the emulator's gradients."""
    from device.runtime.program import Program

    loss, grads = Program(graph, weights_of(model, graph), seed=0).gradients([t.numpy() for t in batch])
    model.zero_grad()
    expected = step(batch)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=loss_rtol)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    return grads


@pytest.mark.parametrize("make_model, make_batch", [(MLP, mlp_batch), (CNN, cnn_batch),
                                                    (TinyTransformer, token_batch),
                                                    (TorchAttentionBlock, token_batch)],
                         ids=["mlp", "cnn", "transformer", "multihead_attention"])
def test_emulator_loss_and_gradients_match_torch(make_model, make_batch):
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = make_model()
    step, batch = classify(model), make_batch()
    graph = capture(step, model, batch)
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    arrays = [t.numpy() for t in batch]
    expected_loss, expected = torch_loss_and_grads(model, step, batch)

    loss, grads = program.gradients(arrays)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert set(grads) == set(graph.params)
    # entries that are zero in exact arithmetic (a conv bias under batch norm) are rounding
    # noise in both: an absolute tolerance relative to the largest gradient covers them
    atol = 1e-5 * max(np.abs(g).max() for g in expected.values())
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, expected[name], rtol=1e-5, atol=atol, err_msg=name)
    outputs = program.forward(arrays, training=True)
    np.testing.assert_allclose(outputs["loss"], expected_loss, rtol=1e-5)
    assert outputs["logits"].shape == tuple(model(batch[0]).shape)


def test_emulator_matches_torch_on_less_common_ops():
    torch.manual_seed(0)
    model = OpMix()
    batch = [torch.tensor([[0, 3, 5, 0], [6, 0, 1, 2]]), torch.randn(2, 2, 6, 6)]
    graph = capture(lambda b: model(*b), model, batch)
    assert unsupported(graph) == []
    grads = assert_matches_torch(graph, model, lambda b: model(*b), batch)
    assert not grads["embed.weight"][0].any()  # the padding row gets no gradient, as in torch


def test_softplus_is_one_node_and_matches_torch():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)

    def step(batch):
        x, y = batch
        return F.cross_entropy(F.softplus(model(x), beta=2.0, threshold=5.0), y)

    batch = [torch.randn(8, 4) * 3, torch.randint(0, 3, (8,))]
    graph = capture(step, model, batch)
    assert unsupported(graph) == [] and validate(graph, mode="train", profile=None).ok
    (node,) = [n for n in graph.nodes if n.op == "softplus"]  # kept whole, not decomposed
    assert node.attrs == {"beta": 2.0, "threshold": 5.0}
    assert_matches_torch(graph, model, step, batch)


def test_fifty_adam_steps_of_the_mlp_match_torch():
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = classify(model)
    graph = capture(step, model, mlp_batch(8), optimizer=optimizer)
    program = Program(graph, weights_of(model, graph), seed=0)

    batches = [mlp_batch(8, seed=100 + i) for i in range(5)]
    expected, got = [], []
    for i in range(50):
        batch = batches[i % len(batches)]
        optimizer.zero_grad()
        loss = step(batch)[0]
        loss.backward()
        optimizer.step()
        expected.append(loss.item())
        got.append(program.train_step([t.numpy() for t in batch], lr=1e-3))
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    assert np.mean(expected[-5:]) < 0.8 * np.mean(expected[:5])  # the steps did train
    final = program.get_weights()
    np.testing.assert_allclose(final["fc3.weight"], model.fc3.weight.detach().numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("make_model, make_batch, kinds", [
    (CNN, cnn_batch, {"conv", "pool", "dense", "softmax_loss"}),
    (TinyTransformer, token_batch, {"embedding", "layer_norm", "attention", "dense", "softmax_loss"}),
], ids=["cnn", "transformer"])
def test_cnn_and_transformer_validate_compile_and_train_on_the_emulator(make_model, make_batch, kinds, tmp_path):
    """Beyond the MLP: the zoo's vision and language building blocks go through every stage."""
    from device.api import compile_graph, validate_graph
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = make_model()
    step, batch = classify(model), make_batch()
    graph = capture(step, model, batch, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    assert validate_graph(graph, mode="train", profile_name="small").ok
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    assert kinds <= {k.kind for k in result.kernels}
    assert sorted(p.name for p in tmp_path.joinpath("compile").iterdir()) == [
        "ir.json", "placement.svg", "report.json", "report.txt"]
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    arrays = [t.numpy() for t in batch]
    losses = [program.train_step(arrays, 1e-2) for _ in range(10)]
    assert losses[-1] < 0.5 * losses[0]  # it learns the (fixed) batch


# --------------------------------------------------- language ops: masks, gathers, tied weights

class LanguageOps(nn.Module):
    """Padding masks, comparisons, position buckets and gathers, each on batch-dependent values."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(9, 8, padding_idx=0)
        self.fc = nn.Linear(8, 8)

    def forward(self, ids, positions):  # (2, 5) ids, 0 = padding; (2, 2) positions to predict
        pad = ids == 0  # (B, T) bool
        keep = ~pad
        x = self.fc(self.embed(ids))  # (B, T, C)
        scores = x @ x.transpose(1, 2)  # (B, T, T)
        scores = scores.masked_fill(pad[:, None, :], float("-inf")).softmax(-1)  # boolean padding mask
        a = torch.where(keep[..., None], scores @ x, -x)  # (B, T, C)
        both = ((ids > 2) & (ids <= 6) | ~(ids != 4)) > (ids == 8)  # an ordering of bools too
        b = a * both[..., None].float() + (x.abs() + 1).log1p() + torch.floor(x * 3) * x
        pos = torch.cumsum(keep.long(), dim=1) * keep.long()  # position ids that skip padding
        bucket = torch.minimum(pos // 2, torch.full_like(pos, 1)) + torch.div(pos, 3, rounding_mode="floor")
        c = b + self.embed(bucket)
        picked = c[torch.arange(2)[:, None], positions]  # (B, 2, C): BERT's masked-position gather
        column = c[..., 0].index_select(1, torch.tensor([4, 1]))  # (B, 2)
        taken = torch.gather(c, 1, positions[..., None].expand(2, 2, 8))  # (B, 2, C)
        attn = F.scaled_dot_product_attention(x[:, None], x[:, None], x[:, None], attn_mask=keep[:, None, None, :])
        last = c[torch.arange(2)[:, None], positions - 5] * c[:, torch.tensor([-1, 0])]  # negative indices
        return picked.sum() + column.pow(2).sum() + (taken * picked).mean() + attn.mean() + last.mean()


def language_batch():
    return [torch.tensor([[3, 5, 8, 0, 0], [1, 4, 6, 7, 2]]), torch.tensor([[2, 0], [4, 4]])]


def test_language_ops_lower_to_device_ops_and_match_torch():
    torch.manual_seed(0)
    model = LanguageOps()
    with torch.no_grad():
        model.embed.weight[0] = 0.5  # padding_idx's row is read as it is (here not zero), and never trained
    batch = language_batch()
    graph = capture(lambda b: model(*b), model, batch)
    assert unsupported(graph) == []
    assert validate(graph, mode="train", profile=None).ok
    assert {"where", "logical_not", "logical_and", "logical_or", "greater", "less_equal", "not_equal", "abs",
            "log1p", "floor", "cumsum", "floor_div", "gather", "take_along_axis"} <= set(op_counts(graph))
    grads = assert_matches_torch(graph, model, lambda b: model(*b), batch)
    assert not grads["embed.weight"][0].any()  # the padding row gets no gradient, as in torch



def test_attention_rows_that_attend_nowhere_give_zeros_as_in_torch():
    """A left-padded causal batch: the padding queries see no key, and torch's sdpa gives them zeros
    (not NaN), so the gradients stay finite."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    x = torch.randn(2, 5, 4)
    keep = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])

    def step(batch):
        h = model(batch[0])[:, None]  # (B, 1, T, C)
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        mask = causal[None, None] & batch[1].bool()[:, None, None, :]  # row 0 of example 1: all False
        return (F.scaled_dot_product_attention(h, h, h, attn_mask=mask) * h).sum()

    graph = capture(step, model, [x, keep])
    assert unsupported(graph) == []
    assert_matches_torch(graph, model, step, [x, keep])


class SliceAssignment(nn.Module):
    """Assignments into tensors: a slice, a strided slice, one position, a broadcast value, in place on
    a view, under a mask, at listed positions, and the shifted labels of BART and T5 (``shifted[:, 1:] = ids[:, :-1]``) on integers."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.embed = nn.Embedding(9, 4)

    def forward(self, x, ids):  # (B, 6, 4) floats, (B, 6) ids
        h = self.fc(x)
        out = h * 2
        out[:, 1:] = h[:, :-1] * 3  # slice_scatter: gradients reach both sides
        out[:, ::2, 1] = h[:, 1::2, 0]  # a strided slice
        out[:, -1] = self.fc.bias  # select_scatter with a broadcast source
        out[ids > 5] = 0.5  # index_put: a boolean mask over the leading axes, one value
        out[:, torch.tensor([0, 3])] = h[:, 1:3] * 5  # index_put at constant positions
        out[:, :2].exp_()  # in place on a view
        shifted = ids.new_zeros(ids.shape)
        shifted[:, 1:] = ids[:, :-1].clone()
        shifted[:, 0] = 7
        rest = (h % 0.7).sum() + h.remainder(self.fc.bias.abs() + 0.3).sum()  # remainder, both operands
        return (out * out.flip(1)).sum() + self.embed(shifted % 7 - ids % -2).pow(2).sum() + rest


def test_slice_and_element_assignment_match_torch():
    torch.manual_seed(0)
    model = SliceAssignment()
    batch = [torch.randn(2, 6, 4), torch.tensor([[1, 2, 3, 4, 5, 6], [8, 7, 6, 5, 4, 3]])]
    graph = capture(lambda b: model(*b), model, batch)
    assert unsupported(graph) == []
    assert validate(graph, mode="train", profile=None).ok
    assert_matches_torch(graph, model, lambda b: model(*b), batch)


@pytest.mark.parametrize("write, reason", [
    (lambda h, ids: h.index_put_((torch.tensor([0, 2]),), h[:2], accumulate=True), "accumulate=True"),
    (lambda h, ids: h.__setitem__(ids[0] > 3, torch.ones(4, 4)), "a value per selected element"),
    (lambda h, ids: h.__setitem__((ids[0] // 4, ids[1] // 4), 0.0), "more than one axis"),
], ids=["accumulate", "a value per masked element", "two axes"])
def test_index_put_that_cannot_run_is_refused_with_its_reason(write, reason):
    model = nn.Linear(4, 4)

    def step(batch):
        h = model(batch[0])
        write(h, batch[1])
        return h.sum()

    graph = capture(step, model, [torch.randn(8, 4), torch.tensor([[1, 5, 2, 6, 4, 0, 3, 7]] * 2)])
    refused = [n for n in graph.nodes if n.op not in OPS]
    assert [n.op for n in refused] == ["aten.index_put.default"]
    assert reason in refused[0].attrs["reason"]

class Tied(nn.Module):
    """GPT-2's tied head: the output projection is the token embedding."""

    def __init__(self):
        super().__init__()
        self.tok_emb = nn.Embedding(7, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.tok_emb.weight
        self.register_buffer("count", torch.zeros(()), persistent=False)

    def forward(self, ids):
        return self.head(self.tok_emb(ids))


def test_tied_weights_are_one_weight_with_the_gradients_summed():
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = Tied()
    batch = [torch.randint(0, 7, (2, 3)), torch.randint(0, 7, (2, 3))]
    step = classify(model)
    graph = capture(step, model, batch, optimizer=torch.optim.Adam(model.parameters(), lr=1e-2))
    assert list(graph.params.values()) == ["tok_emb.weight"]  # one weight, named as named_parameters() lists it
    assert validate(graph, mode="train", profile=None).ok
    program = Program(graph, weights_of(model, graph), state_of(model, graph))
    loss, grads = program.gradients([t.numpy() for t in batch])
    expected_loss, expected = torch_loss_and_grads(model, step, batch)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(grads["tok_emb.weight"], expected["tok_emb.weight"], rtol=1e-5, atol=1e-7)
    # trained on the emulator, written back: the checkpoint (state_dict) has it under both keys
    program.train_step([t.numpy() for t in batch], 1e-2)
    load_weights(model, program.get_weights())
    saved = model.state_dict()
    np.testing.assert_array_equal(saved["head.weight"].numpy(), program.get_weights()["tok_emb.weight"])
    np.testing.assert_array_equal(saved["tok_emb.weight"].numpy(), saved["head.weight"].numpy())
    load_weights(model, {"head.weight": np.zeros((7, 4), np.float32)})  # either key loads the one tensor
    assert not model.tok_emb.weight.detach().numpy().any()


def test_a_weight_name_the_module_lacks_is_a_validation_error():
    torch.manual_seed(0)
    model = Tied()
    batch = [torch.randint(0, 7, (2, 3)), torch.randint(0, 7, (2, 3))]
    graph = capture(classify(model), model, batch)
    graph.params["tok_emb.weight"] = "renamed.weight"  # as if the module had changed since capture
    from device.capture.torch.variables import _check_names
    _check_names(graph, model)
    report = validate(graph, mode="train", profile=None)
    assert not report.ok and any("'renamed.weight' is not a parameter or buffer" in f.message for f in report.errors)


@pytest.mark.parametrize("attend", [
    lambda h, keep: F.scaled_dot_product_attention(h, h, h, attn_mask=keep.bool()[:, None, None, :]),
    lambda h, keep: F.scaled_dot_product_attention(  # HF's additive form, float32's lowest on the padding
        h, h, h, attn_mask=(1.0 - keep[:, None, None, :].float()) * torch.finfo(torch.float32).min),
    lambda h, keep: F.scaled_dot_product_attention(h, h, h, attn_mask=(keep[:, None, None, :] - 1.0) * 1e4),
    lambda h, keep: F.scaled_dot_product_attention(h, h, h, is_causal=True),
    lambda h, keep: torch.where(keep.bool()[:, None, :, None], h, 0.0),
    lambda h, keep: torch.where(keep.bool()[:, None, :, None], -2.0, h.exp()),
    lambda h, keep: torch.where(keep[:, None, :, None] > 0, 2.0, -1.0) * h,
], ids=["sdpa-bool", "sdpa-lowest", "sdpa-additive", "sdpa-causal", "where-other", "where-self", "where-scalars"])
def test_attention_masks_and_where_forms_from_the_batch_match_torch(attend):
    """Masks that depend on the batch (rows of 5 and 3 tokens), as encoders build them."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    batch = [torch.randn(2, 5, 4), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])]

    def step(b):
        h = model(b[0])[:, None]  # (B, 1, T, C)
        return (attend(h, b[1]) * h).sum()

    graph = capture(step, model, batch)
    assert unsupported(graph) == []
    assert_matches_torch(graph, model, step, batch)


def test_exclusive_or_of_masks_is_not_equal_and_matches_torch():
    """``a ^ b`` on bool masks and logical_xor on integers (nonzero is true), both weighting a loss."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    batch = [torch.randn(2, 5, 4), torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])]

    def step(b):
        h, keep = model(b[0]), b[1]
        either = (keep.bool() ^ keep.flip(1).bool()).float() + 2 * torch.logical_xor(keep, keep.roll(1, 1)).float()
        return (h.pow(2).sum(-1) * (either + 1)).sum()

    graph = capture(step, model, batch)
    assert unsupported(graph) == [] and op_counts(graph)["not_equal"] == 2
    assert_matches_torch(graph, model, step, batch, loss_rtol=1e-6)


@pytest.mark.parametrize("make_step, reason", [
    (lambda: (lambda b: (b[0] & (b[0] + 1)).float().sum() + b[1].sum()), "bitwise operation on int64"),
    (lambda: (lambda b: torch.div(b[1], 2.0, rounding_mode="trunc").sum()), "rounding_mode='trunc'"),
    (lambda: (lambda b: b[1][b[1] > 0].sum()), "boolean (mask) indexing"),
    (lambda: (lambda b: (b[0] ^ b[0].flip(1)).float().sum() + b[1].sum()), "bitwise operation on int64"),
], ids=["bitwise-int", "trunc-div", "mask-index", "xor-int"])
def test_language_forms_the_device_lacks_are_refused_with_a_reason(make_step, reason):
    model = nn.Linear(1, 1)
    graph = capture(make_step(), model, [torch.tensor([[1, 2]]), torch.randn(1, 1)])
    report = validate(graph, mode="train", profile=None)
    assert any(reason in f.message and f.file == __file__ for f in report.errors), report.to_text()


@pytest.mark.parametrize("gelu", [
    lambda h: h * 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0))),  # BERT's own gelu
    lambda h: 0.5 * h * (1 + torch.erf(h * (1 / math.sqrt(2.0)))),
    lambda h: h * (0.5 * (1.0 + torch.erf(h / math.sqrt(2.0)))),
    lambda h: h * (1.0 + torch.erf(h / math.sqrt(2.0))) * 0.5,
], ids=["x-half", "half-x-mul", "half-inside", "half-last"])
def test_a_gelu_written_with_erf_is_one_gelu_node_in_its_dense_kernel(gelu):
    from device.passes.match import match
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 3))

    def step(batch):
        x, y = batch
        return F.cross_entropy(model[1](gelu(model[0](x))), y)

    batch = [torch.randn(5, 4), torch.randint(0, 3, (5,))]
    graph = capture(step, model, batch)
    assert op_counts(graph).get("gelu") == 1 and "erf" not in op_counts(graph)
    assert [k.kind for k in match(graph)] == ["dense", "dense", "softmax_loss"]
    assert_matches_torch(graph, model, step, batch)


def test_an_erf_that_is_not_a_gelu_stays_as_written():
    model = nn.Linear(4, 3)
    graph = capture(lambda b: (0.5 * (1.0 + torch.erf(model(b[0]) / 2.0))).sum(), model, [torch.randn(2, 4)])
    assert "gelu" not in op_counts(graph) and op_counts(graph)["erf"] == 1


def test_masked_fill_with_a_mask_buffer_keeps_an_inf_in_the_unchosen_place_out():
    from device.runtime.program import Program

    class LogMasked(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)
            self.register_buffer("keep", torch.tensor([True, True, False]), persistent=False)

        def forward(self, x):  # relu gives zeros in the masked column: log there is -inf
            return torch.log(F.relu(self.fc(x)) + self.keep.float() * 0.5).masked_fill(~self.keep, 0.0).sum()

    torch.manual_seed(0)
    model = LogMasked()
    with torch.no_grad():
        model.fc.weight[2] = 0.0
        model.fc.bias[2] = -1.0
    batch = [torch.randn(4, 3)]
    graph = capture(lambda b: model(b[0]), model, batch)
    assert "where" in op_counts(graph)
    loss, grads = Program(graph, weights_of(model, graph)).gradients([batch[0].numpy()])
    model.zero_grad()
    expected = model(batch[0])
    expected.backward()
    assert np.isfinite(loss)
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    np.testing.assert_allclose(grads["fc.weight"], model.fc.weight.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_model_that_autocasts_itself_is_costed_at_the_16_bit_rate_where_it_casts():
    """torch.autocast inside forward in a float32 run: the kernels whose inputs the model cast to
    bfloat16 compute at the 16-bit rate (twice float32's), the rest at float32's; the warning
    says so rather than "float32 runs at half the rate" for all of it."""
    from device import api

    class Net(nn.Module):
        def __init__(self, cast: bool):
            super().__init__()
            self.cast, self.hidden, self.out = cast, nn.Linear(64, 64), nn.Linear(64, 3)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.cast):
                h = torch.relu(self.hidden(x))
            return self.out(h.float())

    torch.manual_seed(0)
    batch = [torch.randn(16, 64), torch.randint(0, 3, (16,))]
    rows, warnings = {}, {}
    for cast in (False, True):
        net = Net(cast)
        graph = api.capture_torch(lambda b: F.cross_entropy(net(b[0]), b[1]), net, batch,
                                  optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        result = api.compile_graph(graph, mode="train", profile_name="wse2")
        kernels = {k.name: k for k in result.kernels}
        rows[cast] = {c.name: (kernels[c.name], c) for c in result.cost.kernels if c.pes}
        warnings[cast] = api.validate_graph(graph, mode="train", profile_name="wse2").to_text()
    (plain, plain_cost), (cast, cast_cost) = rows[False]["dense_0"], rows[True]["dense_0"]
    assert (plain.precision, cast.precision) == ("", "bfloat16") and rows[True]["dense_1"][0].precision == ""
    # the same work: per PE, the cast kernel's compute takes half the time
    per_pe = lambda c: c.compute_s * c.pes  # noqa: E731
    assert cast_cost.flops == plain_cost.flops
    assert per_pe(cast_cost) == pytest.approx(per_pe(plain_cost) / 2)
    assert per_pe(rows[True]["dense_1"][1]) == pytest.approx(per_pe(rows[False]["dense_1"][1]))
    assert "casts to bfloat16 itself" in warnings[True] and "casts" not in warnings[False]


# ---------------------------------------------- integer arithmetic: exact on int64, as torch's

class IntegerArithmetic(nn.Module):
    """A question-answering head's clamp of its span positions before a cross entropy whose
    ignore_index is the sequence length (Hugging Face's ``start_positions.clamp(0, ignored_index)``),
    and integer arithmetic on values beyond float64's 53 bits, each result an output."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)

    def forward(self, x, positions, big, divisor):  # x: (B, 4); positions: (B,); big, divisor: (B, 3) int64
        logits = self.fc(x)  # (B, 6): a score per position
        ignored = logits.shape[1]
        clamped = positions.clamp(0, ignored)  # beyond the span: the ignored index
        loss = F.cross_entropy(logits, clamped, ignore_index=ignored)
        return loss, {"clamped": clamped, "clamp_max": big.clamp(max=2**62 + 1), "clamp_min": big.clamp_min(-(2**62)),
                      "clamp_tensors": torch.clamp(big, divisor, divisor * 3), "minimum": torch.minimum(big, divisor),
                      "maximum": torch.maximum(big, divisor), "floor_div": big // divisor, "remainder": big % divisor,
                      "fmod": torch.fmod(big, divisor), "trunc": torch.div(big, divisor, rounding_mode="trunc"),
                      "arithmetic": (big // 4) * 3 - divisor + 1}


def integer_batch():
    big = torch.tensor([[2**62 + 3, -(2**62) - 5, 7], [-9, 2**53 + 1, -(2**63)]])  # int64's smallest too
    divisor = torch.tensor([[3, 7, -2], [2, -5, 2**61 - 1]])  # signs unlike big's, but for one: trunc is not floor
    return [torch.randn(2, 4, generator=torch.Generator().manual_seed(5)), torch.tensor([9, -2]), big, divisor]


def test_integer_arithmetic_is_exact_and_a_clamped_label_trains_as_in_torch():
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = IntegerArithmetic()
    batch = integer_batch()
    graph = capture(lambda b: model(*b), model, batch)
    assert unsupported(graph) == []
    assert validate(graph, mode="train", profile=None).ok
    (clamp,) = [n for n in graph.nodes if n.op == "clamp" and n.inputs == [graph.inputs[1]]]
    assert clamp.attrs == {"min": 0, "max": 6} and graph.values[clamp.outputs[0]].dtype == "int64"
    outputs = Program(graph, weights_of(model, graph)).eval_step([t.numpy() for t in batch])
    _, expected = model(*batch)
    for name, value in expected.items():  # bit for bit: no float in between
        assert outputs[name].dtype == np.int64, name
        np.testing.assert_array_equal(outputs[name], value.numpy(), err_msg=name)
    np.testing.assert_array_equal(outputs["clamped"], [6, 0])
    assert_matches_torch(graph, model, lambda b: model(*b)[0], batch)


class TensorBounds(nn.Module):
    """torch.clamp with tensor bounds that train (aten.clamp.Tensor), values on both bounds exactly."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.0))
        self.low = nn.Parameter(torch.tensor([-1.0, 0.0, 0.25]))
        self.high = nn.Parameter(torch.tensor([1.0, 0.75, 2.0]))

    def forward(self, x, w):  # x, w: (B, 3)
        return (torch.clamp(x * self.scale, self.low, self.high) * w).sum()


def test_clamp_with_tensor_bounds_gives_torchs_gradients_on_the_bounds_and_at_ties():
    """torch's clamp.Tensor backward: a bound takes the gradient where it won, and x and a bound it ties
    with share it in halves (as maximum and minimum do; a select would give it all to one of them)."""
    model = TensorBounds()
    x = torch.tensor([[-1.0, 0.5, 2.0], [-3.0, 0.75, 0.0], [0.5, -0.5, 3.0]])  # ties: -1 = low, 0.75 = high, 2 = high
    batch = [x, torch.randn(3, 3, generator=torch.Generator().manual_seed(6))]
    graph = capture(lambda b: model(*b), model, batch)
    assert unsupported(graph) == [] and validate(graph, mode="train", profile=None).ok
    assert op_counts(graph)["maximum"] == op_counts(graph)["minimum"] == 1
    assert_matches_torch(graph, model, lambda b: model(*b), batch)
