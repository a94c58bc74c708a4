"""Long runs on the emulator: 10,000 steps of pytorch/mnist's tiny MLP hold flat memory and
end on the loss the CPU run of the same steps ends on.

Each run is a process of its own (tests/reliability/long_run_driver.py), which prints its
resident set (VmRSS) and peak (VmHWM) at every logged step. Memory: the peak at step 10,000
within 5 % of the peak at step 1,000, and the resident set's slope between them under
1 KiB per step (a leak of one small array per step would show). Loss: the loss logged at
the last step within 1e-3 relative of the CPU run's (the emulator's stated 1e-4 is for 50
steps; over 10,000 the float32 rounding differences of the two accumulate, measured
below). The data: MNIST-shaped images with random labels, so that the loss stays away
from 0 (a separable set drives it to 1e-5 and makes a relative comparison meaningless).

The quick run (tox) measures 300 and 1,500 steps, memory only; RELIABILITY_FULL=1 the
10,000 steps and the CPU run. Either prints its figures, and the table records them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.conftest import FULL, ROOT, mnist_argv, needs

DRIVER = Path(__file__).resolve().parent / "long_run_driver.py"
EXAMPLES = 2048
PEAK_GROWTH = 0.05  # the peak at the last step over the peak at the first measured one
SLOPE_KIB = 1.0  # resident set growth per step, KiB
LOSS_RTOL = 1e-3


@pytest.fixture(scope="module")
def random_labels(tmp_path_factory) -> str:
    """MNIST-shaped files whose training labels are drawn at random: nothing to learn but the examples."""
    from common.data import write_fake_mnist
    from common.data.mnist.fake import MNIST_FILES
    from common.data.mnist.idx import write_idx

    folder = tmp_path_factory.mktemp("random_labels")
    write_fake_mnist(folder, n_train=EXAMPLES, n_test=64, seed=0)
    labels = np.random.default_rng(1).integers(0, 10, EXAMPLES).astype(np.uint8)
    write_idx(os.path.join(folder, "MNIST", "raw", MNIST_FILES["train"][1]), labels)
    return str(folder)


def train(device: str, steps: int, log_steps: int, data_dir: str, model_dir: Path) -> dict[int, dict[str, float]]:
    """Train ``steps`` steps in a process of its own: {step: {rss_kib, peak_kib, loss, time}} at each logged step."""
    argv = mnist_argv("pytorch", model_dir, data_dir, f"runconfig.max_steps={steps}", "runconfig.checkpoint_steps=0",
                      f"runconfig.log_steps={log_steps}", "--device", device)
    # one thread: a tiny model gains nothing from more, and the machine's other work slows them
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(DRIVER), "pytorch", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = {}
    for line in done.stdout.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "step" in fields:
            records[int(fields.pop("step"))] = {k: float(v) for k, v in fields.items()}
    return records


def memory_figures(records: dict, first: int, last: int) -> tuple[float, float]:
    """(peak growth from ``first`` to ``last`` as a fraction, the resident set's slope in KiB per step between them)."""
    growth = records[last]["peak_kib"] / records[first]["peak_kib"] - 1
    steps = [s for s in records if first <= s <= last]
    slope = float(np.polyfit(steps, [records[s]["rss_kib"] for s in steps], 1)[0])
    return growth, slope


@pytest.mark.slow
def test_emulator_memory_stays_flat_and_the_loss_matches_the_cpu(random_labels, tmp_path, ledger):
    needs("torch")
    first, last = (1000, 10000) if FULL else (300, 1500)
    log_steps = 500 if FULL else 100  # first and last are logged steps
    emulator = train("emulator", last, log_steps, random_labels, tmp_path / "emulator")
    growth, slope = memory_figures(emulator, first, last)
    seconds = emulator[last]["time"] - emulator[first]["time"]
    figures = (f"peak RSS {emulator[first]['peak_kib'] / 1024:.0f} MiB at step {first:,}, "
               f"{emulator[last]['peak_kib'] / 1024:.0f} MiB at {last:,} ({growth:+.2%}); RSS slope "
               f"{slope:+.3f} KiB/step; {(last - first) / seconds:.0f} steps/s")
    flat = growth < PEAK_GROWTH and slope < SLOPE_KIB
    same = True
    if FULL:
        cpu = train("cpu", last, log_steps, random_labels, tmp_path / "cpu")
        loss_e, loss_c = emulator[last]["loss"], cpu[last]["loss"]
        relative = abs(loss_e - loss_c) / abs(loss_c)
        same = relative <= LOSS_RTOL
        figures += f"; loss at {last:,}: emulator {loss_e:.5f}, CPU {loss_c:.5f} ({relative:.1e} relative)"
    print(f"\nlong run: {figures}")
    ledger.record(f"{last:,} emulator steps (pytorch mnist tiny), memory flat{' and the CPU loss' if FULL else ''}", 1,
                  not (flat and same), figures)
    assert flat, figures
    assert same, figures
