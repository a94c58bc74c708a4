"""The embedded handwritten digits as DataLoaders of (B, 1, 28, 28) images in [0, 1]."""
from typing import Mapping

import torch
from torch.utils.data import DataLoader, TensorDataset

from common.data import embedded_digits, load_mnist_arrays


def _dataloader(input_params: Mapping, split: str) -> DataLoader:
    images, labels = load_mnist_arrays(embedded_digits(), split)
    dataset = TensorDataset(torch.from_numpy(images).float().div(255).unsqueeze(1), torch.from_numpy(labels).long())
    return DataLoader(dataset, batch_size=input_params["batch_size"], shuffle=input_params["shuffle"],
                      drop_last=input_params["drop_last"])


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params["train_input"], "train")


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params["eval_input"], "test")
