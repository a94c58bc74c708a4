"""MNIST on disk, shared by the TF and PyTorch input pipelines (numpy and stdlib only).

The one layout both frameworks read is torchvision's:

    <root>/MNIST/raw/train-images-idx3-ubyte   uint8 (60000, 28, 28)
    <root>/MNIST/raw/train-labels-idx1-ubyte   uint8 (60000,)
    <root>/MNIST/raw/t10k-images-idx3-ubyte    uint8 (10000, 28, 28)
    <root>/MNIST/raw/t10k-labels-idx1-ubyte    uint8 (10000,)

uncompressed, because torchvision 0.29's ``MNIST(root, download=False)`` opens exactly
these four paths with a plain ``open`` (no gzip, no checksum) and refuses the folder if
one is missing. The PyTorch side hands ``MnistLocation.root`` to torchvision; the TF
side reads the same files with ``load_mnist_arrays``.

Nothing is downloaded at run time: ``prepare_mnist`` (``datasets/prepare_mnist.py``)
puts real MNIST into a data_dir once, and ``resolve_mnist`` falls back to the UCI
handwritten digits embedded in the repository (``datasets/make_embedded_digits.py``)
when the data_dir holds no MNIST.
"""

import gzip
import logging
import math
import os
import shlex
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import UserError
from common.io import atomic_open

logger = logging.getLogger(__name__)

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
_ALL_FILES = MNIST_FILES["train"] + MNIST_FILES["test"]

# The embedded digits live in the repository, found relative to this file: the zoo is
# installed editable (`pip install -e .`), so common/ stays inside the checkout and
# ../../datasets is the checkout's datasets/ folder.
EMBEDDED_DIGITS_ROOT = Path(__file__).resolve().parents[2] / "datasets" / "embedded" / "uci_digits"

# The scripts by their absolute paths, so that a printed command works from any directory
# (the zoo is installed, `pip install -e .`, so the scripts find `common` from anywhere).
PREPARE_SCRIPT = Path(__file__).resolve().parents[2] / "datasets" / "prepare_mnist.py"
_PREPARE_COMMAND = (f"python {shlex.quote(str(PREPARE_SCRIPT))} --source <folder with the four IDX files> "
                    "--data_dir {}")
_REGENERATE_COMMAND = f"python {shlex.quote(str(PREPARE_SCRIPT.with_name('make_embedded_digits.py')))}"

# IDX magic: two zero bytes, a type code, the number of dimensions. Only unsigned bytes
# (type 0x08) occur in MNIST, so 0x00000801 is a label file and 0x00000803 an image file.
_IDX_UBYTE = 0x08
_GZIP_MAGIC = b"\x1f\x8b"
# Enough to read the header of any IDX file with up to 3 dimensions.
_HEADER_PEEK = 4 + 4 * 3


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


@dataclass(frozen=True)
class PreparedFile:
    """One file written by ``prepare_mnist``."""

    path: str  # where it now is, in data_dir/MNIST/raw
    source: str  # the file or URL it came from
    shape: tuple[int, ...]


# ----------------------------------------------------------------------------- IDX files


def read_idx(path) -> np.ndarray:
    """Read an IDX file of unsigned bytes, gzipped when its name ends in .gz.

    Returns uint8 of the shape in its header: (N, rows, cols) for images, (N,) for labels.
    Raises UserError naming the file for a wrong magic number, a size that disagrees
    with the header, or a .gz name on data that is not gzip.
    """
    path = os.fspath(path)
    return _parse_idx(_gunzip_if_named(_read_bytes(path), path), path)


def write_idx(path, array) -> None:
    """Write a uint8 array as an IDX file (gzipped when the name ends in .gz), atomically."""
    path = os.fspath(path)
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise TypeError(f"write_idx writes uint8 arrays only, got {array.dtype}")
    if not 1 <= array.ndim <= 255:
        raise ValueError(f"an IDX file holds 1 to 255 dimensions, got shape {array.shape}")
    header = bytes([0, 0, _IDX_UBYTE, array.ndim]) + b"".join(n.to_bytes(4, "big") for n in array.shape)
    data = header + np.ascontiguousarray(array).tobytes()
    if path.endswith(".gz"):
        # mtime=0 so the same array always gives the same bytes.
        data = gzip.compress(data, mtime=0)
    with atomic_open(path, "wb") as f:
        f.write(data)


def _read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None


def _gunzip_if_named(data: bytes, name: str) -> bytes:
    if not name.endswith(".gz"):
        return data
    if not data.startswith(_GZIP_MAGIC):
        raise UserError(
            f"{name}: named .gz but not gzip-compressed (already decompressed? drop .gz from its name)"
        )
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:
        raise UserError(f"{name}: corrupt gzip data: {e}") from None


def _parse_header(head: bytes, name: str) -> tuple[tuple[int, ...], int]:
    """(shape, header length) from the first bytes of an IDX file."""
    if len(head) < 4:
        raise UserError(f"{name}: truncated IDX file: {len(head)} bytes, too short for the magic number")
    if head[:2] != b"\x00\x00" or head[2] != _IDX_UBYTE or head[3] == 0:
        gzipped = head.startswith(_GZIP_MAGIC)
        hint = " (the data is gzip-compressed: name it .gz or decompress it)" if gzipped else ""
        raise UserError(
            f"{name}: not an IDX file of unsigned bytes: magic 0x{int.from_bytes(head[:4], 'big'):08X}, "
            f"expected 0x00000801 (labels) or 0x00000803 (images){hint}"
        )
    ndim = head[3]
    header_len = 4 + 4 * ndim
    if len(head) < header_len:
        raise UserError(f"{name}: truncated IDX file: the header needs {header_len} bytes, found {len(head)}")
    shape = tuple(int.from_bytes(head[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    return shape, header_len


def _check_data_length(shape: tuple[int, ...], found: int, name: str) -> None:
    promised = math.prod(shape)
    if found < promised:
        raise UserError(f"{name}: truncated IDX file: header promises {promised} bytes of data, found {found}")
    if found > promised:
        raise UserError(f"{name}: IDX file has {found - promised} bytes after the {promised} its header promises")


def _parse_idx(data: bytes, name: str) -> np.ndarray:
    shape, header_len = _parse_header(data[: 4 + 4 * 255], name)
    _check_data_length(shape, len(data) - header_len, name)
    # frombuffer over bytes is read-only; the copy gives callers an ordinary array.
    return np.frombuffer(data, dtype=np.uint8, offset=header_len).reshape(shape).copy()


def _idx_shape(path: str) -> tuple[int, ...]:
    """The shape in an uncompressed IDX file's header, checked against the file size
    without reading the data (cheap enough to run on every resolve)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_PEEK)
        size = os.path.getsize(path)
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    shape, header_len = _parse_header(head, path)
    _check_data_length(shape, size - header_len, path)
    return shape


# ------------------------------------------------------------------------ prepare_mnist


def prepare_mnist(source: str, data_dir: str) -> list[PreparedFile]:
    """Put the four MNIST files from `source` into data_dir/MNIST/raw, uncompressed.

    `source` is a local folder holding the four files (gzipped or not; names with or
    without .gz, `-idx3-ubyte` or `.idx3-ubyte`; also searched: source/MNIST/raw) or an
    http(s)/ftp/file URL of a folder to download them from. Every file is read and
    checked before anything is written, so bad input leaves data_dir as it was.
    """
    source, data_dir = os.fspath(source), os.fspath(data_dir)
    if urllib.parse.urlparse(source).scheme in ("http", "https", "ftp", "file"):
        fetched = _download_mnist(source)
    else:
        fetched = _find_local_mnist(source)
    arrays = {}  # name -> (origin, array)
    for name, (origin, data) in fetched.items():
        arrays[name] = (origin, _parse_idx(_gunzip_if_named(data, origin), origin))
    for split in SPLITS:
        _check_split(*(arrays[name] for name in MNIST_FILES[split]))

    # All four are written into a staging folder beside raw/ first, so a failed write
    # (a full disk) leaves no mix of old and new files in raw/.
    raw_dir = os.path.join(data_dir, "MNIST", "raw")
    created = _makedirs_tracked(raw_dir)
    staging = tempfile.mkdtemp(dir=os.path.dirname(raw_dir), prefix=".raw-staging-")
    try:
        for name, (_, array) in arrays.items():
            write_idx(os.path.join(staging, name), array)
    except BaseException:
        shutil.rmtree(staging)
        for folder in created:
            os.rmdir(folder)
        raise
    for name in arrays:
        os.replace(os.path.join(staging, name), os.path.join(raw_dir, name))
    os.rmdir(staging)
    _warn_if_legacy_processed(data_dir)
    return [
        PreparedFile(os.path.join(raw_dir, name), origin, array.shape) for name, (origin, array) in arrays.items()
    ]


def _makedirs_tracked(folder: str) -> list[str]:
    """os.makedirs(folder), returning the folders it created, deepest first."""
    created = []
    current = os.path.abspath(folder)
    while not os.path.isdir(current):
        if os.path.exists(current):
            raise UserError(f"{current}: exists and is not a folder")
        created.append(current)
        current = os.path.dirname(current)
    os.makedirs(folder, exist_ok=True)
    return created


def _spellings(name: str) -> list[str]:
    # Files from some mirrors spell "train-images.idx3-ubyte" with a dot.
    return [name, name.replace("-idx", ".idx")]


def _find_local_mnist(source: str) -> dict[str, tuple[str, bytes]]:
    """name -> (path, raw bytes) for the four files in a folder. An uncompressed file
    wins over a .gz one of the same name (after `gunzip -k` both are there)."""
    if not os.path.isdir(source):
        raise UserError(
            f"MNIST source {source}: no such folder (pass a folder holding the four IDX files, or a URL)"
        )
    folders = [source, os.path.join(source, "MNIST", "raw")]
    found, missing = {}, []
    for name in _ALL_FILES:
        candidates = [
            os.path.join(folder, spelling + suffix)
            for folder in folders
            for suffix in ("", ".gz")
            for spelling in _spellings(name)
        ]
        path = next((c for c in candidates if os.path.isfile(c)), None)
        if path is None:
            missing.append(name + "[.gz]")
            continue
        found[name] = (path, _read_bytes(path))
    if missing:
        raise UserError(f"MNIST source {source}: no {', '.join(missing)} there")
    return found


def _download_mnist(base_url: str) -> dict[str, tuple[str, bytes]]:
    """name -> (url, raw bytes), trying the .gz name first as the public mirrors serve it."""
    base_url = base_url.rstrip("/") + "/"
    fetched = {}
    for name in _ALL_FILES:
        urls = [base_url + spelling + suffix for spelling in _spellings(name) for suffix in (".gz", "")]
        first_reason = None
        for url in urls:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:
                    fetched[name] = (url, response.read())
                break
            except urllib.error.HTTPError as e:
                # The server answered: this spelling is not there; try the next one.
                first_reason = first_reason or str(e)
            except urllib.error.URLError as e:
                if not isinstance(e.reason, FileNotFoundError):
                    raise _download_error(url, e.reason) from None
                first_reason = first_reason or f"{e.reason.strerror}"
            except OSError as e:  # timeouts and resets while reading the body
                raise _download_error(url, e) from None
        else:
            raise _download_error(urls[0], first_reason)
    return fetched


def _download_error(url: str, reason) -> UserError:
    return UserError(
        f"could not download {url}: {reason}; copy the four files into a folder and pass it with --source"
    )


def _check_split(images: tuple[str, np.ndarray], labels: tuple[str, np.ndarray]) -> None:
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


def _warn_if_legacy_processed(root: str) -> None:
    # torchvision prefers MNIST/processed/{training,test}.pt, written by versions before
    # 0.9, over the raw files: the PyTorch side would then read other data than the TF side.
    processed = os.path.join(root, "MNIST", "processed")
    if all(os.path.isfile(os.path.join(processed, f)) for f in ("training.pt", "test.pt")):
        logger.warning(
            "data: %s holds torchvision's legacy training.pt/test.pt, which torchvision reads instead of "
            "MNIST/raw; delete that folder so both frameworks read the same files",
            processed,
        )


# ------------------------------------------------------------------------ resolve_mnist


def resolve_mnist(data_dir: str, dataset: str = "auto") -> MnistLocation:
    """Which MNIST-layout folder to read, for both frameworks' data.py.

    dataset "auto": data_dir if it holds the four MNIST files (data_dir may also name its
    MNIST or MNIST/raw folder), else the embedded UCI digits with one log line saying so;
    "mnist": data_dir must hold them (UserError otherwise); "uci_digits": the embedded digits.
    """
    if dataset not in DATASETS:
        raise UserError(f"dataset {dataset!r} is unknown; valid: {', '.join(DATASETS)}")
    if dataset == "uci_digits":
        return embedded_digits()
    data_dir = os.fspath(data_dir) if data_dir else ""
    root = _mnist_root(data_dir) if data_dir else None
    if root is not None:
        return _mnist_location(root)
    expected = os.path.join(data_dir or "<data_dir>", "MNIST", "raw")
    if dataset == "mnist":
        prepare = _PREPARE_COMMAND.format(data_dir or "<data_dir>")
        if not data_dir:
            raise UserError(f"dataset 'mnist' needs a data_dir holding {expected}; prepare one with: {prepare}")
        if not os.path.isdir(data_dir):
            raise UserError(
                f"data_dir {data_dir} does not exist (dataset 'mnist' reads {expected}); "
                f"prepare it with: {prepare}"
            )
        missing = os.path.join(expected, _missing_files(data_dir)[0])
        raise UserError(f"data_dir {data_dir} has no {missing} (dataset 'mnist'); prepare it with: {prepare}")
    location = embedded_digits()
    missing = _missing_files(data_dir) if data_dir else list(_ALL_FILES)
    if len(missing) == len(_ALL_FILES):
        what = "no MNIST"
    else:
        what = f"an incomplete MNIST (no {', '.join(missing)} in {expected})"
    logger.warning(
        "data: %s holds %s; using the embedded UCI handwritten digits (%s train / %s test, 28x28). "
        "For full MNIST run: %s",
        data_dir or "(no data_dir)",
        what,
        f"{location.num_train:,}",
        f"{location.num_test:,}",
        _PREPARE_COMMAND.format(shlex.quote(os.path.abspath(data_dir)) if data_dir else "<data_dir>"),
    )
    return location


def embedded_digits() -> MnistLocation:
    """The UCI handwritten digits committed under datasets/embedded/uci_digits."""
    root = str(EMBEDDED_DIGITS_ROOT)
    missing = _missing_files(root)
    if missing:
        raise UserError(
            f"the embedded digits are missing: no {os.path.join(root, 'MNIST', 'raw', missing[0])} (they ship "
            f"with the repository; install the zoo from a checkout with `pip install -e .`, or regenerate them "
            f"with {_REGENERATE_COMMAND})"
        )
    num_train, num_test = _split_sizes(root)
    return MnistLocation(
        root=root,
        kind="uci_digits",
        description=(
            f"embedded UCI handwritten digits ({num_train:,} train / {num_test:,} test, 28x28, upscaled from 8x8)"
        ),
        num_train=num_train,
        num_test=num_test,
    )


def _missing_files(root: str) -> list[str]:
    raw = os.path.join(root, "MNIST", "raw")
    return [name for name in _ALL_FILES if not os.path.isfile(os.path.join(raw, name))]


def _mnist_root(data_dir: str) -> str | None:
    """The torchvision root for data_dir: data_dir itself, or its grandparent/parent
    when data_dir names the MNIST/raw or MNIST folder; None when none holds all four."""
    path = Path(data_dir)
    candidates = [path]
    if path.name == "MNIST":
        candidates.append(path.parent)
    if path.name == "raw" and path.parent.name == "MNIST":
        candidates.append(path.parent.parent)
    for candidate in candidates:
        if not _missing_files(str(candidate)):
            return str(candidate)
    return None


def _split_sizes(root: str) -> tuple[int, int]:
    """(train, test) sizes from the headers, after checking each split's two files agree."""
    raw = os.path.join(root, "MNIST", "raw")
    sizes = []
    for split in SPLITS:
        images_path, labels_path = (os.path.join(raw, name) for name in MNIST_FILES[split])
        images_shape, labels_shape = _idx_shape(images_path), _idx_shape(labels_path)
        if len(images_shape) != 3 or images_shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
            raise UserError(f"{images_path}: expected images of shape (N, 28, 28), found {images_shape}")
        if len(labels_shape) != 1 or labels_shape[0] != images_shape[0]:
            raise UserError(
                f"{labels_path}: shape {labels_shape}, but {images_path} holds {images_shape[0]} images"
            )
        sizes.append(images_shape[0])
    return sizes[0], sizes[1]


def _mnist_location(root: str) -> MnistLocation:
    num_train, num_test = _split_sizes(root)
    _warn_if_legacy_processed(root)
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
    _check_split((images_path, images), (labels_path, labels))
    return images, labels.astype(np.int64)


# ---------------------------------------------------------------------- test data


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
    return _mnist_location(os.fspath(data_dir))
