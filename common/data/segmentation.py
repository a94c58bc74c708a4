"""Segmentation data on disk, for the unet folders (numpy and stdlib; pillow to read images).

Three sources, each read into uint8 images (N, H, W, C) and uint8 masks (N, H, W) of class
ids (0 is the background):

- ``digit_canvases``: a segmentation task built from the embedded UCI digits
  (``common.data``), so that a fresh clone trains offline. Each canvas holds a few digits
  placed at distinct cells of a grid, chosen by a seeded generator; every ink pixel is
  labelled with its digit's class (digit + 1, so 1..10), every other pixel 0. The net must
  recognise the digits, not merely find the ink. With ``binary``, ink is 1 (foreground).
- ``read_image_mask_folder``: ``split/images/<name>`` and ``split/masks/<name>`` pairs
  (PNG or TIFF, as DAGM and Inria ship), a mask pixel's value its class id (binary: > 0).
- ``read_severstal``: Severstal's ``train.csv`` (ImageId, ClassId, EncodedPixels, a
  run-length encoding: 1-based start and length pairs, numbered top to bottom, then left to
  right) beside ``train_images/``; the first 80 % of the images (sorted) train, the rest test.

Bad files stop the run with one line naming the file (UserError), before any training.
``write_fake_image_mask_folder`` and ``write_fake_severstal`` write small such trees for tests.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from common.data import embedded_digits, load_mnist_arrays
from common.errors import UserError

DATASETS = ("digits", "folder", "severstal")
SPLITS = ("train", "test")
DIGIT_CLASSES = 11  # background and the ten digits
INK_THRESHOLD = 96  # of 255: a digit's pixel at or above it is ink, labelled with the digit
IMAGE_EXTENSIONS = (".png", ".tif", ".tiff", ".jpg", ".jpeg", ".bmp")
SEVERSTAL_TRAIN_FRACTION = 0.8
_SPLIT_SEEDS = {"train": 0, "test": 1}  # the canvases of each split are fixed: data, not a run's choice


# --------------------------------------------------------------------------- digits on a canvas


def _resize_nearest(images: np.ndarray, size: int) -> np.ndarray:
    """(N, 28, 28) -> (N, size, size) by nearest neighbour (the digits were 8x8 upscaled to 28x28)."""
    index = (np.arange(size) * images.shape[1]) // size
    return images[:, index][:, :, index]


def digit_canvases(split: str, image_size: tuple[int, int], digits_per_image: int, digit_size: int,
                   binary: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """uint8 canvases (N, H, W, 1), uint8 masks (N, H, W) and a description.

    Each digit of the split is used once; N = digits // digits_per_image. Digits sit in
    distinct cells of a grid of ``digit_size`` cells, so they never overlap.
    """
    height, width = image_size
    rows, cols = height // digit_size, width // digit_size
    if digits_per_image > rows * cols:
        raise UserError(f"{digits_per_image} digits of {digit_size}x{digit_size} per image do not fit a "
                        f"{height}x{width} image ({rows * cols} cells): lower train_input.digits_per_image or "
                        f"digit_size, or raise model.image_size")
    digits, labels = load_mnist_arrays(embedded_digits(), split)  # (D, 28, 28) uint8, (D,) int64
    digits = _resize_nearest(digits, digit_size)  # (D, d, d)
    rng = np.random.default_rng(_SPLIT_SEEDS[split])
    order = rng.permutation(len(labels))
    count = len(labels) // digits_per_image
    images = np.zeros((count, height, width), np.uint8)
    masks = np.zeros((count, height, width), np.uint8)
    for n in range(count):
        cells = rng.choice(rows * cols, size=digits_per_image, replace=False)
        for k, cell in enumerate(cells):
            digit = order[n * digits_per_image + k]
            y, x = (cell // cols) * digit_size, (cell % cols) * digit_size
            patch = digits[digit]
            images[n, y:y + digit_size, x:x + digit_size] = patch
            ink = patch >= INK_THRESHOLD
            masks[n, y:y + digit_size, x:x + digit_size][ink] = 1 if binary else labels[digit] + 1
    what = (f"{count:,} {split} canvases of {height}x{width}, {digits_per_image} embedded UCI digits of "
            f"{digit_size}x{digit_size} each, {'ink vs background' if binary else 'classes 1..10 = digit + 1'}")
    return images[..., None], masks, what


# --------------------------------------------------------------------------- image + mask folders


def read_image(path: str, mode: str | None = None) -> np.ndarray:
    """The image at ``path`` as a uint8 array, (H, W) or (H, W, C); one line naming the file if unreadable."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if mode is not None:
                image = image.convert(mode)
            elif image.mode not in ("L", "P", "1"):
                image = image.convert("L")
            array = np.asarray(image)
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise UserError(f"{path}: not a readable image ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    return array.astype(np.uint8)


def _check_size(path: str, array: np.ndarray, image_size: tuple[int, int], what: str) -> None:
    if tuple(array.shape[:2]) != tuple(image_size):
        raise UserError(f"{path}: {what} is {array.shape[0]}x{array.shape[1]}, the model takes "
                        f"{image_size[0]}x{image_size[1]} (model.image_size); crop or resize the data first")


def _class_ids(path: str, mask: np.ndarray, num_classes: int) -> np.ndarray:
    """Mask pixel values as class ids: > 0 for binary (num_classes 2), else the value itself."""
    if num_classes == 2:
        return (mask > 0).astype(np.uint8)
    if mask.max(initial=0) >= num_classes:
        raise UserError(f"{path}: mask holds class {int(mask.max())}, outside model.num_classes {num_classes} "
                        f"[0, {num_classes})")
    return mask


def read_image_mask_folder(data_dir: str, split: str, image_size: tuple[int, int], channels: int,
                           num_classes: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``data_dir/split/images/*`` with ``data_dir/split/masks/*`` of the same file stem."""
    images_dir, masks_dir = (os.path.join(data_dir, split, sub) for sub in ("images", "masks"))
    for folder in (images_dir, masks_dir):
        if not os.path.isdir(folder):
            raise UserError(f"{folder}: no such folder (dataset: folder reads data_dir/{split}/images and "
                            f"data_dir/{split}/masks)")
    masks_by_stem = {os.path.splitext(name)[0]: name for name in os.listdir(masks_dir)
                     if name.lower().endswith(IMAGE_EXTENSIONS)}
    names = sorted(name for name in os.listdir(images_dir) if name.lower().endswith(IMAGE_EXTENSIONS))
    if not names:
        raise UserError(f"{images_dir}: holds no image ({', '.join(IMAGE_EXTENSIONS)})")
    images, masks = [], []
    for name in names:
        image_path = os.path.join(images_dir, name)
        stem = os.path.splitext(name)[0]
        if stem not in masks_by_stem:
            raise UserError(f"{image_path}: no mask for it in {masks_dir} (a file named {stem}.png or .tif)")
        mask_path = os.path.join(masks_dir, masks_by_stem[stem])
        image = read_image(image_path, "L" if channels == 1 else "RGB")
        mask = read_image(mask_path)
        if image.shape[:2] != mask.shape[:2]:
            raise UserError(f"{mask_path}: the mask is {mask.shape[0]}x{mask.shape[1]}, its image {image_path} "
                            f"{image.shape[0]}x{image.shape[1]}")
        _check_size(image_path, image, image_size, "the image")
        images.append(image.reshape(*image_size, channels))
        masks.append(_class_ids(mask_path, mask, num_classes))
    return np.stack(images), np.stack(masks), f"{len(names):,} image/mask pairs from {os.path.join(data_dir, split)}"


def write_fake_image_mask_folder(data_dir: str, split: str, count: int, image_size: tuple[int, int],
                                 extension: str = ".png", seed: int = 0) -> None:
    """``count`` grey images with square binary masks (255 inside), for tests."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for sub in ("images", "masks"):
        os.makedirs(os.path.join(data_dir, split, sub), exist_ok=True)
    height, width = image_size
    for i in range(count):
        mask = np.zeros(image_size, np.uint8)
        y, x = rng.integers(0, height // 2), rng.integers(0, width // 2)
        mask[y:y + height // 2, x:x + width // 2] = 255
        image = (rng.integers(0, 60, image_size) + (mask > 0) * 150).astype(np.uint8)
        Image.fromarray(image).save(os.path.join(data_dir, split, "images", f"{i:03d}{extension}"))
        Image.fromarray(mask).save(os.path.join(data_dir, split, "masks", f"{i:03d}{extension}"))


# --------------------------------------------------------------------------- Severstal's run-length CSV


def decode_run_length(encoded: str, shape: tuple[int, int], where: str) -> np.ndarray:
    """A (H, W) bool mask from Severstal's 'start length ...' pairs (1-based, column-major)."""
    height, width = shape
    words = encoded.split()
    if len(words) % 2:
        raise UserError(f"{where}: EncodedPixels has {len(words)} numbers; it is pairs of start and length")
    try:
        numbers = np.array([int(w) for w in words], np.int64).reshape(-1, 2)
    except ValueError:
        bad = next(w for w in words if not w.lstrip("-").isdigit())
        raise UserError(f"{where}: EncodedPixels holds {bad!r}, not a whole number") from None
    flat = np.zeros(height * width, bool)  # column-major: pixel p is (p % H, p // H)
    for start, length in numbers:
        if start < 1 or length < 1 or start - 1 + length > height * width:
            raise UserError(f"{where}: the run start {start} length {length} falls outside the "
                            f"{height}x{width} image (pixels 1..{height * width})")
        flat[start - 1:start - 1 + length] = True
    return flat.reshape(width, height).T


def encode_run_length(mask: np.ndarray) -> str:
    """The inverse of decode_run_length: a (H, W) bool mask as 'start length ...'."""
    flat = np.concatenate([[0], mask.T.reshape(-1).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(flat))  # starts and ends of runs, 0-based
    return " ".join(f"{s + 1} {e - s}" for s, e in zip(edges[::2], edges[1::2]))


def read_severstal(data_dir: str, split: str, image_size: tuple[int, int], channels: int,
                   num_classes: int) -> tuple[np.ndarray, np.ndarray, str]:
    """``data_dir/train.csv`` and ``data_dir/train_images``; ClassId is the mask's class (binary: any defect)."""
    csv_path = os.path.join(data_dir, "train.csv")
    images_dir = os.path.join(data_dir, "train_images")
    if not os.path.isfile(csv_path) or not os.path.isdir(images_dir):
        raise UserError(f"{data_dir}: dataset severstal reads train.csv and train_images/ there; one is missing")
    rows: dict[str, list[tuple[int, str, str]]] = {}
    with open(csv_path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or [h.strip() for h in header[:3]] != ["ImageId", "ClassId", "EncodedPixels"]:
            raise UserError(f"{csv_path}:1: expected the header ImageId,ClassId,EncodedPixels, got {header}")
        for line, row in enumerate(reader, start=2):
            where = f"{csv_path}:{line}"
            if len(row) != 3 or not row[1].strip().isdigit():
                raise UserError(f"{where}: expected ImageId,ClassId,EncodedPixels, got {row}")
            class_id = int(row[1])
            if class_id < 1 or (num_classes > 2 and class_id >= num_classes):
                raise UserError(f"{where}: ClassId {class_id} is outside 1..{num_classes - 1} "
                                f"(model.num_classes {num_classes})")
            rows.setdefault(row[0], []).append((class_id, row[2], where))
    names = sorted(rows)
    cut = int(round(len(names) * SEVERSTAL_TRAIN_FRACTION))
    names = names[:cut] if split == "train" else names[cut:]
    if not names:
        raise UserError(f"{csv_path}: no image left for the {split} split ({len(rows)} images in all, "
                        f"{SEVERSTAL_TRAIN_FRACTION:.0%} train)")
    images, masks = [], []
    for name in names:
        image_path = os.path.join(images_dir, name)
        image = read_image(image_path, "L" if channels == 1 else "RGB")
        _check_size(image_path, image, image_size, "the image")
        mask = np.zeros(image_size, np.uint8)
        for class_id, encoded, where in rows[name]:
            mask[decode_run_length(encoded, image_size, where)] = 1 if num_classes == 2 else class_id
        images.append(image.reshape(*image_size, channels))
        masks.append(mask)
    return np.stack(images), np.stack(masks), f"{len(names):,} {split} images of Severstal's {csv_path}"


def write_fake_severstal(data_dir: str, count: int, image_size: tuple[int, int], seed: int = 0) -> None:
    """``count`` grey images, each with one rectangular defect of class 1..4, for tests."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(data_dir, "train_images"), exist_ok=True)
    height, width = image_size
    with open(os.path.join(data_dir, "train.csv"), "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["ImageId", "ClassId", "EncodedPixels"])
        for i in range(count):
            mask = np.zeros(image_size, bool)
            y, x = rng.integers(0, height // 2), rng.integers(0, width // 2)
            mask[y:y + height // 2, x:x + width // 2] = True
            image = (rng.integers(0, 60, image_size) + mask * 150).astype(np.uint8)
            name = f"{i:04d}.png"  # the real ones are .jpg; a lossless format keeps the test's pixels exact
            Image.fromarray(image).save(os.path.join(data_dir, "train_images", name))
            writer.writerow([name, int(rng.integers(1, 5)), encode_run_length(mask)])


def load_segmentation(input_params, model_params, split: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The arrays of ``input_params['dataset']`` for ``split``: uint8 (N, H, W, C) images, (N, H, W) masks."""
    image_size = tuple(model_params["image_size"])
    channels, num_classes = model_params["input_channels"], model_params["num_classes"]
    dataset = input_params["dataset"]
    if dataset == "digits":
        if channels != 1 or num_classes not in (2, DIGIT_CLASSES):
            raise UserError(f"dataset digits: model.input_channels must be 1 and model.num_classes 2 (ink vs "
                            f"background) or {DIGIT_CLASSES} (background and ten digits), got {channels} and "
                            f"{num_classes}")
        return digit_canvases(split, image_size, input_params["digits_per_image"], input_params["digit_size"],
                              binary=num_classes == 2)
    if dataset == "folder":
        return read_image_mask_folder(input_params["data_dir"], split, image_size, channels, num_classes)
    return read_severstal(input_params["data_dir"], split, image_size, channels, num_classes)
