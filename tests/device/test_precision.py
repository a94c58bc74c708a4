"""The model's float32 tensors under mixed precision (device/precision.py): a mask computed from the
batch's integers, filled with float32's lowest, stays float32 up to the next matmul, as under
torch.autocast; the emulator's bfloat16 loss then matches torch's autocast one where rounding the mask
to bfloat16 (-inf) would give NaN."""

from __future__ import annotations

import numpy as np
import pytest

from device.graphs import GraphBuilder
from device.passes.match import match
from device.precision import float32_nodes
from device.runtime.program import Program

LOWEST = float(np.finfo(np.float32).min)


def _masked_attention_graph(precision: str):
    """Scores of 2 queries over 2 keys plus an additive mask from the batch's 0/1 mask, softmax,
    the values, a loss. The second row masks every key (a left-padded query)."""
    b = GraphBuilder(precision=precision)
    x = b.input("x", (2, 4))
    keep = b.input("keep", (2, 2), "bool")
    w = b.param("w", (4, 4))
    scores = b.op("matmul", [b.op("matmul", [x, w], (2, 4)), b.op("transpose", [x], (4, 2), attrs={"perm": [1, 0]})],
                  (2, 2))
    mask = b.op("where", [keep, b.constant("zero", np.float32(0)), b.constant("lowest", np.float32(LOWEST))], (2, 2))
    added = b.op("add", [scores, mask], (2, 2))
    probs = b.op("softmax", [added], (2, 2), attrs={"axis": 1})
    out = b.op("matmul", [probs, x], (2, 4))
    b.graph.loss = b.op("reduce_mean", [out], (), attrs={"axes": [0, 1], "keepdims": False})
    return b.graph, {"mask": mask, "add": added, "softmax": probs, "values": out}


def _producer(graph, value):
    return next(n.name for n in graph.nodes if value in n.outputs)


def test_the_mask_and_what_reads_it_up_to_the_next_matmul_stay_float32():
    graph, v = _masked_attention_graph("bfloat16")
    nodes = float32_nodes(graph)
    assert nodes == {_producer(graph, v[k]) for k in ("mask", "add", "softmax")}
    assert float32_nodes(_masked_attention_graph("float32")[0]) == set()


@pytest.mark.parametrize("precision", ["bfloat16", "float16", "cb16"])
def test_a_row_that_masks_every_key_is_finite_in_16_bit(precision):
    graph, _ = _masked_attention_graph(precision)
    rng = np.random.default_rng(0)
    batch = [rng.standard_normal((2, 4)).astype(np.float32), np.array([[True, True], [False, False]])]
    weights = {"w": rng.standard_normal((4, 4)).astype(np.float32)}
    loss16 = Program(graph, weights).forward(batch, training=True)["loss"]
    loss32 = Program(_masked_attention_graph("float32")[0], weights).forward(batch, training=True)["loss"]
    assert np.isfinite(loss16) and abs(loss16 - loss32) <= 2e-2 * abs(loss32)


def test_the_float32_kernels_are_costed_at_float32():
    graph, v = _masked_attention_graph("bfloat16")
    kernels = match(graph)
    by_node = {name: k for k in kernels for name in k.nodes}
    mask_kernel = by_node[_producer(graph, v["mask"])]
    assert mask_kernel.precision == "float32"
    assert mask_kernel.activation_bytes == 4 * 2 * 2  # the (2, 2) mask in float32
    assert by_node[_producer(graph, v["values"])].precision == ""


def test_a_torch_model_in_bfloat16_matches_torch_autocast():
    """A tiny causal attention layer that builds its padding mask as transformers does (finfo(float32).min
    from the integer attention mask), one left-padded row whose first queries attend nowhere: the
    emulator's bfloat16 loss is within 2e-2 of torch's autocast loss; rounding the mask to bfloat16 would
    make it NaN."""
    torch = pytest.importorskip("torch")

    from device.capture.torch import capture, weights_of

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(16, 8)
            self.q, self.k, self.v = (torch.nn.Linear(8, 8) for _ in range(3))
            self.head = torch.nn.Linear(8, 16)
            self.register_buffer("causal", torch.tril(torch.ones(4, 4, dtype=torch.bool)), persistent=False)

        def forward(self, ids, attention_mask, labels):
            h = self.embed(ids)  # (B, T, C)
            scores = self.q(h) @ self.k(h).transpose(1, 2)  # (B, T, T)
            scores = torch.where(self.causal, scores, torch.finfo(torch.float32).min)
            mask = (1.0 - attention_mask[:, None, :].to(torch.float32)) * torch.finfo(torch.float32).min
            probs = torch.softmax(scores + mask, dim=-1).to(h.dtype)
            logits = self.head(probs @ self.v(h))
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)

    torch.manual_seed(0)
    model = Attention()
    ids = torch.randint(0, 16, (2, 4))
    keep = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])  # the second row left-padded
    labels = torch.where(keep.bool(), ids, -100)
    batch = [ids, keep, labels]
    with torch.autocast("cpu", torch.bfloat16):
        expected = model(*batch).item()
    graph = capture(lambda b: model(*b), model, batch, precision="bfloat16")
    assert float32_nodes(graph)  # the mask
    loss = Program(graph, weights_of(model, graph)).forward([t.numpy() for t in batch], training=True)["loss"]
    assert np.isfinite(loss) and abs(loss - expected) <= 2e-2 * abs(expected), (loss, expected)
