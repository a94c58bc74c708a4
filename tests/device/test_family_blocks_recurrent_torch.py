"""The recurrent family block in PyTorch, end to end (the same in TensorFlow:
test_family_blocks_recurrent_tf.py): a 2-layer LSTM classifier, embedding -> nn.LSTM ->
last step -> linear -> cross entropy, and its GRU variant, written as a user of the zoo
writes them.

Each validates, compiles, gives torch's gradients on the first batch, and trains on the
emulator for 5 Adam steps with the framework's loss at every step: within 1e-4 relative in
float32, within 2e-2 in bfloat16 and float16 (against the framework's float32 run).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.device.language_blocks import LR, VOCAB
from tests.device.recurrent_blocks import CLASSES, EMBED, HIDDEN, LAYERS, classifier_batches

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.api import compile_graph, validate_graph  # noqa: E402
from device.capture.torch import capture, weights_of  # noqa: E402
from device.runtime.program import Program  # noqa: E402
from tests.device.test_family_blocks_language_torch import trains_with_torch_losses  # noqa: E402


class TorchClassifier(nn.Module):
    """Embedding -> 2-layer recurrent layer (batch first) -> its last step -> linear."""

    def __init__(self, kind: str):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, EMBED)
        self.rnn = getattr(nn, kind)(EMBED, HIDDEN, num_layers=LAYERS, batch_first=True)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, ids):  # (B, T)
        out, _ = self.rnn(self.embed(ids))  # (B, T, H)
        return self.head(out[:, -1])  # (B, CLASSES)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_recurrent_classifier_validates_compiles_and_trains_with_torch_loss(kind, tmp_path):
    torch.manual_seed(0)
    model = TorchClassifier(kind)

    def step(batch):
        ids, labels = batch
        return F.cross_entropy(model(ids), labels)

    batches = [[torch.tensor(ids), torch.tensor(labels)] for ids, labels in classifier_batches()]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    graph = capture(step, model, batches[0], optimizer=optimizer)
    report = validate_graph(graph, mode="train", profile_name="small")
    assert report.ok, report.to_text()
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    kinds = {k.kind for k in result.kernels}
    assert "dense" in kinds and "unsupported" not in kinds, kinds

    # the gradients of the first step, every weight
    loss, grads = Program(graph, weights_of(model, graph)).gradients([t.numpy() for t in batches[0]])
    expected = step(batches[0])
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    assert set(grads) == {name for name, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)

    trains_with_torch_losses(graph, model, step, optimizer, batches)
