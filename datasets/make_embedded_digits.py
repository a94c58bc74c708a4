"""Regenerate the embedded digits (datasets/embedded/uci_digits/MNIST/raw) from scikit-learn.

    python datasets/make_embedded_digits.py [--out_dir DIR]

Source: the 1,797 8x8 UCI handwritten digits that ship inside scikit-learn
(`sklearn.datasets.load_digits`), each pixel a count 0..16 of the "on" pixels in a 4x4
block of a 32x32 bitmap. Made to look like MNIST, in integer arithmetic so the bytes are
the same on every machine and numpy version:

- pixel values 0..16 scale to 0..255 (x * 255 / 16, rounded half up);
- bilinear upsampling of the 8x8 to 20x20 with pixel-centre alignment (output pixel i
  samples input position (i + 0.5) * 8/20 - 0.5, clamped to the edge), the same
  convention as PIL's and OpenCV's resize; the weights are exact tenths;
- the 20x20 digit placed in the middle of a 28x28 zero canvas (rows and columns 4..23),
  as MNIST puts its size-normalised 20x20 digits in 28x28 images;
- a stratified split: 360 test images (20%) shared among the classes in proportion to
  their counts (largest remainder), drawn within each class by numpy's legacy
  RandomState(0), whose stream numpy keeps frozen; the other 1,437 are the training set.
  Both splits keep the original order.
"""

import argparse
import os
from pathlib import Path

import numpy as np

from common.data.mnist import MNIST_FILES, write_idx

SEED = 0
TEST_COUNT = 360
SOURCE_SIZE = 8
BOX_SIZE = 20
CANVAS_SIZE = 28
MAX_VALUE = 16  # load_digits pixels count "on" pixels in a 4x4 block
DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "embedded" / "uci_digits"


def bilinear_weights_tenths() -> np.ndarray:
    """(20, 8) integer weights in tenths: row i mixes the two source pixels around
    source position (i + 0.5) * 8/20 - 0.5 = (4i - 3) / 10."""
    weights = np.zeros((BOX_SIZE, SOURCE_SIZE), dtype=np.int64)
    for i in range(BOX_SIZE):
        position = min(max(4 * i - 3, 0), 10 * (SOURCE_SIZE - 1))  # in tenths of a source pixel
        left, fraction = divmod(position, 10)
        right = min(left + 1, SOURCE_SIZE - 1)
        weights[i, left] += 10 - fraction
        weights[i, right] += fraction
    return weights


def to_mnist_canvas(digits: np.ndarray) -> np.ndarray:
    """(N, 8, 8) integers 0..16 -> (N, 28, 28) uint8, as the module docstring describes."""
    weights = bilinear_weights_tenths()  # (20, 8), each row sums to 10
    box = np.einsum("ij,njk,lk->nil", weights, digits.astype(np.int64), weights)  # (N, 20, 20), scale 100 * 16
    scale = 100 * MAX_VALUE
    box = (box * 255 + scale // 2) // scale  # 0..255, rounded half up
    canvas = np.zeros((len(digits), CANVAS_SIZE, CANVAS_SIZE), dtype=np.uint8)
    offset = (CANVAS_SIZE - BOX_SIZE) // 2
    canvas[:, offset : offset + BOX_SIZE, offset : offset + BOX_SIZE] = box
    return canvas


def stratified_split(labels: np.ndarray, test_count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, test indices), both ascending; each class gives its share of
    test_count (largest remainder, ties to the lower class)."""
    classes, counts = np.unique(labels, return_counts=True)
    quotas = test_count * counts
    per_class = quotas // len(labels)
    remainders = quotas % len(labels)
    # A stable sort on -remainder hands the leftover images to the largest remainders,
    # the lower class first among equals.
    for k in np.argsort(-remainders, kind="stable")[: test_count - per_class.sum()]:
        per_class[k] += 1
    rng = np.random.RandomState(seed)
    test = np.concatenate(
        [rng.permutation(np.flatnonzero(labels == c))[:n] for c, n in zip(classes, per_class)]
    )
    test = np.sort(test)
    train = np.setdiff1d(np.arange(len(labels)), test)
    return train, test


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out_dir", default=str(DEFAULT_OUT_DIR), help="writes OUT_DIR/MNIST/raw (default: %(default)s)"
    )
    args = parser.parse_args(argv)

    # Imported here so that the rest of the zoo never needs scikit-learn.
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = to_mnist_canvas(digits.images.astype(np.int64))  # (1797, 28, 28)
    labels = digits.target.astype(np.uint8)  # (1797,)
    train, test = stratified_split(labels, TEST_COUNT, SEED)

    raw = os.path.join(args.out_dir, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for split, index in (("train", train), ("test", test)):
        images_name, labels_name = MNIST_FILES[split]
        write_idx(os.path.join(raw, images_name), images[index])
        write_idx(os.path.join(raw, labels_name), labels[index])
        print(f"{split}: {len(index):,} images, per class {np.bincount(labels[index], minlength=10).tolist()}")
    print(f"wrote {raw}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
