"""MNIST DataLoaders: torchvision reads the IDX files; the usual normalisation is applied once.

torchvision.datasets.MNIST reads ``resolve_mnist(data_dir, dataset).root`` (real MNIST,
or the embedded UCI digits when data_dir holds none). Its images are normalised in one
go, as ToTensor + Normalize(MNIST_MEAN, MNIST_STD) would per image, and kept in memory;
a batch is then one indexing operation, which feeds the model many times faster than it
consumes (a per-image PIL transform would not).
"""

import logging
from typing import Mapping

import torch
import torchvision
from torch.utils.data import DataLoader, Dataset

from common.data import MNIST_MEAN, MNIST_STD, resolve_mnist

logger = logging.getLogger("zoo")


class MnistTensors(Dataset):
    """Normalised images (N, 1, 28, 28) float32 and labels (N,) int64, fetched a batch at a time."""

    def __init__(self, mnist: torchvision.datasets.MNIST):
        images = mnist.data.unsqueeze(1).float().div(255)  # (N, 1, 28, 28) in [0, 1], as ToTensor
        self.images = images.sub(MNIST_MEAN).div(MNIST_STD)  # as Normalize((MNIST_MEAN,), (MNIST_STD,))
        self.labels = mnist.targets.long()  # (N,)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.images[index], self.labels[index]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # the DataLoader fetches a whole batch through here; collate_batch passes it on as is
        return self.images[indices], self.labels[indices]  # (B, 1, 28, 28), (B,)


def collate_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    return batch


def _dataloader(input_params: Mapping, train: bool) -> DataLoader:
    location = resolve_mnist(input_params["data_dir"], input_params["dataset"])
    logger.info("data (%s): %s", "train" if train else "eval", location.description)
    mnist = torchvision.datasets.MNIST(location.root, train=train, download=False)
    return DataLoader(MnistTensors(mnist), batch_size=input_params["batch_size"], shuffle=input_params["shuffle"],
                      drop_last=input_params["drop_last"], num_workers=input_params["num_workers"],
                      collate_fn=collate_batch)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params["train_input"], train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params["eval_input"], train=False)
