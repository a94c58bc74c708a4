"""Checkpoints ``model_dir/checkpoint_{step}.mdl``: written atomically, read safely.

A checkpoint is a ``torch.save`` dict of tensors and plain values only, so that it loads
with ``torch.load(weights_only=True)`` (no pickled code runs on load):

    model, optimizer, lr_scheduler, scaler   PyTorchBaseModel.get_state()
    global_step                              optimizer steps taken
    rng                                      torch (and CUDA), numpy and python RNG states
    data_order                               {"epoch", "batch"}: where the next batch comes from

The emulator writes the same format, so either can resume the other's training.
"""

from __future__ import annotations

import os
import random
import re
import zipfile
from typing import Any

import numpy as np
import torch

from common.errors import UserError
from common.io import atomic_open

_NAME = re.compile(r"^checkpoint_(\d+)\.mdl$")
REQUIRED_KEYS = ("model", "optimizer", "lr_scheduler", "global_step")


def checkpoint_path(model_dir: str, step: int) -> str:
    return os.path.join(model_dir, f"checkpoint_{step}.mdl")


def list_checkpoints(model_dir: str) -> list[tuple[int, str]]:
    """Every ``checkpoint_{step}.mdl`` in model_dir as (step, path), in step order."""
    if not os.path.isdir(model_dir):
        return []
    found = [(int(m.group(1)), os.path.join(model_dir, name))
             for name in os.listdir(model_dir) if (m := _NAME.match(name))]
    return sorted(found)


def latest_checkpoint(model_dir: str) -> str | None:
    checkpoints = list_checkpoints(model_dir)
    return checkpoints[-1][1] if checkpoints else None


def save_checkpoint(state: dict, model_dir: str, step: int, keep_max: int) -> str:
    """Write ``checkpoint_{step}.mdl`` atomically, then keep only the newest ``keep_max`` (0: all)."""
    path = checkpoint_path(model_dir, step)
    with atomic_open(path, "wb") as f:
        torch.save(state, f)
    if keep_max > 0:
        for _, old in list_checkpoints(model_dir)[:-keep_max]:
            os.remove(old)
    return path


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint safely; a missing, corrupt or foreign file is a UserError naming it."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file (zip, pickle, EOF)
        if not zipfile.is_zipfile(path):  # torch's own message would talk about weights_only
            reason = "not a torch.save archive: truncated, damaged or another format"
        elif "Weights only load failed" in str(e):
            reason = "it holds Python objects beyond tensors and plain values, which a safe load refuses"
        else:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
        raise UserError(f"{path}: not a zoo checkpoint (missing {', '.join(missing)})")
    return state


def rng_state() -> dict[str, Any]:
    """The torch, numpy and python RNG states as tensors and plain values."""
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    version, python_state, gauss_next = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "python": {"version": version, "state": torch.tensor(python_state, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(int(v) for v in p["state"].tolist()), p["gauss_next"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
