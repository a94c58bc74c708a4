"""A small CNN on 28x28 digits, ported: the module, its loss in a PyTorchBaseModel, model_fn."""
from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy


class DigitCNN(nn.Module):
    def __init__(self, channels: int, dropout: float):
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(2 * channels * 7 * 7, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, C, 14, 14)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 2C, 7, 7)
        return self.fc(self.dropout(torch.flatten(x, 1)))  # (B, 10)


class DigitModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        super().__init__(params, DigitCNN(p["channels"], p["dropout"]), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}

    def __call__(self, batch):
        images, labels = batch  # (B, 1, 28, 28), (B,)
        logits = self.model(images)
        return F.cross_entropy(logits, labels), {"logits": logits}


def model_fn(params: Mapping, device: torch.device) -> DigitModel:
    return DigitModel(params, device)
