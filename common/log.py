"""The log lines both runners print, so a CPU run and an emulator run read alike.

    | Train Device=cpu Step=50 Loss=0.12345 Rate=12345.67 samples/sec (5%, 0:01:02 left)
    | Eval Device=cpu Step=100 accuracy=0.97500 loss=0.08123

and, while an eval or predict works through its batches, a progress line at each tenth of
them and at least every 30 seconds (``EvalProgress``; none in its first seconds, so a short
eval prints its final line alone):

    eval on cpu: 40 of 100 batches, 3.21 batches/sec (40%, 0:00:18 left)
    predict on emulator: 37 batches, 1.50 batches/sec          (the number of batches unknown)

and, when a signal stops training (common/interrupt.py), the one line that says where it
stopped and where the same command resumes:

    interrupted by SIGINT at step 37 of 1000; saved model_dir/mnist/checkpoint_37.mdl: the same command resumes from there
"""

from __future__ import annotations

import logging
import signal
import time

logger = logging.getLogger("zoo")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class TrainMeter:
    """Samples/s between log lines, the progress towards the last step, and the checkpoint a
    rerun of the same command starts from.

    ``start_checkpoint``: the checkpoint this run started from (None: from scratch);
    ``explicit_start``: it came from --checkpoint_path, which a rerun would load again.
    """

    def __init__(self, device: str, start_step: int, last_step: int, start_checkpoint: str | None = None,
                 explicit_start: bool = False):
        self.device, self.start_step, self.last_step = device, start_step, last_step
        self._t0 = self._t = time.perf_counter()
        self._samples = 0
        self.start_checkpoint, self.explicit_start = start_checkpoint, explicit_start
        self.checkpoint, self.checkpoint_step = start_checkpoint, start_step

    def saved(self, path: str, step: int) -> None:
        self.checkpoint, self.checkpoint_step = path, step

    def add(self, samples: int) -> None:
        self._samples += samples

    def rate(self) -> float:
        """Samples/s since the previous call (and resets the window)."""
        now = time.perf_counter()
        rate = self._samples / max(now - self._t, 1e-9)
        self._t, self._samples = now, 0
        return rate

    def line(self, step: int, loss: float, rate: float) -> str:
        done = (step - self.start_step) / max(self.last_step - self.start_step, 1)
        elapsed = time.perf_counter() - self._t0
        left = elapsed / done * (1 - done) if done > 0 else 0.0
        return (f"| Train Device={self.device} Step={step} Loss={loss:.5f} Rate={rate:.2f} samples/sec "
                f"({done:.0%}, {_clock(left)} left)")

    def interrupted(self, signum: int, step: int) -> str:
        """The line for a run stopped by ``signum`` with ``step`` steps done."""
        head = f"interrupted by {signal.Signals(signum).name} at step {step} of {self.last_step}"
        if self.checkpoint is None:
            return f"{head}, before the first checkpoint; the same command starts again from step 0"
        if self.checkpoint == self.start_checkpoint:
            return (f"{head}, before this run's first checkpoint; the same command starts again from "
                    f"{self.checkpoint} (step {self.checkpoint_step})")
        if self.checkpoint_step == step:
            where, resume = f"saved {self.checkpoint}", "the same command resumes from there"
        else:
            where = f"the newest checkpoint is {self.checkpoint} (step {self.checkpoint_step})"
            resume = "the same command resumes from it"
        if self.explicit_start:
            resume = (f"to resume from it, run the same command without --checkpoint_path (with it, the run "
                      f"starts from {self.start_checkpoint} again)")
        return f"{head}; {where}: {resume}"


# An eval's or predict's progress line is due at each tenth of its batches and PROGRESS_SECONDS
# after the previous one; none comes in its first QUIET_SECONDS (a short eval logs no progress)
# nor at its last batch (the final line follows at once).
PROGRESS_SECONDS = 30.0
QUIET_SECONDS = 5.0


def clock() -> float:
    """The progress lines' clock, in seconds (a test replaces it)."""
    return time.monotonic()


class EvalProgress:
    """The progress lines of an eval or predict loop over ``total`` batches (None: unknown, as
    for a dataset without a length); ``batch_done()`` after each batch logs when a line is due."""

    def __init__(self, what: str, device: str, total: int | None):
        self.what, self.device = what, device
        self.total = total if total is not None and total > 0 else None
        self.done = 0
        self._t0 = self._last = clock()
        self._tenths = 0  # tenths of the total that a line is already due for

    def batch_done(self) -> None:
        self.done += 1
        now = clock()
        due = now - self._last >= PROGRESS_SECONDS
        if self.total is not None:
            tenths = self.done * 10 // self.total
            due = due or tenths > self._tenths
            self._tenths = max(tenths, self._tenths)
            if self.done >= self.total:
                return
        if due and now - self._t0 >= QUIET_SECONDS:
            self._last = now
            logger.info(self.line(now))

    def line(self, now: float) -> str:
        elapsed = max(now - self._t0, 1e-9)
        rate = self.done / elapsed
        head = f"{self.what} on {self.device}: "
        if self.total is None:
            return f"{head}{self.done} batches, {rate:.2f} batches/sec"
        left = elapsed / self.done * (self.total - self.done)
        return (f"{head}{self.done} of {self.total} batches, {rate:.2f} batches/sec "
                f"({self.done / self.total:.0%}, {_clock(left)} left)")


def eval_line(device: str, step: int, metrics: dict[str, float]) -> str:
    values = " ".join(f"{k}={v:.5f}" for k, v in sorted(metrics.items()))
    return f"| Eval Device={device} Step={step} {values}"
