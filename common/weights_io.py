"""Weights files read and written without a model: safetensors and TF checkpoints' variables.

The lowest layer of ``zoo convert`` (common/convert.py) and of the name tables
(common/bert_names.py, common/gpt2_names.py), which import it and not each other's
callers. safetensors is read and written here (the format is a length, a JSON header and
the raw little-endian bytes; https://github.com/huggingface/safetensors), so no package is
needed; torch and TensorFlow are imported only when their tensors are asked for.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

from common.errors import UserError
from common.io import atomic_open

# safetensors dtype codes <-> torch dtypes (by name, so that this module loads without torch)
_SAFETENSORS = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}
_HEADER_LIMIT = 100 * 2**20  # a header larger than this is not a safetensors file

# --- safetensors --------------------------------------------------------------------------

def save_safetensors(tensors: dict[str, Any], path: str, metadata: dict[str, str] | None = None) -> None:
    """Write torch tensors as safetensors (row-major, little-endian, 8-byte aligned header)."""
    torch = _torch()

    codes = {v: k for k, v in _SAFETENSORS.items()}
    header: dict[str, Any] = {"__metadata__": dict(metadata or {})}
    blobs, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        dtype = str(t.dtype).removeprefix("torch.")
        if dtype not in codes:
            raise UserError(f"{name}: dtype {dtype} has no safetensors code")
        array = (t.view(torch.int16) if dtype == "bfloat16" else t).numpy()  # numpy has no bfloat16: its bits
        raw = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": codes[dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with atomic_open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def load_safetensors(path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """(tensors, metadata) of a safetensors file; a malformed one is a UserError naming it."""
    import numpy as np

    with open(path, "rb") as f:
        data = f.read()
    arrays = {}
    try:
        (size,) = struct.unpack("<Q", data[:8])
        if size > _HEADER_LIMIT or 8 + size > len(data):
            raise ValueError("the header length is past the end of the file")
        header = json.loads(data[8:8 + size])
        body = memoryview(data)[8 + size:]
        metadata = header.pop("__metadata__", {}) or {}
        for name, info in header.items():
            dtype = _SAFETENSORS[info["dtype"]]
            begin, end = info["data_offsets"]
            if not 0 <= begin <= end <= len(body):
                raise ValueError(f"{name}'s bytes lie outside the file")
            storage = "int16" if dtype == "bfloat16" else dtype  # numpy has no bfloat16: its bits
            array = np.frombuffer(body[begin:end], dtype=np.dtype(storage).newbyteorder("<")).reshape(info["shape"])
            arrays[name] = (array.astype(np.dtype(storage)), dtype)
    except (ValueError, KeyError, TypeError, struct.error, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    torch = _torch()
    tensors = {}
    for name, (array, dtype) in arrays.items():
        tensor = torch.from_numpy(array.copy())
        tensors[name] = tensor.view(torch.bfloat16) if dtype == "bfloat16" else tensor
    return tensors, metadata


def _torch():
    """torch, which reading and writing PyTorch weights needs; a UserError where it is not installed."""
    try:
        import torch
    except ImportError:
        raise UserError("converting PyTorch weights needs torch, which is not installed here "
                        "(pip install -e \".[pytorch]\")") from None
    return torch

# --- TF checkpoints -----------------------------------------------------------------------

def tf_checkpoint(path: str) -> str:
    """The prefix of the TF checkpoint ``path`` names: itself, or a model_dir's newest."""
    if os.path.isdir(path):
        _tensorflow()
        from common.tf.estimator import checkpoints

        found = checkpoints.latest_checkpoint(path)
        if found is None:
            raise UserError(f"{path}: no TF checkpoint (model.ckpt-N) in this folder")
        return found
    return path[:-len(".index")] if path.endswith(".index") else path


def _tensorflow():
    """TensorFlow, which reading a TF checkpoint needs; a UserError where it is not installed."""
    try:
        import common.tf.run  # noqa: F401 - TensorFlow's first import, its CUDA start-up lines kept out of stderr
        import tensorflow as tf
    except ImportError:
        raise UserError("reading a TF checkpoint needs TensorFlow, which is not installed here "
                        "(pip install -e \".[tf]\")") from None
    return tf


def tf_variables(prefix: str) -> dict[str, Any]:
    tf = _tensorflow()

    try:
        reader = tf.train.load_checkpoint(prefix)
        dtypes = reader.get_variable_to_dtype_map()
        # a variant (the runner's saved tf.data iterator position) has no numpy form, and is no weight
        return {name: reader.get_tensor(name) for name in sorted(dtypes) if dtypes[name] != tf.variant}
    except Exception as e:  # noqa: BLE001 - TF's errors for a damaged checkpoint
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{prefix}: not a readable TF checkpoint ({first})") from None
