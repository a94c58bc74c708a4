"""Checkpoints ``model_dir/checkpoint_{step}.mdl``: written atomically, read safely.

A checkpoint is a ``torch.save`` dict of tensors and plain values only, so that it loads
with ``torch.load(weights_only=True)`` (no pickled code runs on load):

    model, optimizer, lr_scheduler, scaler   PyTorchBaseModel.get_state()
    global_step                              optimizer steps taken
    rng                                      torch (and CUDA), numpy and python RNG states
    data_order                               {"epoch", "batch"}: where the next batch comes from

The emulator writes the same format, so either can resume the other's training.

A kill during a save leaves no half-written checkpoint (the write is atomic), but a disk
that fills up, a copy cut short or a bad sector can still leave a damaged newest file
(torch.load itself does not check the zip's CRC-32 of each entry, so a flipped bit in a
tensor would load as a wrong weight; ``load_checkpoint`` checks them first):
``last_readable`` then falls back to the newest one that reads, with a warning naming
the bad file, and refuses (naming every bad file) when none reads, so that a training run
never starts again from step 0 over a model_dir that holds checkpoints.
"""

from __future__ import annotations

import logging
import os
import random
import re
import zipfile
import zlib
from typing import Any, Mapping

import numpy as np
import torch

from common.errors import UserError
from common.io import atomic_open

logger = logging.getLogger("zoo")

_NAME = re.compile(r"^checkpoint_(\d+)\.mdl$")
REQUIRED_KEYS = ("model", "optimizer", "lr_scheduler", "global_step")


class UnreadableCheckpoint(UserError):
    """A checkpoint file that is missing, damaged or not a zoo checkpoint (as opposed to one
    that reads fine but does not fit the model)."""


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
    try:
        with atomic_open(path, "wb") as f:
            torch.save(state, f)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write as a RuntimeError
        raise not_saved(path, e, latest_checkpoint(model_dir)) from None
    if keep_max > 0:
        for _, old in list_checkpoints(model_dir)[:-keep_max]:
            os.remove(old)
    return path


def not_saved(path: str, error: BaseException, kept: str | None) -> BaseException:
    """A checkpoint write that the disk refused (full, over quota, read-only) as one line naming
    the file and the newest complete checkpoint, which the atomic write left as it was; any
    other error as it is (a bug keeps its traceback)."""
    cause: BaseException | None = error
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return error
    return UserError(f"{path}: not saved ({cause.strerror or cause}); the newest complete checkpoint is kept: "
                     f"{kept or 'none (none was written yet)'}")


def load_checkpoint(path: str) -> dict:
    """Read a checkpoint safely; a missing, corrupt or foreign file is a UserError naming it."""
    if not os.path.isfile(path):
        raise UnreadableCheckpoint(f"{path}: checkpoint not found")
    damaged = _bad_entry(path)
    if damaged:
        raise UnreadableCheckpoint(f"{path}: not a readable checkpoint (damaged: {damaged})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file (zip, pickle, EOF)
        if not zipfile.is_zipfile(path):  # torch's own message would talk about weights_only
            reason = "not a torch.save archive: truncated, damaged or another format"
        elif "Weights only load failed" in str(e):
            reason = "it holds Python objects beyond tensors and plain values, which a safe load refuses"
        else:
            reason = _shorten((str(e).strip().splitlines() or [type(e).__name__])[0])
        raise UnreadableCheckpoint(f"{path}: not a readable checkpoint ({reason})") from None
    if not isinstance(state, dict) or any(key not in state for key in REQUIRED_KEYS):
        missing = [k for k in REQUIRED_KEYS if not isinstance(state, dict) or k not in state]
        raise UnreadableCheckpoint(f"{path}: not a zoo checkpoint (missing {', '.join(missing)})")
    return state


def _bad_entry(path: str) -> str | None:
    """What is damaged in the zip archive of a torch.save file: the first entry whose CRC-32
    does not match its bytes, or None (also None for a file that is no zip: torch.load says so)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return None
    try:
        with archive:
            bad = archive.testzip()  # a garbled entry header counts as a bad entry there too
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, zlib.error) as e:  # data cut short or garbled
        return _shorten(str(e) or type(e).__name__)
    return f"the CRC-32 of entry {bad} does not match its bytes" if bad else None


def last_readable(checkpoints: list[tuple[int, str]], model_dir: str, warn: bool = True) -> tuple[str, dict] | None:
    """The last of ``checkpoints`` (in step order: the newest) that reads, as (path, state); None
    when there are none at all.

    Each unreadable one after it is skipped, with a warning naming it when ``warn``; when none
    reads, a UserError names them all (starting from scratch would silently overwrite them).
    """
    bad: list[tuple[str, UnreadableCheckpoint]] = []
    for _, path in reversed(checkpoints):
        try:
            state = load_checkpoint(path)
        except UnreadableCheckpoint as e:
            bad.append((path, e))
            continue
        for _, error in bad if warn else ():
            logger.warning("%s; skipped, using %s instead", error, path)
        return path, state
    if not bad:
        return None
    if len(bad) == 1:
        raise UserError(f"{bad[0][1]}, and {model_dir} holds no other checkpoint; move it away to start from "
                        f"step 0, or pass --checkpoint_path")
    names = ", ".join(os.path.basename(path) for path, _ in bad)
    raise UserError(f"{model_dir}: none of its {len(bad)} checkpoints reads ({names}; the newest: {bad[0][1]}); "
                    f"move them away to start from step 0, or pass --checkpoint_path")


def _names(names: list[str], shown: int = 3) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _shorten(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut at a word boundary (never mid-word) when longer than ``limit``."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."


def optimizer_mismatch(saved: Any, current: Mapping[str, Any]) -> str | None:
    """Why an optimizer state_dict (``saved``) is another kind of optimizer's than ``current``,
    or None. torch's load_state_dict takes another optimizer's settings without a word, and
    the first step then fails on a missing setting (SGD's 'momentum' after Adam's state)."""
    groups = saved.get("param_groups") if isinstance(saved, Mapping) else None
    if not isinstance(groups, list) or not groups or not all(isinstance(g, Mapping) for g in groups):
        return None  # load_state_dict itself says what is wrong with it
    theirs = set().union(*(g.keys() for g in groups)) - {"params"}
    ours = set().union(*(g.keys() for g in current["param_groups"])) - {"params"}
    # settings only here: a newer torch's (it fills their defaults on load); settings on both
    # sides that the other lacks: another optimizer
    if not (theirs - ours and ours - theirs):
        return None
    return (f"its optimizer state is another optimizer's: it has {_names(sorted(theirs - ours))} where this run's "
            f"optimizer has {_names(sorted(ours - theirs))}; resume with the optimizer_type it was trained with, or "
            f"use another model_dir")


def _shape(value: Any) -> str:
    return "x".join(str(n) for n in value.shape) or "scalar"


def describe_mismatch(saved: Any, model: Mapping[str, Any], error: Exception) -> str:
    """Why a checkpoint's ``model`` entry (``saved``) does not load into a module whose state_dict
    is ``model``, on one line: the keys missing from the checkpoint, those not in the model, and
    those of another shape (checkpoint -> model), each with the first few names; when the
    weights fit, ``error`` (the optimizer's or scheduler's complaint), cut at a word."""
    if not isinstance(saved, Mapping):
        return f"its 'model' entry is a {type(saved).__name__}, not a state_dict"
    missing = [key for key in model if key not in saved]
    unexpected = [key for key in saved if key not in model]
    shapes = [f"{key} {_shape(saved[key])} -> {_shape(model[key])}" for key in model
              if key in saved and hasattr(saved[key], "shape") and hasattr(model[key], "shape")
              and tuple(saved[key].shape) != tuple(model[key].shape)]
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing from the checkpoint ({_names(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} not in the model ({_names(unexpected)})")
    if shapes:
        parts.append(f"{len(shapes)} of another shape, checkpoint -> model ({_names(shapes)})")
    if parts:
        return "; ".join(parts)
    return f"the weights fit, the rest does not: {_shorten(str(error) or type(error).__name__)}"


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
