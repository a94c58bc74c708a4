"""torch_mnist_example/main.py's Net, ported: the module as it was, its loss in a PyTorchBaseModel."""
from typing import Mapping

import torch
import torch.nn as nn
import torch.nn.functional as F

from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy


class Net(nn.Module):
    def __init__(self, dropout1: float, dropout2: float):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(dropout1)
        self.dropout2 = nn.Dropout(dropout2)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


class MnistNet(PyTorchBaseModel):
    """The training step of main.py's train(): the output and F.nll_loss; accuracy is an eval metric."""

    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        super().__init__(params, Net(p["dropout1"], p["dropout2"]), device)
        self.metrics = {"accuracy": Accuracy(output="log_probs")}

    def __call__(self, batch):
        images, labels = batch  # (B, 1, 28, 28), (B,)
        log_probs = self.model(images)  # (B, 10)
        return F.nll_loss(log_probs, labels), {"log_probs": log_probs}


def model_fn(params: Mapping, device: torch.device) -> MnistNet:
    return MnistNet(params, device)
