"""Run <framework>/mnist/run.py's main and kill this process with SIGKILL at a chosen moment.

    python tests/reliability/kill_driver.py pytorch|tf CALL N run.py-arguments...

CALL is one of the file-system calls a checkpoint save makes (``fsync``: its bytes written
but not yet on disk; ``replace``: the temporary file about to take the checkpoint's or the
state file's name; ``remove``: an old checkpoint about to go), and N which of them (1: the
first of the run). N = 0 kills nothing and prints, at the end, how many of each call the
run made (the range to draw N from). Used by test_kill.py; ``kill -9`` from the test itself
covers the other moments (mid-step).
"""

from __future__ import annotations

import os
import signal
import sys
from collections import Counter
from pathlib import Path

CALLS = ("fsync", "replace", "remove")


def main() -> None:
    framework, call, n, argv = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    counts: Counter = Counter()
    for name in CALLS:
        original = getattr(os, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            if _name == call and counts[_name] == n:
                os.kill(os.getpid(), signal.SIGKILL)
            return _original(*args, **kwargs)

        setattr(os, name, counted)
    if framework == "pytorch":
        import torch  # noqa: F401  (before anything that may load TensorFlow)
    from common.folder import load_run_module

    try:
        load_run_module(str(Path(__file__).resolve().parents[2] / framework / "mnist")).main(argv)
    finally:
        print("calls: " + " ".join(f"{name}={counts[name]}" for name in CALLS), file=sys.stderr)


if __name__ == "__main__":
    main()
