"""UNet (Ronneberger et al., 2015): an encoder-decoder with skip connections, for per-pixel classes.

Encoder: per level, two 3x3 convs (same padding, relu), then a 2x2 max pool. Bottleneck: two
3x3 convs at the last of ``filters``. Decoder: per level, up by 2 (a 2x2 transposed conv, or
a bilinear / nearest upsample then a 3x3 conv: ``model.upsampling``), the encoder's map of
that level concatenated (the skip), two 3x3 convs. A 1x1 conv gives the logits.

``num_classes`` 2 is binary: one logit per pixel and BCE-with-logits; more is one logit per
class and cross-entropy. Dice and mean IoU are the vendor's ``DiceCoefficientMetric`` and
``MeanIOUMetric`` (common/pytorch/metrics.py), fed the predicted class of every pixel.
"""

from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from common.errors import UserError
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import DiceCoefficientMetric, MeanIOUMetric


def double_conv(in_channels: int, out_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(out_channels, out_channels, 3, padding=1), nn.ReLU())


def up(in_channels: int, out_channels: int, upsampling: str) -> nn.Module:
    """(B, in, h, w) -> (B, out, 2h, 2w)."""
    if upsampling == "transposed":
        return nn.ConvTranspose2d(in_channels, out_channels, 2, stride=2)
    return nn.Sequential(nn.Upsample(scale_factor=2, mode=upsampling),
                         nn.Conv2d(in_channels, out_channels, 3, padding=1))


class UNet(nn.Module):
    def __init__(self, input_channels: int, num_classes: int, filters: Sequence[int], upsampling: str):
        super().__init__()
        *levels, bottom = filters
        self.down = nn.ModuleList()
        width = input_channels
        for f in levels:
            self.down.append(double_conv(width, f))
            width = f
        self.bottleneck = double_conv(width, bottom)
        self.up, self.fuse = nn.ModuleList(), nn.ModuleList()
        width = bottom
        for f in reversed(levels):
            self.up.append(up(width, f, upsampling))
            self.fuse.append(double_conv(2 * f, f))  # the upsampled map and the skip, concatenated
            width = f
        self.head = nn.Conv2d(width, 1 if num_classes == 2 else num_classes, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = images  # (B, C, H, W)
        skips = []
        for block in self.down:
            x = block(x)  # (B, f, h, w)
            skips.append(x)
            x = F.max_pool2d(x, 2)  # (B, f, h/2, w/2)
        x = self.bottleneck(x)  # (B, filters[-1], H / 2^levels, W / 2^levels)
        for up_block, fuse, skip in zip(self.up, self.fuse, reversed(skips)):
            x = fuse(torch.cat([up_block(x), skip], dim=1))  # (B, f, h, w)
        return self.head(x)  # (B, 1 or num_classes, H, W)


class UNetModel(PyTorchBaseModel):
    def __init__(self, params: Mapping, device: torch.device):
        p = params["model"]
        self.num_classes = p["num_classes"]
        super().__init__(params, UNet(p["input_channels"], self.num_classes, p["filters"], p["upsampling"]), device)
        self.dice = DiceCoefficientMetric(num_classes=self.num_classes, name="eval/dice_coefficient")
        self.mean_iou = MeanIOUMetric(num_classes=self.num_classes, name="eval/mean_iou")

    def __call__(self, batch):
        images, masks = batch  # (B, C, H, W) float32, (B, H, W) int64 class ids
        logits = self.model(images)  # (B, 1 or K, H, W)
        if self.num_classes == 2:
            logits = logits[:, 0]  # (B, H, W)
            loss = F.binary_cross_entropy_with_logits(logits, masks.float())
            predictions = (logits > 0).int()  # (B, H, W)
        else:
            loss = F.cross_entropy(logits, masks)
            predictions = logits.argmax(1).int()  # (B, H, W)
        if not self.model.training:
            self.dice(labels=masks.clone(), predictions=predictions)
            self.mean_iou(labels=masks.clone(), predictions=predictions)
        return loss, {"logits": logits}


def model_fn(params: Mapping, device: torch.device) -> UNetModel:
    levels = len(params["model"]["filters"]) - 1
    for size in params["model"]["image_size"]:
        if size % 2 ** levels:
            raise UserError(f"model.image_size {list(params['model']['image_size'])}: each side must divide by "
                            f"2^{levels} (the max pools of {levels} levels, len(model.filters) - 1)")
    return UNetModel(params, device)
