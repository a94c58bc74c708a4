"""``x.detach()`` on the emulator: no gradient flows back through it, as in torch (a full slice, which torch's
decomposition also makes an ``alias``, keeps its gradient)."""

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from device.api import build_program  # noqa: E402
from device.capture.torch import capture, weights_of  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x):
        y = self.fc(x)
        target = y.detach() * 0.5  # a target built from the output itself, held fixed
        return ((y - target) ** 2).mean() + (y[:, :] ** 2).mean() * 0.1


def test_detach_stops_the_gradient_and_a_full_slice_does_not():
    net = Net()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    graph = capture(lambda batch: net(batch[0]), net, (x,))
    assert [n.attrs.get("stop_gradient") for n in graph.nodes if n.op == "identity"] == [True]
    loss = net(x)
    loss.backward()
    emulated_loss, grads = build_program(graph, weights_of(net, graph)).gradients([x.numpy()])
    assert emulated_loss == pytest.approx(loss.item(), rel=1e-6)
    for name, param in net.named_parameters():
        np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-5, atol=1e-7)
