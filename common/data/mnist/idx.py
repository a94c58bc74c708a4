"""The IDX file format MNIST ships in: read, write, and the header's shape (numpy and stdlib only)."""

from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np

from common.errors import UserError
from common.io import atomic_open

# IDX magic: two zero bytes, a type code, the number of dimensions. Only unsigned bytes
# (type 0x08) occur in MNIST, so 0x00000801 is a label file and 0x00000803 an image file.
_IDX_UBYTE = 0x08
_GZIP_MAGIC = b"\x1f\x8b"
# Enough to read the header of any IDX file with up to 3 dimensions.
_HEADER_PEEK = 4 + 4 * 3


def read_idx(path) -> np.ndarray:
    """Read an IDX file of unsigned bytes, gzipped when its name ends in .gz.

    Returns uint8 of the shape in its header: (N, rows, cols) for images, (N,) for labels.
    Raises UserError naming the file for a wrong magic number, a size that disagrees
    with the header, or a .gz name on data that is not gzip.
    """
    path = os.fspath(path)
    return parse_idx(gunzip_if_named(read_bytes(path), path), path)


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


def read_bytes(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None


def gunzip_if_named(data: bytes, name: str) -> bytes:
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


def parse_idx(data: bytes, name: str) -> np.ndarray:
    shape, header_len = _parse_header(data[: 4 + 4 * 255], name)
    _check_data_length(shape, len(data) - header_len, name)
    # frombuffer over bytes is read-only; the copy gives callers an ordinary array.
    return np.frombuffer(data, dtype=np.uint8, offset=header_len).reshape(shape).copy()


def idx_shape(path: str) -> tuple[int, ...]:
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
