"""The MNIST layout on disk, shared by the TF and PyTorch input pipelines (numpy and stdlib only).

The one layout both frameworks read is torchvision's:

    <root>/MNIST/raw/train-images-idx3-ubyte   uint8 (60000, 28, 28)
    <root>/MNIST/raw/train-labels-idx1-ubyte   uint8 (60000,)
    <root>/MNIST/raw/t10k-images-idx3-ubyte    uint8 (10000, 28, 28)
    <root>/MNIST/raw/t10k-labels-idx1-ubyte    uint8 (10000,)

uncompressed, because torchvision 0.29's ``MNIST(root, download=False)`` opens exactly
these four paths with a plain ``open`` (no gzip, no checksum) and refuses the folder if
one is missing. The PyTorch side hands ``MnistLocation.root`` to torchvision; the TF
side reads the same files with ``load_mnist_arrays``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

from common.data.mnist.idx import idx_shape, read_idx
from common.errors import UserError

logger = logging.getLogger("common.data.mnist")

# The usual MNIST normalisation (mean and std of the 60,000 training images scaled to
# [0, 1]); both frameworks normalise with these so their models see the same inputs.
MNIST_MEAN = 0.1307
MNIST_STD = 0.3081

IMAGE_SIZE = 28
NUM_CLASSES = 10
DATASETS = ("auto", "mnist", "uci_digits")
SPLITS = ("train", "test")

# split -> (images file, labels file), torchvision's names.
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
ALL_FILES = MNIST_FILES["train"] + MNIST_FILES["test"]


@dataclass(frozen=True)
class MnistLocation:
    """Where the four IDX files of one dataset are, and what they hold."""

    root: str  # torchvision's `root`: root/MNIST/raw holds the four files
    kind: str  # "mnist" or "uci_digits"
    description: str  # for the log line, e.g. "MNIST from /data/MNIST/raw (60,000 train / 10,000 test, 28x28)"
    num_train: int
    num_test: int

    @property
    def raw_dir(self) -> str:
        return os.path.join(self.root, "MNIST", "raw")


def missing_files(root: str) -> list[str]:
    raw = os.path.join(root, "MNIST", "raw")
    return [name for name in ALL_FILES if not os.path.isfile(os.path.join(raw, name))]


def split_sizes(root: str) -> tuple[int, int]:
    """(train, test) sizes from the headers, after checking each split's two files agree."""
    raw = os.path.join(root, "MNIST", "raw")
    sizes = []
    for split in SPLITS:
        images_path, labels_path = (os.path.join(raw, name) for name in MNIST_FILES[split])
        images_shape, labels_shape = idx_shape(images_path), idx_shape(labels_path)
        if len(images_shape) != 3 or images_shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
            raise UserError(f"{images_path}: expected images of shape (N, 28, 28), found {images_shape}")
        if len(labels_shape) != 1 or labels_shape[0] != images_shape[0]:
            raise UserError(
                f"{labels_path}: shape {labels_shape}, but {images_path} holds {images_shape[0]} images"
            )
        sizes.append(images_shape[0])
    return sizes[0], sizes[1]


def check_split(images: tuple[str, np.ndarray], labels: tuple[str, np.ndarray]) -> None:
    """images and labels are (origin, array) of one split; raise UserError unless they
    are (N, 28, 28) images with N labels in 0..9."""
    (images_origin, x), (labels_origin, y) = images, labels
    if x.ndim != 3 or x.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise UserError(f"{images_origin}: expected images of shape (N, 28, 28), found {x.shape}")
    if y.ndim != 1:
        raise UserError(f"{labels_origin}: expected labels of shape (N,), found {y.shape}")
    if len(y) != len(x):
        raise UserError(f"{labels_origin}: {len(y)} labels, but {images_origin} holds {len(x)} images")
    if len(y) and y.max() >= NUM_CLASSES:
        raise UserError(f"{labels_origin}: label {int(y.max())} out of range 0..{NUM_CLASSES - 1}")


def warn_if_legacy_processed(root: str) -> None:
    # torchvision prefers MNIST/processed/{training,test}.pt, written by versions before
    # 0.9, over the raw files: the PyTorch side would then read other data than the TF side.
    processed = os.path.join(root, "MNIST", "processed")
    if all(os.path.isfile(os.path.join(processed, f)) for f in ("training.pt", "test.pt")):
        logger.warning(
            "data: %s holds torchvision's legacy training.pt/test.pt, which torchvision reads instead of "
            "MNIST/raw; delete that folder so both frameworks read the same files",
            processed,
        )


def mnist_location(root: str) -> MnistLocation:
    num_train, num_test = split_sizes(root)
    warn_if_legacy_processed(root)
    raw = os.path.join(root, "MNIST", "raw")
    return MnistLocation(
        root=root,
        kind="mnist",
        description=f"MNIST from {raw} ({num_train:,} train / {num_test:,} test, 28x28)",
        num_train=num_train,
        num_test=num_test,
    )


def load_mnist_arrays(location: MnistLocation, split: str) -> tuple[np.ndarray, np.ndarray]:
    """images uint8 (N, 28, 28) and labels int64 (N,) of one split, for the TF side."""
    if split not in SPLITS:
        raise UserError(f"MNIST split {split!r} is unknown; valid: {', '.join(SPLITS)}")
    images_path, labels_path = (os.path.join(location.raw_dir, name) for name in MNIST_FILES[split])
    images, labels = read_idx(images_path), read_idx(labels_path)
    check_split((images_path, images), (labels_path, labels))
    return images, labels.astype(np.int64)
