"""A multi-layer perceptron on 28x28 digits: Linear -> activation -> dropout per hidden layer."""

from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy

IMAGE_PIXELS = 28 * 28
NUM_CLASSES = 10
ACTIVATION_LAYERS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "selu": nn.SELU, "linear": nn.Identity}


class MLP(nn.Module):
    def __init__(self, hidden_sizes: Sequence[int], dropout: float, activation_fn: str):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten()]  # (B, 1, 28, 28) -> (B, 784)
        width = IMAGE_PIXELS
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), ACTIVATION_LAYERS[activation_fn]()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, NUM_CLASSES))
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)  # (B, 1, 28, 28) -> (B, 10)


class MnistModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]  # sizes and rates are checked by params (common/params.py NAME_RULES)
        super().__init__(params, MLP(p["hidden_sizes"], p["dropout"], p["activation_fn"]), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}

    def __call__(self, batch):
        images, labels = batch  # (B, 1, 28, 28) float32, (B,) int64
        logits = self.model(images)  # (B, 10)
        return F.cross_entropy(logits, labels), {"logits": logits}


def model_fn(params: Mapping, device: torch.device) -> MnistModel:
    return MnistModel(params, device)
