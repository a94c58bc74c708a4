"""ResNet DataLoaders: the embedded digits (default), CIFAR-10, or a class-per-folder image tree.

``train_input.dataset`` / ``eval_input.dataset`` pick the source (common/data/images.py):

- digits: the embedded UCI digits, padded to 32x32 and pooled or repeated to model.image_size,
  grey copied to each of model.num_channels; nothing to download.
- cifar10: ``data_dir/cifar-10-batches-py`` read by torchvision.datasets.CIFAR10 (or
  ``cifar-10-batches-bin``, the binary format, read by common.data.images).
- imagefolder: ``data_dir/train`` and ``data_dir/val``, one sub-folder of images per class,
  read by torchvision.datasets.ImageFolder (resized, then cropped to model.image_size).

Digits and CIFAR-10 sit in memory as uint8 and a batch is one indexing operation; the
augmentation (random crop of the zero-padded image, horizontal flip: train_input only)
runs on the whole batch. Images are normalised with the source's per-channel mean and std.
"""

import logging
import os
import pickle
import zlib
from typing import Mapping

import numpy as np
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image, UnidentifiedImageError
from torch.utils.data import DataLoader, Dataset

from common.data.images import (MEAN_STD, RefusedPickle, cifar10_format, digits_arrays, list_image_folder,
                                 load_arrays_pickle, read_cifar10)
from common.errors import UserError

logger = logging.getLogger("zoo")


def augment(images: torch.Tensor, padding: int, flip: bool, generator: torch.Generator | None = None
            ) -> torch.Tensor:
    """(B, C, H, W) -> (B, C, H, W): each image cropped at a random offset from its zero-padded
    self, and mirrored left-right with probability 1/2 when ``flip``."""
    b, _, h, w = images.shape
    if padding:
        padded = torch.nn.functional.pad(images, (padding, padding, padding, padding))  # (B, C, H+2p, W+2p)
        offsets = torch.randint(0, 2 * padding + 1, (b, 2), generator=generator)
        images = torch.stack([padded[i, :, y:y + h, x:x + w] for i, (y, x) in enumerate(offsets.tolist())])
    if flip:
        mirrored = torch.rand(b, generator=generator) < 0.5
        images = torch.where(mirrored[:, None, None, None], images.flip(-1), images)
    return images


class ImageArrays(Dataset):
    """uint8 images (N, H, W, C) and labels (N,), served as normalised float32 (B, C, H, W) batches."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, dataset: str, padding: int = 0, flip: bool = False,
                 seed: int = 0):
        self.images = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()  # (N, C, H, W) uint8
        self.labels = torch.from_numpy(labels).long()  # (N,)
        mean, std = MEAN_STD[dataset]
        channels = images.shape[-1]
        self.mean = torch.tensor(mean[:channels]).view(1, -1, 1, 1)
        self.std = torch.tensor(std[:channels]).view(1, -1, 1, 1)
        self.padding, self.flip, self.seed = padding, flip, seed

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.__getitems__([index])
        return images[0], labels[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        # the DataLoader fetches a whole batch through here; collate_batch passes it on as is
        images = self.images[indices].float().div(255)  # (B, C, H, W) in [0, 1]
        # the crops and flips of a batch follow from (seed, its indices), not from the global RNG:
        # the emulator's capture of a first batch, or a resume, leaves the draws of training as they were
        key = zlib.crc32(np.asarray(indices, np.int64).tobytes())
        generator = torch.Generator().manual_seed(self.seed * 2**32 + key)
        images = augment(images, self.padding, self.flip, generator)
        return images.sub(self.mean).div(self.std), self.labels[indices]


def collate_batch(batch):
    return batch


class LocalCIFAR10(torchvision.datasets.CIFAR10):
    """torchvision's CIFAR-10 reader on a local copy: its md5 check of the official archive's
    files is skipped (a copy's batches may be regenerated or a subset); a damaged batch is
    found by the reader and named instead. torchvision reads the batches with pickle.load,
    which runs whatever a pickle names: each file is read first by common/data/images.py,
    whose unpickler builds arrays only and refuses a batch that would run code."""

    def __init__(self, root: str, train: bool = True, **kwargs):
        read_cifar10(root, "train" if train else "test")
        super().__init__(root, train=train, **kwargs)

    def _check_integrity(self) -> bool:
        return True

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        try:
            with open(path, "rb") as f:
                self.classes = load_arrays_pickle(f)[self.meta["key"]]
        except RefusedPickle as e:
            raise UserError(f"{path}: {e}") from None
        except FileNotFoundError:
            raise UserError(f"{path}: missing (a CIFAR-10 python folder holds batches.meta, data_batch_1..5 "
                            f"and test_batch)") from None
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
            raise UserError(f"{path}: not a readable CIFAR-10 batches.meta ({type(e).__name__}); the file is "
                            f"truncated or damaged, download it again") from None
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}


def cifar10_arrays(data_dir: str, train: bool) -> tuple[np.ndarray, np.ndarray, str]:
    split = "train" if train else "test"
    if cifar10_format(data_dir) != "python":
        return read_cifar10(data_dir, split)  # the binary format, or the error naming what is missing
    try:
        cifar = LocalCIFAR10(data_dir, train=train, download=False)
    except (pickle.UnpicklingError, EOFError, ValueError, KeyError, TypeError, OSError):
        read_cifar10(data_dir, split)  # names the damaged file
        raise
    return np.asarray(cifar.data), np.asarray(cifar.targets, np.int64), \
        f"CIFAR-10 from {data_dir} via torchvision ({len(cifar.targets):,} {split})"


def checked_loader(path: str) -> Image.Image:
    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise UserError(f"{path}: not a readable image ({e}); remove or replace it") from None


def image_folder(input_params: Mapping, model: Mapping, train: bool) -> Dataset:
    root = f"{input_params['data_dir']}/{'train' if train else 'val'}"
    list_image_folder(root)  # an empty class folder or a tree without classes: one line naming it
    size = model["image_size"]
    mean, std = MEAN_STD["imagefolder"]
    steps = [T.Resize(size * 8 // 7)]  # 256 for 224, as torchvision's references
    if train:
        steps += [T.RandomCrop(size, padding=input_params["random_crop_padding"])]
        steps += [T.RandomHorizontalFlip()] if input_params["random_flip"] else []
    else:
        steps += [T.CenterCrop(size)]
    steps += [T.ToTensor(), T.Normalize(mean, std)]
    return torchvision.datasets.ImageFolder(root, transform=T.Compose(steps), loader=checked_loader)


def _dataloader(params: Mapping, train: bool) -> DataLoader:
    input_params, model = params["train_input" if train else "eval_input"], params["model"]
    dataset = input_params["dataset"]
    padding = input_params["random_crop_padding"] if train else 0
    flip = input_params["random_flip"] if train else False
    if dataset == "imagefolder":
        data = image_folder(input_params, model, train)
        classes, description = len(data.classes), f"image folder {data.root} ({len(data):,} images)"
        collate = None
    else:
        if dataset == "digits":
            images, labels, description = digits_arrays("train" if train else "test", model["image_size"],
                                                        model["num_channels"])
        else:
            images, labels, description = cifar10_arrays(input_params["data_dir"], train)
        data = ImageArrays(images, labels, dataset, padding, flip, params["runconfig"]["seed"])
        classes, collate = 10, collate_batch
        if images.shape[1:] != (model["image_size"], model["image_size"], model["num_channels"]):
            raise UserError(f"{description}: images are {'x'.join(map(str, images.shape[1:]))}, but the model "
                            f"takes model.image_size {model['image_size']} x model.num_channels "
                            f"{model['num_channels']}")
    # the digits' labels 0-9 are valid for any larger head, so they stand in for any dataset
    # (a compile needs only a batch's shapes: README.md)
    if classes != model["num_classes"] and not (dataset == "digits" and model["num_classes"] > classes):
        raise UserError(f"{description}: {classes} classes, but model.num_classes is {model['num_classes']}")
    logger.info("data (%s): %s", "train" if train else "eval", description)
    return DataLoader(data, batch_size=input_params["batch_size"], shuffle=input_params["shuffle"],
                      drop_last=input_params["drop_last"], num_workers=input_params["num_workers"],
                      collate_fn=collate)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=False)
