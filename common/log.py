"""The log lines both runners print, so a CPU run and an emulator run read alike.

    | Train Device=cpu Step=50 Loss=0.12345 Rate=12345.67 samples/sec (5%, 0:01:02 left)
    | Eval Device=cpu Step=100 accuracy=0.97500 loss=0.08123
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("zoo")


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class TrainMeter:
    """Samples/s between log lines, and the progress towards the last step."""

    def __init__(self, device: str, start_step: int, last_step: int):
        self.device, self.start_step, self.last_step = device, start_step, last_step
        self._t0 = self._t = time.perf_counter()
        self._samples = 0

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


def eval_line(device: str, step: int, metrics: dict[str, float]) -> str:
    values = " ".join(f"{k}={v:.5f}" for k, v in sorted(metrics.items()))
    return f"| Eval Device={device} Step={step} {values}"
