"""Atomic file writes: a kill or a full disk during a write never leaves a half-written file behind.

Write to a temporary file in the same folder, flush and fsync it, then ``os.replace`` it
over the target (atomic on POSIX within one file system). A write that fails (a full disk,
a quota) removes the temporary file and leaves the target as it was; the error names the
target, and ``not_written`` turns it into the one line the command-line tools print.
"""

from __future__ import annotations

import errno
import os
import tempfile
from contextlib import ExitStack, contextmanager
from typing import IO, Iterator, Mapping

from zoo_base.errors import UserError

# errors that say the disk (or the user's share of it) is full: reported in one line, not as a bug
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file that replaces ``path`` only if the block finishes."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; the result should have the usual permissions
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if isinstance(e, OSError) and e.filename is None:
            e.filename = path  # write() and fsync() name no file: the one not written
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path, "w") as f:
        f.write(text)


def atomic_write_texts(texts: Mapping[str | os.PathLike, str]) -> None:
    """Write several files all or none: each to its temporary file first, and the files take
    their names only once every one is on disk (a full disk midway leaves the old set whole)."""
    with ExitStack() as stack:
        files = [stack.enter_context(atomic_open(path, "w")) for path in texts]
        for f, (path, text) in zip(files, texts.items()):
            try:  # every byte on disk before the first rename (leaving the stack renames them)
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                e.filename = e.filename or os.fspath(path)  # this file's, not the one whose context it leaves first
                raise


def not_written(error: OSError) -> UserError | None:
    """A full disk or quota as one line naming the file not written; None for any other error."""
    if error.errno not in DISK_FULL:
        return None
    where = error.filename or "a file"
    return UserError(f"{where}: not written ({error.strerror}); nothing half-written is left, and a file of that "
                     f"name written before is kept as it was")
