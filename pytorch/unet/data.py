"""UNet DataLoaders over common/data/segmentation.py: digit canvases, image + mask folders, Severstal.

The arrays are read once into memory and scaled to [0, 1]; a batch is one indexing
operation. Images are (B, C, H, W) float32, masks (B, H, W) int64 class ids.
"""

import logging
from typing import Mapping

import torch
from torch.utils.data import DataLoader, Dataset

from common.data.segmentation import load_segmentation
from common.errors import UserError

logger = logging.getLogger("zoo")


class SegmentationTensors(Dataset):
    def __init__(self, images, masks):
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2).float().div(255)  # (N, C, H, W) in [0, 1]
        self.masks = torch.from_numpy(masks).long()  # (N, H, W)

    def __len__(self) -> int:
        return len(self.masks)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.masks[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[indices], self.masks[indices]  # (B, C, H, W), (B, H, W)


def collate_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


def _dataloader(params: Mapping, train: bool) -> DataLoader:
    section = "train_input" if train else "eval_input"
    input_params = params[section]
    images, masks, description = load_segmentation(input_params, params["model"], "train" if train else "test")
    logger.info("data (%s): %s", "train" if train else "eval", description)
    if input_params["drop_last"] and input_params["batch_size"] > len(masks):
        raise UserError(f"{section}.batch_size {input_params['batch_size']} is larger than the {len(masks):,} "
                        f"examples, and drop_last drops the only, partial, batch")
    return DataLoader(SegmentationTensors(images, masks), batch_size=input_params["batch_size"],
                      shuffle=input_params["shuffle"], drop_last=input_params["drop_last"],
                      num_workers=input_params["num_workers"], collate_fn=collate_batch)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=False)
