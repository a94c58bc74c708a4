"""scaled_dot_product_attention through the PyTorch capture (device/capture/torch/) with masks that
are the module's own constants: a registered causal buffer, a boolean pattern per head, an additive
bias, a mask built in forward from constants; and is_causal with fewer queries than keys. The
emulator's outputs, loss and gradients against torch. (Masks that depend on the batch are in
test_capture_torch.py.)"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.capture.torch import capture, weights_of  # noqa: E402
from device.ops import OPS  # noqa: E402
from device.passes.validate import validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402

T, DIM, HEADS = 5, 8, 2


class Attention(nn.Module):
    """q, k, v (B, H, T, D) from one linear layer, then ``attend(self, q, k, v)``; its buffers are masks."""

    def __init__(self, attend):
        super().__init__()
        self.attend = attend
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.register_buffer("causal", torch.ones(T, T).tril().bool(), persistent=False)
        # a pattern per head (H, T, T), broadcast over the batch; each query sees itself at least
        pattern = torch.rand(HEADS, T, T, generator=torch.Generator().manual_seed(1)) > 0.5
        self.register_buffer("pattern", pattern | torch.eye(T, dtype=torch.bool), persistent=False)
        distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs().float()
        self.register_buffer("bias", -0.7 * distance, persistent=False)  # ALiBi's form, one slope

    def forward(self, x):  # (B, T, C)
        B = x.shape[0]
        q, k, v = [t.view(B, T, HEADS, -1).transpose(1, 2) for t in self.qkv(x).split(DIM, dim=-1)]  # (B, H, T, D)
        return self.attend(self, q, k, v)


FORMS = {
    "causal-buffer": lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.causal),
    "causal-buffer-scaled": lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.causal,
                                                                              scale=0.9),
    "pattern-per-head": lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.pattern),
    "causal-built-in-forward": lambda m, q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.ones(T, T, dtype=torch.bool).tril()),
    "additive-buffer": lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=m.bias),
    # torch's causal mask is the top-left triangle when there are fewer queries than keys
    "is-causal-fewer-queries": lambda m, q, k, v: F.scaled_dot_product_attention(q[:, :, :3], k, v, is_causal=True),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_attention_under_a_constant_mask_matches_torch(form):
    torch.manual_seed(0)
    model = Attention(FORMS[form])
    x = torch.randn(2, T, DIM)

    def step(batch):
        y = model(batch[0])  # (B, H, queries, D)
        return (y * y).sum(), {"y": y}

    graph = capture(step, model, [x])
    assert [n.op for n in graph.nodes if n.op not in OPS] == []
    assert validate(graph, mode="train", profile=None).ok
    assert len(graph.inputs) == 1  # x alone: the mask is a constant of the graph, not fed
    program = Program(graph, weights_of(model, graph), seed=0)
    outputs = program.forward([x.numpy()], training=False)
    loss, grads = program.gradients([x.numpy()])

    model.zero_grad()
    expected_loss, expected = step([x])
    expected_loss.backward()
    np.testing.assert_allclose(outputs["y"], expected["y"].detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(loss, expected_loss.item(), rtol=1e-5)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(grads[name], p.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
