"""Image-classification data on disk, for the resnet folders (numpy and stdlib only).

Three sources, each read into uint8 images (N, H, W, C) and int64 labels (N,) or listed:

- ``digits_arrays``: the embedded UCI digits (``common.data``), padded from 28x28 to 32x32
  (as LeNet padded MNIST) and then average-pooled or repeated to the size the model takes,
  with the grey channel copied to each colour channel, so a fresh clone trains offline.
- ``read_cifar10``: CIFAR-10 in its python format (``cifar-10-batches-py``, the pickles
  that torchvision.datasets.CIFAR10 reads) or its binary format (``cifar-10-batches-bin``).
- ``list_image_folder``: an ImageNet-style tree, ``split/<class>/<image>``, classes in
  sorted order as torchvision.datasets.ImageFolder numbers them.

Bad files stop the run with one line naming the file (UserError). ``write_fake_cifar10``
and ``write_fake_image_folder`` write small such trees for tests.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from common.data import embedded_digits, load_mnist_arrays
from common.errors import UserError

DATASETS = ("digits", "cifar10", "imagefolder")
SPLITS = ("train", "test")
# per-channel means and standard deviations of the training images, in [0, 1]
MEAN_STD = {
    "digits": ((0.1307,) * 3, (0.3081,) * 3),  # MNIST's, as pytorch/mnist normalises
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "imagefolder": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet's, as torchvision's references
}
CIFAR_PY = "cifar-10-batches-py"
CIFAR_BIN = "cifar-10-batches-bin"
CIFAR_BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR_SIZE = 32
_CIFAR_RECORD = 1 + 3 * CIFAR_SIZE * CIFAR_SIZE  # binary format: label byte, then 3 planes of 32x32
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


# --------------------------------------------------------------------------- digits


def resize_by_pooling(images: np.ndarray, size: int) -> np.ndarray:
    """(N, 32, 32) uint8 -> (N, size, size): a 2x2.. mean when size divides 32, a repeat when 32 divides it."""
    n, side = images.shape[0], images.shape[1]
    if side % size == 0:
        k = side // size
        pooled = images.reshape(n, size, k, size, k).astype(np.float32).mean(axis=(2, 4))
        return np.round(pooled).astype(np.uint8)
    if size % side == 0:
        k = size // side
        return images.repeat(k, axis=1).repeat(k, axis=2)
    raise UserError(f"model.image_size {size}: the embedded digits (32x32 once padded) go to a size that divides "
                    f"32 or that 32 divides (8, 16, 32, 64, 224 ...)")


def digits_arrays(split: str, image_size: int, channels: int) -> tuple[np.ndarray, np.ndarray, str]:
    """The embedded digits as uint8 (N, image_size, image_size, channels), int64 labels, a description."""
    location = embedded_digits()
    images, labels = load_mnist_arrays(location, split)  # (N, 28, 28) uint8, (N,) int64
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))  # (N, 32, 32)
    images = resize_by_pooling(images, image_size)  # (N, S, S)
    images = np.repeat(images[..., None], channels, axis=-1)  # (N, S, S, C)
    what = (f"embedded UCI digits ({len(labels):,} {split}, padded to 32x32, {image_size}x{image_size}x{channels}; "
            f"set dataset: cifar10 or imagefolder for real data)")
    return images, labels, what


# --------------------------------------------------------------------------- CIFAR-10


def cifar10_format(data_dir: str) -> str | None:
    """'python' or 'binary' for the CIFAR-10 folder that data_dir holds (or is), else None."""
    for folder, kind in ((CIFAR_PY, "python"), (CIFAR_BIN, "binary")):
        if os.path.basename(os.path.normpath(data_dir)) == folder or os.path.isdir(os.path.join(data_dir, folder)):
            return kind
    return None


def _cifar_folder(data_dir: str, kind: str) -> str:
    folder = CIFAR_PY if kind == "python" else CIFAR_BIN
    return data_dir if os.path.basename(os.path.normpath(data_dir)) == folder else os.path.join(data_dir, folder)


class _ArraysOnly(pickle.Unpickler):
    """An unpickler that builds dicts, lists, strings, numbers and numpy arrays only: a pickle
    can name any function to call while it loads, so a CIFAR-10 batch from elsewhere could
    run code; here every other name is refused (pickle.UnpicklingError)."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               ("numpy", "ndarray"), ("numpy", "dtype")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise RefusedPickle(f"its pickle names {module}.{name}, which loading it would call (a data file "
                                f"holds arrays only); refused")
        return super().find_class(module, name)


class RefusedPickle(pickle.UnpicklingError):
    """A pickle naming a function other than numpy's array builders (``_ArraysOnly``)."""


def load_arrays_pickle(f) -> object:
    """``pickle.load(f, encoding="latin1")`` (CIFAR-10's python 2 pickles) building data only."""
    return _ArraysOnly(f, encoding="latin1").load()


def _read_python_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            entry = load_arrays_pickle(f)
    except RefusedPickle as e:
        raise UserError(f"{path}: {e}") from None
    except FileNotFoundError:
        raise UserError(f"{path}: missing (a CIFAR-10 python folder holds data_batch_1..5 and test_batch)") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError) as e:
        raise UserError(f"{path}: not a readable CIFAR-10 python batch ({type(e).__name__}: {e}); the file "
                        f"is truncated or damaged, download it again") from None
    if not isinstance(entry, dict) or "data" not in entry or not ("labels" in entry or "fine_labels" in entry):
        raise UserError(f"{path}: not a CIFAR-10 python batch (no 'data' and 'labels' entries)")
    data = np.asarray(entry["data"], dtype=np.uint8)
    labels = np.asarray(entry.get("labels", entry.get("fine_labels")), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != _CIFAR_RECORD - 1 or data.shape[0] != labels.shape[0]:
        raise UserError(f"{path}: 'data' is {data.shape} for {labels.shape[0]} labels; CIFAR-10 holds "
                        f"(N, {_CIFAR_RECORD - 1}) rows, one per label")
    return data, labels


def _read_binary_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        raw = np.fromfile(path, dtype=np.uint8)
    except FileNotFoundError:
        raise UserError(f"{path}: missing (a CIFAR-10 binary folder holds data_batch_1..5.bin and "
                        f"test_batch.bin)") from None
    if raw.size == 0 or raw.size % _CIFAR_RECORD:
        raise UserError(f"{path}: {raw.size:,} bytes, not a whole number of {_CIFAR_RECORD:,}-byte CIFAR-10 "
                        f"records; the file is truncated or damaged, download it again")
    records = raw.reshape(-1, _CIFAR_RECORD)
    return records[:, 1:], records[:, 0].astype(np.int64)


def read_cifar10(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray, str]:
    """uint8 (N, 32, 32, 3), int64 labels in [0, 10), and a description, of one split."""
    if split not in SPLITS:
        raise UserError(f"CIFAR-10 split {split!r} is unknown; valid: {', '.join(SPLITS)}")
    kind = cifar10_format(data_dir)
    if kind is None:
        raise UserError(f"{data_dir}: holds no {CIFAR_PY}/ or {CIFAR_BIN}/ (dataset: cifar10); see "
                        f"datasets/README.md for where to put CIFAR-10")
    folder = _cifar_folder(data_dir, kind)
    data, labels = [], []
    for name in CIFAR_BATCHES[split]:
        path = os.path.join(folder, name if kind == "python" else name + ".bin")
        rows, row_labels = (_read_python_batch if kind == "python" else _read_binary_batch)(path)
        if row_labels.size and (row_labels.min() < 0 or row_labels.max() > 9):
            raise UserError(f"{path}: labels must be 0-9, found {row_labels.min()}..{row_labels.max()}")
        data.append(rows)
        labels.append(row_labels)
    rows = np.concatenate(data)  # (N, 3072): 1024 red, 1024 green, 1024 blue, each row-major
    images = rows.reshape(-1, 3, CIFAR_SIZE, CIFAR_SIZE).transpose(0, 2, 3, 1)  # (N, 32, 32, 3)
    labels_all = np.concatenate(labels)
    return np.ascontiguousarray(images), labels_all, f"CIFAR-10 ({kind} format) from {folder} ({len(labels_all):,} {split})"


def write_fake_cifar10(data_dir, per_batch: int, kind: str = "python", seed: int = 0) -> str:
    """A CIFAR-10 folder of the given format under data_dir, for tests: class k is a bright
    square at the k-th of 10 places over faint noise. Returns the folder written."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(os.fspath(data_dir), CIFAR_PY if kind == "python" else CIFAR_BIN)
    os.makedirs(folder, exist_ok=True)
    if kind == "python":
        with open(os.path.join(folder, "batches.meta"), "wb") as f:
            pickle.dump({"label_names": [f"class_{k}" for k in range(10)], "num_vis": 3072,
                         "num_cases_per_batch": per_batch}, f)
    else:
        with open(os.path.join(folder, "batches.meta.txt"), "w", encoding="utf-8") as f:
            f.write("".join(f"class_{k}\n" for k in range(10)))
    for name in CIFAR_BATCHES["train"] + CIFAR_BATCHES["test"]:
        labels = rng.integers(0, 10, per_batch)
        images = rng.integers(0, 40, (per_batch, 3, CIFAR_SIZE, CIFAR_SIZE)).astype(np.uint8)
        for i, label in enumerate(labels):
            row, col = divmod(int(label), 5)
            images[i, :, 4 + 12 * row:12 + 12 * row, 1 + 6 * col:6 + 6 * col] = 230
        rows = images.reshape(per_batch, -1)
        if kind == "python":
            with open(os.path.join(folder, name), "wb") as f:
                pickle.dump({"batch_label": name, "labels": labels.tolist(), "data": rows,
                             "filenames": [f"{name}_{i}.png" for i in range(per_batch)]}, f)
        else:
            records = np.concatenate([labels.astype(np.uint8)[:, None], rows], axis=1)
            records.tofile(os.path.join(folder, name + ".bin"))
    return folder


# --------------------------------------------------------------------------- image folders


def list_image_folder(root: str) -> tuple[list[tuple[str, int]], list[str]]:
    """(path, class index) of every image under root/<class>/, and the sorted class names.

    A class folder without an image, a tree without class folders, or a file with an
    extension that is not an image's, stops here with one line naming it."""
    if not os.path.isdir(root):
        raise UserError(f"{root}: no such folder (an image folder holds one sub-folder of images per class)")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    if not classes:
        raise UserError(f"{root}: holds no class folders (expected {root}/<class>/<image>)")
    samples = []
    for index, name in enumerate(classes):
        folder = os.path.join(root, name)
        files = sorted(e.path for e in os.scandir(folder) if e.is_file() and not e.name.startswith("."))
        images = [f for f in files if f.lower().endswith(IMAGE_EXTENSIONS)]
        if not images:
            raise UserError(f"{folder}: class folder '{name}' holds no image (extensions "
                            f"{', '.join(IMAGE_EXTENSIONS)}); remove it or add its images")
        samples += [(path, index) for path in images]
    return samples, classes


def write_fake_image_folder(root, classes: int, per_class: int, size: int = 16, seed: int = 0) -> str:
    """root/class_<k>/<i>.bmp images for tests (BMP: PIL and tf.io.decode_image both read it);
    class k is a bright square in the (k mod 4)-th quarter over faint noise."""
    rng = np.random.default_rng(seed)
    for k in range(classes):
        folder = os.path.join(os.fspath(root), f"class_{k}")
        os.makedirs(folder, exist_ok=True)
        for i in range(per_class):
            image = rng.integers(0, 40, (size, size, 3)).astype(np.uint8)
            row, col = divmod(k % 4, 2)
            half = size // 2
            image[row * half + 1:(row + 1) * half - 1, col * half + 1:(col + 1) * half - 1] = 230
            write_bmp(os.path.join(folder, f"{i}.bmp"), image)
    return os.fspath(root)


def write_bmp(path: str, image: np.ndarray) -> None:
    """A 24-bit uncompressed BMP of uint8 (H, W, 3) RGB: a format both PIL and tf.io.decode_image read."""
    height, width, _ = image.shape
    row_bytes = (3 * width + 3) // 4 * 4  # rows are padded to 4 bytes
    pixels = np.zeros((height, row_bytes), np.uint8)
    pixels[:, :3 * width] = image[::-1, :, ::-1].reshape(height, -1)  # bottom-up rows, BGR
    header = (b"BM" + (54 + pixels.size).to_bytes(4, "little") + b"\0\0\0\0" + (54).to_bytes(4, "little")
              + (40).to_bytes(4, "little") + width.to_bytes(4, "little") + height.to_bytes(4, "little")
              + (1).to_bytes(2, "little") + (24).to_bytes(2, "little") + b"\0" * 4
              + pixels.size.to_bytes(4, "little") + b"\0" * 16)
    with open(path, "wb") as f:
        f.write(header + pixels.tobytes())
