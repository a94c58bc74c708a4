"""A small fake MNIST for tests: blobs a linear model separates within a few steps."""

from __future__ import annotations

import os

import numpy as np

from common.data.mnist.idx import write_idx
from common.data.mnist.layout import IMAGE_SIZE, MNIST_FILES, NUM_CLASSES, MnistLocation, mnist_location


def write_fake_mnist(data_dir, n_train: int, n_test: int, seed: int = 0) -> MnistLocation:
    """Write a small MNIST layout under data_dir for tests: class k is a bright blob at
    the k-th of 10 points on a circle, jittered by a pixel, over faint noise, so a linear
    model separates the classes within a few steps. Labels are balanced and shuffled."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    rng = np.random.default_rng(seed)
    raw = os.path.join(os.fspath(data_dir), "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    angles = 2 * np.pi * np.arange(NUM_CLASSES) / NUM_CLASSES
    centres = 13.5 + 8.0 * np.stack([np.sin(angles), np.cos(angles)], axis=1)  # (10, 2) as (row, col)
    rows, cols = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]  # (28, 28) each
    for split, n in (("train", n_train), ("test", n_test)):
        labels = rng.permutation(np.arange(n) % NUM_CLASSES)  # (N,)
        centre = centres[labels] + rng.uniform(-1.0, 1.0, size=(n, 2))  # (N, 2)
        dist2 = (rows - centre[:, 0, None, None]) ** 2 + (cols - centre[:, 1, None, None]) ** 2  # (N, 28, 28)
        images = 255.0 * np.exp(-dist2 / (2 * 2.5**2)) + rng.uniform(0.0, 30.0, size=dist2.shape)
        images_name, labels_name = MNIST_FILES[split]
        write_idx(os.path.join(raw, images_name), np.clip(np.rint(images), 0, 255).astype(np.uint8))
        write_idx(os.path.join(raw, labels_name), labels.astype(np.uint8))
    return mnist_location(os.fspath(data_dir))
