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

The state file names the checkpoints relative to model_dir ("model.ckpt-N"), however
model_dir was given, so a model_dir read from another working directory, or moved, still
finds its own. (State files of earlier versions of this module named them
"../../model.ckpt-N" for a relative model_dir; those names are read as the file of that name
in model_dir.)

Why a damaged newest checkpoint costs a step back, not the run. A disk that fills, a copy
cut short or a bit flip can still damage files after the state file named them; each
checkpoint about to be loaded is read through first (every tensor, each with its checksum),
and a damaged one is passed over, with a warning naming its file, for the one before it.
When none is readable the run stops with an error naming them, rather than starting afresh
over them.
"""

from __future__ import annotations

import glob
import logging
import os
import re

import tensorflow as tf
from google.protobuf import text_format

from common.errors import UserError
from common.io import atomic_write_text

PREFIX = "model.ckpt"
STATE_FILE = "checkpoint"

logger = logging.getLogger("zoo")


def checkpoint_step(path: str) -> int | None:
    """N of ``.../model.ckpt-N`` (None for another name)."""
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else None


def list_checkpoints(model_dir: str) -> list[str]:
    """The checkpoints the state file of ``model_dir`` names, oldest first, as absolute prefixes.

    An unreadable state file is an error (it is written atomically, so it is damaged only by
    hand or by the disk); entries whose files are gone (the .index, or any .data shard) are
    skipped, so that the latest is the newest whose files are there.
    """
    return [path for path in _named_in_state(model_dir) if files_present(path)]


def files_present(prefix: str) -> bool:
    """Whether the checkpoint's .index and each of its N .data-K-of-N shards are there (whether
    they read through is checkpoint_problem's question)."""
    if not os.path.isfile(prefix + ".index"):
        return False
    shards = (re.search(r"\.data-\d{5}-of-(\d{5})$", name) for name in glob.glob(glob.escape(prefix) + ".data-*"))
    totals = {int(match.group(1)) for match in shards if match}
    return any(all(os.path.isfile(f"{prefix}.data-{k:05d}-of-{total:05d}") for k in range(total)) for total in totals)


def _named_in_state(model_dir: str) -> list[str]:
    """Every checkpoint the state file names, oldest first, as absolute prefixes, whether or
    not its files are there."""
    directory = os.path.abspath(model_dir)
    state_path = os.path.join(directory, STATE_FILE)
    if not os.path.isfile(state_path):
        return []
    tf_logger = tf.get_logger()
    level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)  # TF logs a parse error and returns None: here it is the error
    try:
        state = tf.compat.v1.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError):  # ValueError: the file names no model_checkpoint_path
        state = None
    finally:
        tf_logger.setLevel(level)
    if state is None:
        raise UserError(f"{state_path}: unreadable checkpoint state file; delete it to start afresh, or pass "
                        f"--checkpoint_path")
    # TF has joined the relative names to the (absolute) directory
    names = list(state.all_model_checkpoint_paths)
    if state.model_checkpoint_path not in names:
        names.append(state.model_checkpoint_path)
    paths: list[str] = []
    for name in names:
        path = os.path.normpath(name)
        if not os.path.isfile(path + ".index"):
            path = os.path.join(directory, os.path.basename(path))  # a "../../model.ckpt-N" of earlier versions
        if path not in paths:
            paths.append(path)
    return paths


def latest_checkpoint(model_dir: str) -> str | None:
    """The newest checkpoint the state file names whose files are there (unchecked: see newest_readable)."""
    paths = list_checkpoints(model_dir)
    return paths[-1] if paths else None


def newest_readable(model_dir: str) -> str | None:
    """The newest checkpoint of ``model_dir`` that reads through; a warning for each newer one
    the state file names that does not, and a UserError naming them when none does. None
    when the state file names none."""
    bad = []
    for path in reversed(_named_in_state(model_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            for earlier in bad:
                logger.warning("%s; falling back to %s", earlier, path)
            return path
        bad.append(problem)
    if bad:
        raise _none_readable(model_dir, bad)
    return None


def readable_checkpoints(model_dir: str) -> list[str]:
    """Every checkpoint of ``model_dir`` that reads through, oldest first; a warning for each
    one that does not, and a UserError naming them when none does."""
    paths, bad = [], []
    for path in list_checkpoints(model_dir):
        problem = checkpoint_problem(path)
        if problem is None:
            paths.append(path)
        else:
            bad.append(problem)
    if bad and not paths:
        raise _none_readable(model_dir, bad)
    for problem in bad:
        logger.warning("%s; skipped", problem)
    return paths


def _none_readable(model_dir: str, problems: list[str]) -> UserError:
    return UserError(f"{model_dir}: no readable checkpoint: {'; '.join(problems)}. To start afresh, move the "
                     f"model.ckpt-* files and the state file '{STATE_FILE}' out of it; or pass --checkpoint_path")


def resolve_checkpoint(path: str) -> str:
    """A readable checkpoint prefix from ``--checkpoint_path``: a prefix, one of its files, or a
    model_dir (its newest readable checkpoint)."""
    if os.path.isdir(path):
        latest = newest_readable(path)
        if latest is None:
            raise UserError(f"--checkpoint_path {path}: a folder with no checkpoint in it")
        return latest
    prefix = re.sub(r"\.(index|meta|data-\d+-of-\d+)$", "", path)
    if not os.path.isfile(prefix + ".index"):
        raise UserError(f"--checkpoint_path {path}: no such checkpoint (expected {prefix}.index)")
    problem = checkpoint_problem(prefix)
    if problem is not None:
        raise UserError(f"--checkpoint_path {path}: {problem}")
    return prefix


def checkpoint_problem(prefix: str) -> str | None:
    """None when every tensor of the checkpoint reads back with its checksum, else what is
    wrong, naming the file at fault (a truncated or missing .data file, a damaged or missing
    .index).

    This reads the whole checkpoint once more than the restore does (measured on 2 busy
    cores: 1.4 s per GB, the restore itself 1.3-2.8 s): the price of falling back before
    anything is loaded, rather than failing halfway through a restore.
    """
    index = prefix + ".index"
    if not os.path.isfile(index):
        return f"{index}: missing"
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        dtypes = reader.get_variable_to_dtype_map()
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        return f"{index}: corrupt or unreadable checkpoint index ({op_error_line(e)})"
    # RestoreV2 checks each tensor's checksum (the reader's get_tensor cannot return every
    # dtype: the input position is a variant). One tensor at a time, in a graph of its own,
    # run for its effect only: nothing is kept, and nothing depends on the caller's graph.
    with tf.Graph().as_default() as graph:
        reads = {name: tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[name], shape_and_slices=[""],
                                            dtypes=[dtype])[0].op for name, dtype in dtypes.items()}
    with tf.compat.v1.Session(graph=graph) as session:
        for name in sorted(reads):
            try:
                session.run(reads[name])
            except tf.errors.OpError as e:
                data = sorted(glob.glob(glob.escape(prefix) + ".data-*"))
                where = data[0] if len(data) == 1 else prefix + ".data-*"
                return f"{where}: corrupt or unreadable checkpoint data (tensor '{name}': {op_error_line(e)})"
    return None


def op_error_line(error: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong, without what TF wraps around
    it: "Graph execution error:", the node and where it was defined, the op and function names."""
    text = getattr(error, "message", None) or str(error)
    text = text.split("\n\nOriginal stack trace")[0]
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    text = re.sub(r"\s*\[Op:\w+\]", "", text)
    wrapping = re.compile(r"Graph execution error:|Detected at node |File \"|Node: |\[\[")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not wrapping.match(line.strip())]
    return lines[0] if lines else type(error).__name__


def read_checkpoint(prefix: str) -> dict[str, list[int]]:
    """{name: shape} of every tensor in the checkpoint; a corrupt one is a UserError."""
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        return reader.get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
        raise UserError(f"{prefix}: corrupt or unreadable checkpoint ({op_error_line(e)})") from None


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
    path = f"{prefix}-{step}"
    previous = list_checkpoints(model_dir)
    try:
        with session.graph.as_default():  # a v1 Saver called outside its graph would build itself for eager mode
            path = saver.save(session, prefix, global_step=step, write_meta_graph=False, write_state=False)
        for name in _files_of(path):
            _fsync(name)
        kept = [p for p in previous if p != path] + [path]
        dropped, kept = kept[:-keep_max], kept[-keep_max:]
        write_state(model_dir, kept)
    except (tf.errors.OpError, OSError) as e:  # a full disk, a quota, a read-only file system
        for name in _files_of(path) if path not in previous else ():  # the state file never named them
            os.remove(name)
        reason = op_error_line(e) if isinstance(e, tf.errors.OpError) else (e.strerror or str(e))
        newest = previous[-1] if previous else "none (none was written yet)"
        raise UserError(f"{path}: not saved ({reason}); the newest complete checkpoint is kept: {newest}") from None
    for old in dropped:
        for name in _files_of(old):
            os.remove(name)
    return path


def write_state(model_dir: str, paths: list[str]) -> None:
    """The ``checkpoint`` state file naming ``paths`` (the last is the latest) relative to
    ``model_dir``, replaced atomically."""
    directory = os.path.abspath(model_dir)
    names = [os.path.relpath(os.path.abspath(p), directory) for p in paths]
    # given a relative save_dir, TF would make the relative names relative to it a second time
    # ("../../model.ckpt-N"); given an absolute one it keeps them as they are
    state = tf.compat.v1.train.generate_checkpoint_state_proto(
        directory, names[-1], all_model_checkpoint_paths=names)
    atomic_write_text(os.path.join(model_dir, STATE_FILE), text_format.MessageToString(state))
