"""Train <framework>/mnist in this process and print its memory as the steps go.

    python tests/reliability/long_run_driver.py pytorch|tf run.py-arguments...

Every log line of a step (``Step=N``, at runconfig.log_steps) prints ``step=N rss_kib=...
peak_kib=... loss=... time=...`` to stdout: the resident set now and its peak so far
(/proc/self/status VmRSS and VmHWM), the loss logged and the monotonic clock. Used by
test_long_run.py.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from pathlib import Path


def memory_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process, in KiB."""
    status = Path("/proc/self/status").read_text()
    return tuple(int(re.search(rf"^{key}:\s+(\d+) kB", status, flags=re.M)[1]) for key in ("VmRSS", "VmHWM"))


class StepMemory(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        found = re.search(r"Step=(\d+) Loss=(\S+)", record.getMessage())
        if found:
            rss, peak = memory_kib()
            print(f"step={found[1]} rss_kib={rss} peak_kib={peak} loss={found[2]} time={time.monotonic():.3f}",
                  flush=True)


def main() -> None:
    framework, argv = sys.argv[1], sys.argv[2:]
    if framework == "pytorch":
        import torch  # noqa: F401  (before anything that may load TensorFlow)
    from common.folder import load_run_module

    logging.getLogger("zoo").addHandler(StepMemory())  # the runner's set-up replaces the root's handlers only
    load_run_module(str(Path(__file__).resolve().parents[2] / framework / "mnist")).main(argv)


if __name__ == "__main__":
    main()
