"""One run at a time writes into a model_dir: ``model_dir/.run.lock``.

Two trainings into one model_dir would overwrite each other's checkpoints, and one's
rotation (keep_checkpoint_max) deletes a checkpoint the other is about to read. So every
run that writes into model_dir holds this lock while it runs: train, train_and_eval, eval,
eval_all and predict (the last three write ``params_<mode>.yaml``, eval summaries or
predictions, and read checkpoints a training would rotate away). ``--validate_only`` writes
nothing and ``--compile_only`` writes only ``model_dir/compile``; they take no lock.

The lock is an ``fcntl.flock`` on the file, which the kernel drops when the process ends,
however it ends; the file holds the holder's pid, host, mode and start time, for the
message that refuses a second run:

    error: model_dir/pytorch_mnist is in use by another run: pid 4242 on host node7 (train,
    since 2024-05-01 12:03:04); wait for it or stop it, or pass another --model_dir

A run releases the lock and deletes the file at exit (also on an error or a signal). A
file left behind by a run that was killed (``kill -9``, a lost node) is not locked any
more: the next run takes it over with a warning naming the dead run's pid. Where the file
system has no locks (some network mounts), the pid decides: a live pid on this host, or any
pid on another host, refuses; a dead pid on this host is taken over.

A run takes the lock at the moment it first writes into model_dir, after everything else
has loaded (a refused run leaves model_dir as it was); ``check_free`` refuses earlier,
before the run reads any checkpoint, without writing anything.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import time

from common.errors import UserError

try:
    import fcntl
except ImportError:  # not POSIX: the pid in the file decides
    fcntl = None

logger = logging.getLogger("zoo")

LOCK_NAME = ".run.lock"
RETRIES = 4  # tries to lock, 50 ms apart, before a held lock refuses the run

# every lock this process holds, so that common.cli.guarded releases them at exit whichever
# way the run ends
_held: list["RunLock"] = []


def lock_path(model_dir: str) -> str:
    return os.path.join(model_dir, LOCK_NAME)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _read_record(path: str) -> dict:
    """The holder's record; {} for an empty or unreadable file (a holder between open and write)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _holder_record(path: str) -> dict:
    """The record of a holder that has the lock: it writes its record just after locking, so
    an empty file is worth a second look."""
    for _ in range(10):
        record = _read_record(path)
        if record:
            return record
        time.sleep(0.02)
    return record


def _holder(record: dict) -> str:
    if not record:
        return "a process that has not written its pid yet"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("started", 0)))
    pid, host, mode = record.get("pid", "?"), record.get("host", "?"), record.get("mode", "?")
    return f"pid {pid} on host {host} ({mode}, since {started})"


def _refusal(model_dir: str, record: dict) -> UserError:
    return UserError(f"{model_dir} is in use by another run: {_holder(record)}; wait for it or stop it, "
                     f"or pass another --model_dir")


def _alive_by_pid(record: dict) -> bool:
    """Without file locks: does the record's run still run? (Unknown on another host: assume so.)"""
    if not record or "pid" not in record:
        return False
    if record.get("host") != socket.gethostname():
        return True
    return record["pid"] != os.getpid() and _pid_alive(int(record["pid"]))


def check_free(model_dir: str) -> None:
    """Refuse now, writing nothing, when another run holds model_dir's lock."""
    path = lock_path(model_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: free (or no model_dir yet)
    try:
        if fcntl is not None:
            try:  # shared: two checks at once do not refuse each other
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _refusal(model_dir, _holder_record(path)) from None
            except OSError:  # no locks on this file system
                pass
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
        record = _read_record(path)
        if _alive_by_pid(record):
            raise _refusal(model_dir, record)
    finally:
        os.close(fd)


class RunLock:
    """``model_dir``'s lock for one run: ``acquire()`` once it writes there, ``release()`` at exit."""

    def __init__(self, model_dir: str, mode: str):
        self.model_dir, self.mode = model_dir, mode
        self.path = lock_path(model_dir)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (creating model_dir), or raise a UserError naming the run that holds it."""
        if self.held:
            return
        if os.path.exists(self.model_dir) and not os.path.isdir(self.model_dir):
            raise UserError(f"model_dir {self.model_dir} is a file, not a folder")
        try:
            os.makedirs(self.model_dir, exist_ok=True)
        except OSError as e:
            raise UserError(f"model_dir {self.model_dir}: cannot create it ({e.strerror or e})") from None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                locked = self._lock(fd)
                # the holder may have released and deleted the file between our open and our
                # lock: then we locked a file no one else will see; start again on the new one
                if not self._same_file(fd):
                    os.close(fd)
                    continue
            except BaseException:
                os.close(fd)
                raise
            break
        previous = _read_record(self.path)
        if previous and (locked or not _alive_by_pid(previous)):
            gone = "is no longer running" if not _alive_by_pid(previous) else "holds it no longer"
            logger.warning("%s: taking over the lock of %s, which %s (killed without cleaning up?)", self.path,
                           _holder(previous), gone)
        elif previous:
            os.close(fd)
            raise _refusal(self.model_dir, previous)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "mode": self.mode, "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        _held.append(self)

    def _lock(self, fd: int) -> bool:
        """flock the file: True when locked, False when the file system has no locks."""
        if fcntl is None:
            return False
        try:
            for attempt in range(RETRIES):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    # another process's check_free holds it for an instant; a run holds it for good
                    if attempt == RETRIES - 1:
                        raise
                    time.sleep(0.05)
        except BlockingIOError:
            raise _refusal(self.model_dir, _holder_record(self.path)) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise
            logger.debug("%s: the file system has no locks (%s); the pid in the file decides", self.path, e)
            return False
        return True

    def _same_file(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def release(self) -> None:
        """Delete the file and drop the lock (in that order: a waiting run then finds no file or a new one)."""
        if not self.held:
            return
        fd, self._fd = self._fd, None
        if self in _held:
            _held.remove(self)
        try:
            if self._same_file(fd):
                os.remove(self.path)
        except OSError:
            pass  # model_dir removed under the run: nothing left to clean up
        os.close(fd)

    def __enter__(self) -> "RunLock":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def release_all() -> None:
    """Release every lock this process holds (common.cli.guarded, at the end of a run)."""
    for lock in list(_held):
        lock.release()
