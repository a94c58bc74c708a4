"""Comparisons on the emulator compare in torch's promoted dtype: an int tensor against a float scalar or a
float tensor is compared as float (``ids >= 1.4`` is not ``ids >= 1``)."""

import pytest

torch = pytest.importorskip("torch")

from device.api import build_program  # noqa: E402
from device.capture.torch import capture, weights_of  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(3, 1)

    def forward(self, x, ids):
        y = self.fc(x).squeeze(-1)
        above = (ids >= 1.4).float()  # int against a float scalar: 1 is not at or above 1.4
        same = (ids == x[:, 0]).float()  # int against a float tensor
        return (y * above).mean() + (y * same).mean()


def test_an_int_compared_with_a_float_is_compared_as_float():
    net = Net()
    x = torch.tensor([[1.0, 0.0, 0.0], [1.5, 1.0, 0.0], [2.0, 0.0, 1.0], [3.0, 1.0, 1.0]])
    ids = torch.tensor([1, 1, 2, 3])
    loss = net(x, ids)
    graph = capture(lambda batch: net(*batch), net, (x, ids))
    emulated, _ = build_program(graph, weights_of(net, graph)).gradients([x.numpy(), ids.numpy()])
    assert emulated == pytest.approx(loss.item(), rel=1e-6)
