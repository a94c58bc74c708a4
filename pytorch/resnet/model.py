"""ResNet (He et al. 2015, "Deep Residual Learning for Image Recognition"), v1.5 as torchvision's.

    stem -> stage 1 .. stage S (blocks of residual units) -> global average pool -> Linear

A stage is ``stage_blocks[i]`` blocks of ``stage_widths[i]`` channels; every stage after
the first starts with a stride-2 block (H and W halve), whose shortcut is a 1x1 stride-2
conv with batch norm where the shape changes. Blocks:

- basic:      3x3 conv, BN, relu, 3x3 conv, BN, + shortcut, relu            (out = width)
- bottleneck: 1x1 conv, BN, relu, 3x3 conv (the stride), BN, relu, 1x1 conv, BN, + shortcut,
              relu                                                          (out = 4 x width)

Stems: ``cifar`` is one 3x3 conv (32x32 inputs keep their size); ``imagenet`` a 7x7 stride-2
conv and a 3x3 stride-2 max pool (224 -> 56). resnet18: basic [2, 2, 2, 2] x [64, 128, 256,
512]; resnet50: bottleneck [3, 4, 6, 3] x the same widths. Convs have no bias (batch norm's
shift replaces it), as in the paper. tf/resnet is the same network.
"""

from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy, Metric


def batch_norm(channels: int, p: Mapping) -> nn.BatchNorm2d:
    # torch's momentum weighs the batch: 1 - decay in TF's (and the params') spelling
    return nn.BatchNorm2d(channels, eps=p["batch_norm_epsilon"], momentum=1.0 - p["batch_norm_decay"])


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_channels: int, width: int, stride: int, p: Mapping):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, width, 3, stride, padding=1, bias=False)
        self.bn1 = batch_norm(width, p)
        self.conv2 = nn.Conv2d(width, width, 3, 1, padding=1, bias=False)
        self.bn2 = batch_norm(width, p)
        self.shortcut = shortcut(in_channels, width, stride, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, width, H/s, W/s)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_channels: int, width: int, stride: int, p: Mapping):
        super().__init__()
        out = width * self.expansion
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = batch_norm(width, p)
        self.conv2 = nn.Conv2d(width, width, 3, stride, padding=1, bias=False)  # the stride here: v1.5
        self.bn2 = batch_norm(width, p)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = batch_norm(out, p)
        self.shortcut = shortcut(in_channels, out, stride, p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, 4 width, H/s, W/s)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + self.shortcut(x))


def shortcut(in_channels: int, out_channels: int, stride: int, p: Mapping) -> nn.Module:
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 1, stride, bias=False), batch_norm(out_channels, p))


class ResNet(nn.Module):
    def __init__(self, p: Mapping):
        super().__init__()
        block = BasicBlock if p["block"] == "basic" else Bottleneck
        if len(p["stage_blocks"]) != len(p["stage_widths"]):
            raise UserError(f"model.stage_blocks {list(p['stage_blocks'])} and model.stage_widths "
                            f"{list(p['stage_widths'])} must have one entry per stage each")
        stem_width = p["stem_width"]
        if p["stem"] == "cifar":
            self.stem = nn.Sequential(nn.Conv2d(p["num_channels"], stem_width, 3, 1, padding=1, bias=False),
                                      batch_norm(stem_width, p), nn.ReLU())
        else:
            self.stem = nn.Sequential(nn.Conv2d(p["num_channels"], stem_width, 7, 2, padding=3, bias=False),
                                      batch_norm(stem_width, p), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1))
        blocks, channels = [], stem_width
        for stage, (count, width) in enumerate(zip(p["stage_blocks"], p["stage_widths"])):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(block(channels, width, stride, p))
                channels = width * block.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(channels, p["num_classes"])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(images))  # (B, C, H', W')
        # global average pooling as a mean over H and W: the emulator's reduce_mean runs it
        # (nn.AdaptiveAvgPool2d is not among the ops it captures)
        x = x.mean((2, 3))  # (B, C)
        return self.fc(x)  # (B, num_classes)


class TopKAccuracy(Metric):
    """Fraction of examples whose label is among the k largest logits (ties: the lower class first)."""

    summed = ("correct", "total")  # added up over the processes of a data-parallel eval

    def __init__(self, k: int, output: str = "logits"):
        self.k, self.output = k, output
        self.reset()

    def reset(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, outputs, batch) -> None:
        logits = np.asarray(outputs[self.output])  # (B, classes)
        labels = np.asarray(batch[-1]).reshape(-1)  # (B,)
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :self.k]  # (B, k)
        self.correct += int(np.sum(top == labels[:, None]))
        self.total += len(labels)

    def result(self) -> float:
        return self.correct / self.total if self.total else float("nan")


class ResNetModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]  # sizes and rates are checked by params (utils.py's ranges, common/params.py)
        super().__init__(params, ResNet(p), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}
        if p["num_classes"] > 5:
            self.metrics["top5_accuracy"] = TopKAccuracy(5)

    def __call__(self, batch):
        images, labels = batch  # (B, C, H, W) float32, (B,) int64
        logits = self.model(images)  # (B, num_classes)
        return F.cross_entropy(logits.float(), labels), {"logits": logits}


def model_fn(params: Mapping, device: torch.device) -> ResNetModel:
    return ResNetModel(params, device)
