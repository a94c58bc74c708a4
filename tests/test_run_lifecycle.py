"""A real run of pytorch/mnist and tf/mnist stopped by Ctrl-C or SIGTERM, a second run into
its model_dir, and a run killed with -9: as a user meets them, through run.py in a process
of its own.

The signal goes from Python (``send_signal``): a background job of a non-interactive shell
ignores SIGINT. Each run trains far more steps than it gets time for, and gets its signal
once its log shows a training step. Both frameworks, each on the CPU and the emulator, each
with both signals between them; the lock and the resume are checked on the CPU.
The framework-free parts (the lock file, the stop line) are in tests/common/test_lifecycle.py.
A framework that is not installed skips its cases (tox's pytorch and tf envs do not collect
this file; the all env runs every case).
"""

import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from common.data import write_fake_mnist
from common.folder import load_run_module

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORK_MODULE = {"pytorch": "torch", "tf": "tensorflow"}
CHECKPOINT = {"pytorch": r"checkpoint_{step}\.mdl", "tf": r"model\.ckpt-{step}"}
MANY_STEPS = 1_000_000


def needs(framework):
    if importlib.util.find_spec(FRAMEWORK_MODULE[framework]) is None:
        pytest.skip(f"{FRAMEWORK_MODULE[framework]} is not installed in this environment")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=320, n_test=64, seed=0)
    return folder


def command(framework, model_dir, data_dir, *extra):
    """The tiny config, with steps enough to be stopped and no checkpoint before the stop (each
    one an fsync) unless ``extra`` asks for one."""
    folder = ROOT / framework / "mnist"
    return [sys.executable, str(folder / "run.py"), "--params", str(folder / "configs" / "params_tiny.yaml"),
            "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}",
            "train_input.dataset=mnist", "eval_input.dataset=mnist", f"runconfig.max_steps={MANY_STEPS}",
            f"runconfig.checkpoint_steps={MANY_STEPS}", "runconfig.log_steps=10", *extra]


class Run:
    """run.py in a process of its own; its log lines are read as they come (a full pipe would stall it)."""

    def __init__(self, argv):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                        env=env, cwd=ROOT)
        self.lines: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.process.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, fragment: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                pytest.fail(f"the run ended before logging {fragment!r}:\n" + "\n".join(self.lines))
            self.lines.append(line)
            if fragment in line:
                return line

    def stop(self, signum, timeout: float = 120) -> int:
        self.process.send_signal(signum)
        return self.finish(timeout)

    def finish(self, timeout: float = 120) -> int:
        status = self.process.wait(timeout)
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return status

    def kill(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def runs():
    started = []

    def start(argv):
        started.append(Run(argv))
        return started[-1]

    yield start
    for run in started:
        run.kill()


def check_stopped(run: Run, status: int, framework: str, signum) -> int:
    """The stop: the shell's status, no traceback, and one last line naming the checkpoint saved
    at the step reached; returns that step."""
    name = signal.Signals(signum).name
    assert status == 128 + signum, "\n".join(run.lines)
    assert not any("Traceback" in line for line in run.lines), "\n".join(run.lines)
    pattern = (rf"interrupted by {name} at step (\d+) of {MANY_STEPS}; saved (\S*{CHECKPOINT[framework]}): "
               r"the same command resumes from there")
    match = re.fullmatch(pattern.replace("{step}", r"\1"), run.lines[-1])
    assert match, run.lines[-1]
    assert not list(Path(match.group(2)).parent.glob(".*.tmp")), "a partial checkpoint was left behind"
    return int(match.group(1))


def main(framework, argv):
    """run.py's main in this process (quicker than a process of its own); its exit status."""
    try:
        load_run_module(str(ROOT / framework / "mnist")).main(argv[2:])
    except SystemExit as e:
        return e.code
    return 0


@pytest.mark.parametrize("framework, signum", [("pytorch", signal.SIGINT), ("tf", signal.SIGTERM)])
def test_on_the_cpu_a_second_run_is_refused_a_signal_stops_and_the_same_command_resumes(
        tmp_path, data_dir, runs, capsys, framework, signum):
    needs(framework)
    model_dir = tmp_path / "model"
    argv = command(framework, model_dir, data_dir)
    first = runs(argv)
    first.wait_for("| Train Device=cpu")

    # the same command again while the first trains (for one step, should it not be refused)
    assert main(framework, [*argv, "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {model_dir} is in use by another run: pid {first.process.pid} on host "), err
    assert not any("| Train" in line or "restored" in line or "starting from" in line for line in err)

    step = check_stopped(first, first.stop(signum), framework, signum)
    assert not (model_dir / ".run.lock").exists()

    # the same command resumes at the step the signal stopped (here for two steps only)
    assert main(framework, [*argv, "--steps", "2"]) == 0
    err = capsys.readouterr().err
    resumed = (CHECKPOINT[framework].format(step=step) + re.escape(f" (step {step})") if framework == "pytorch"
               else f"from step {step} to {step + 2}")
    assert re.search(resumed, err), err
    assert f"Step={step + 2} " in err


@pytest.mark.parametrize("framework, signum", [("pytorch", signal.SIGTERM), ("tf", signal.SIGINT)])
def test_on_the_emulator_a_signal_stops_between_steps(tmp_path, data_dir, runs, framework, signum):
    needs(framework)
    run = runs(command(framework, tmp_path / "model", data_dir, "--device", "emulator"))
    run.wait_for("| Train Device=emulator")
    check_stopped(run, run.stop(signum), framework, signum)


def test_a_run_killed_with_9_leaves_a_lock_the_next_run_takes_over(tmp_path, data_dir, runs, capsys):
    needs("pytorch")
    model_dir = tmp_path / "model"
    argv = command("pytorch", model_dir, data_dir, "runconfig.checkpoint_steps=20")
    killed = runs(argv)
    killed.wait_for("saved ")
    killed.kill()
    assert (model_dir / ".run.lock").exists()

    assert main("pytorch", [*argv, "--steps", "2"]) == 0
    err = capsys.readouterr().err
    assert f"taking over the lock of pid {killed.process.pid} on host" in err
    assert "starting from" in err  # from the newest checkpoint, not from step 0
    assert not (model_dir / ".run.lock").exists()
