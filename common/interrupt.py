"""Ctrl-C (SIGINT) and a scheduler's stop (SIGTERM): a training run stops between two steps.

Slurm, Kubernetes and the like send SIGTERM and, a grace period later, SIGKILL. Python's
default for SIGTERM ends the process on the spot (no cleanup, no message), and a Ctrl-C
raises KeyboardInterrupt wherever the run happens to be, in the middle of an optimizer
step included. So both runners:

    around the whole run   (``raise_on_signals``, in common.cli.guarded) both signals raise
                           ``Interrupted``; guarded prints one line and exits 128 + the
                           signal's number: 130 for SIGINT, 143 for SIGTERM, as a shell does
    in the train loop      (``stop_between_steps``) the first signal only asks to stop: the
                           loop finishes the step it is in, writes a checkpoint of that step
                           (atomically, like every checkpoint) and raises ``Interrupted`` with
                           the step reached and the checkpoint the same command resumes
                           from. A second signal raises at once: the newest complete
                           checkpoint stays the one to resume from.

Saving at the stop is what PyTorch Lightning's OnExceptionCheckpoint and Slurm requeueing
set-ups do; here it is always on, since a stop between steps is a consistent state to save.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Iterator


SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; the message says where and how to resume."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the status a shell reports for a process the signal ended

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def _raise(signum, frame):
    raise Interrupted(signum)


@contextlib.contextmanager
def _handlers(handler) -> Iterator[bool]:
    """SIGINT and SIGTERM go to ``handler`` inside the block; yields False where Python allows
    no handlers (a thread other than the main one), and then changes nothing."""
    try:
        previous = {sig: signal.signal(sig, handler) for sig in SIGNALS}
    except ValueError:  # not the main thread
        yield False
        return
    try:
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def raise_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise ``Interrupted`` inside the block."""
    with _handlers(_raise):
        yield


class StopRequest:
    """Set by the first SIGINT or SIGTERM inside ``stop_between_steps``."""

    def __init__(self):
        self.signum: int | None = None
        self._pid = os.getpid()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def _record(self, signum, frame):
        if os.getpid() != self._pid:
            # a forked DataLoader worker inherits this handler and gets a terminal's Ctrl-C too:
            # it goes on serving batches until the main process, stopping, shuts it down
            return
        self.signum = signum
        for sig in SIGNALS:  # a second signal stops at once
            signal.signal(sig, _raise)
        _warn(f"{signal.Signals(signum).name}: stopping after the current step (send it again to stop at once)")


def _warn(text: str) -> None:
    """A warning line, in the log's format, written from a signal handler: straight to file
    descriptor 2, since the handler may run while the main thread is inside a write to
    sys.stderr, and a second write into the same buffered stream raises "reentrant call"."""
    line = f"{time.strftime('%H:%M:%S')} WARNING {text}\n"
    try:
        os.write(2, line.encode("utf-8", "replace"))
    except OSError:  # stderr closed: the stop goes ahead, unannounced
        pass


@contextlib.contextmanager
def stop_between_steps() -> Iterator[StopRequest]:
    """Inside the block the first SIGINT / SIGTERM sets ``request.requested``; the loop checks it
    between steps."""
    request = StopRequest()
    with _handlers(request._record):
        yield request
