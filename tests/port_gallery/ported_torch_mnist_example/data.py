"""main.py's DataLoaders, ported: MNIST read from data_dir (never downloaded), every batch full."""
from typing import Mapping

import torch
from torchvision import datasets, transforms

from common.data import resolve_mnist


def _dataloader(p: Mapping, train: bool) -> torch.utils.data.DataLoader:
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    # MNIST where `zoo prepare mnist` put it; with dataset auto and none there, the embedded digits
    root = resolve_mnist(p["data_dir"], p["dataset"]).root
    dataset = datasets.MNIST(root, train=train, download=False, transform=transform)
    return torch.utils.data.DataLoader(dataset, batch_size=p["batch_size"], shuffle=p["shuffle"],
                                       drop_last=p["drop_last"])


def get_train_dataloader(params: Mapping) -> torch.utils.data.DataLoader:
    return _dataloader(params["train_input"], train=True)


def get_eval_dataloader(params: Mapping) -> torch.utils.data.DataLoader:
    return _dataloader(params["eval_input"], train=False)
