"""Checkpoints in TensorFlow's own format: ``model_dir/model.ckpt-N`` (.index + .data-*), and
the ``checkpoint`` state file that names the latest ones.

Why a kill never leaves a corrupt latest checkpoint. ``Saver.save`` writes the tensor
files of step N (TensorFlow merges them into ``model.ckpt-N.*``); only then do we fsync
those files and replace the state file atomically (``common.io``: temporary file, fsync,
rename). A kill before the rename leaves the state file naming step N-k, whose files are
complete; a kill after it finds step N complete. Old checkpoints beyond
``keep_checkpoint_max`` are deleted only after the state file stopped naming them. (TF's
own ``write_state=True`` path also renames a temporary state file, but without fsync, and
a restarted ``Saver`` forgets the checkpoints of earlier runs, so ``keep_checkpoint_max``
would not hold across restarts; the list here comes from the state file.)
"""

from __future__ import annotations

import glob
import os
import re

import tensorflow as tf
from google.protobuf import text_format

from common.errors import UserError
from common.io import atomic_write_text

PREFIX = "model.ckpt"
STATE_FILE = "checkpoint"


def checkpoint_step(path: str) -> int | None:
    """N of ``.../model.ckpt-N`` (None for another name)."""
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else None


def list_checkpoints(model_dir: str) -> list[str]:
    """The checkpoints the state file of ``model_dir`` names, oldest first, as absolute prefixes.

    An unreadable state file is an error (it is written atomically, so it is damaged only by
    hand or by the disk); entries whose files are gone are skipped.
    """
    state_path = os.path.join(model_dir, STATE_FILE)
    if not os.path.isfile(state_path):
        return []
    try:
        state = tf.compat.v1.train.get_checkpoint_state(model_dir)
    except (tf.errors.OpError, text_format.ParseError) as e:
        raise UserError(f"{state_path}: unreadable checkpoint state file ({type(e).__name__}); "
                        f"delete it to start afresh, or pass --checkpoint_path") from None
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    if state.model_checkpoint_path and state.model_checkpoint_path not in paths:
        paths.append(state.model_checkpoint_path)
    paths = [p if os.path.isabs(p) else os.path.join(model_dir, p) for p in paths]
    return [p for p in paths if os.path.isfile(p + ".index")]


def latest_checkpoint(model_dir: str) -> str | None:
    paths = list_checkpoints(model_dir)
    return paths[-1] if paths else None


def resolve_checkpoint(path: str) -> str:
    """A checkpoint prefix from ``--checkpoint_path``: a prefix, one of its files, or a model_dir."""
    if os.path.isdir(path):
        latest = latest_checkpoint(path)
        if latest is None:
            raise UserError(f"--checkpoint_path {path}: a folder with no checkpoint in it")
        return latest
    prefix = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", path)
    if not os.path.isfile(prefix + ".index"):
        raise UserError(f"--checkpoint_path {path}: no such checkpoint (expected {prefix}.index)")
    return prefix


def read_checkpoint(prefix: str) -> dict[str, list[int]]:
    """{name: shape} of every tensor in the checkpoint; a corrupt one is a UserError."""
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        return reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{prefix}: corrupt or unreadable checkpoint ({first})") from None


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _files_of(prefix: str) -> list[str]:
    return glob.glob(glob.escape(prefix) + ".*")


def save_checkpoint(saver, session, model_dir: str, step: int, keep_max: int) -> str:
    """Save ``model_dir/model.ckpt-<step>``, then name it in the state file, then drop old ones."""
    prefix = os.path.join(os.path.abspath(model_dir), PREFIX)
    with session.graph.as_default():  # a v1 Saver called outside its graph would build itself for eager mode
        path = saver.save(session, prefix, global_step=step, write_meta_graph=False, write_state=False)
    for name in _files_of(path):
        _fsync(name)
    kept = [p for p in list_checkpoints(model_dir) if p != path] + [path]
    dropped, kept = kept[:-keep_max], kept[-keep_max:]
    write_state(model_dir, kept)
    for old in dropped:
        for name in _files_of(old):
            os.remove(name)
    return path


def write_state(model_dir: str, paths: list[str]) -> None:
    """The ``checkpoint`` state file naming ``paths`` (the last is the latest), replaced atomically."""
    relative = [os.path.relpath(p, model_dir) for p in paths]
    state = tf.compat.v1.train.generate_checkpoint_state_proto(
        model_dir, relative[-1], all_model_checkpoint_paths=relative)
    atomic_write_text(os.path.join(model_dir, STATE_FILE), text_format.MessageToString(state))
