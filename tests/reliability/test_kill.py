"""Kill -9 at random moments of a training run: the newest checkpoint always loads, and the
same command resumes to the same final weights as a run never killed, bit for bit (CPU, the
mnist MLP; both frameworks).

Each trial trains pytorch/mnist or tf/mnist's tiny config for 6 steps with a checkpoint at
every step (so that many kills land in a save), in a process of its own, killed either
inside a checkpoint save (tests/reliability/kill_driver.py: at the N-th fsync, rename or
removal of the run, N drawn from what an uninterrupted run makes) or by ``kill -9`` from
here at a random time after its first training step. Then the newest checkpoint in
model_dir must load, and the same command, rerun in a process of its own, must end with
every weight and optimizer slot equal to the uninterrupted run's. 1 trial per framework in tox, 100 with
RELIABILITY_FULL=1 (RELIABILITY_TRIALS=n: n).
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.conftest import ROOT, mnist_argv, needs, trials

DRIVER = Path(__file__).resolve().parent / "kill_driver.py"
STEPS = 6
MOMENTS = ("fsync", "replace", "remove", "time")


def command(framework: str, model_dir, data_dir) -> list[str]:
    return mnist_argv(framework, model_dir, data_dir, f"runconfig.max_steps={STEPS}", "runconfig.checkpoint_steps=1",
                      "runconfig.keep_checkpoint_max=2", "runconfig.log_steps=1")


def start(framework: str, call: str, n: int, argv: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    with open(log, "w") as err:
        return subprocess.Popen([sys.executable, str(DRIVER), framework, call, str(n), *argv], cwd=ROOT, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)


def final_state(framework: str, model_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of the step-STEPS checkpoint (weights, optimizer slots, step), as numpy."""
    if framework == "pytorch":
        from common.pytorch.checkpoint import load_checkpoint

        state = load_checkpoint(str(model_dir / f"checkpoint_{STEPS}.mdl"))
        flat = {f"model/{k}": v.numpy() for k, v in state["model"].items()}
        for i, slots in state["optimizer"]["state"].items():
            flat.update({f"optimizer/{i}/{k}": np.asarray(v) for k, v in slots.items()})
        flat["global_step"] = np.asarray(state["global_step"])
        return flat
    from common.weights_io import tf_variables

    return tf_variables(str(model_dir / f"model.ckpt-{STEPS}"))


def newest_loads(framework: str, model_dir: Path) -> bool:
    """Whether the newest checkpoint in model_dir (the one a resume starts from) loads whole."""
    if framework == "pytorch":
        from common.pytorch.checkpoint import UnreadableCheckpoint, latest_checkpoint, load_checkpoint

        newest = latest_checkpoint(str(model_dir))
        try:
            return newest is None or load_checkpoint(newest) is not None
        except UnreadableCheckpoint:
            return False
    import tensorflow as tf

    from common.tf.estimator import checkpoints

    # the state file's own newest, not latest_checkpoint's: that one skips a named checkpoint whose
    # files are incomplete, which is what a save that names a checkpoint too early leaves behind
    state = tf.train.get_checkpoint_state(str(model_dir))
    newest = state.model_checkpoint_path if state is not None else None
    return newest is None or checkpoints.checkpoint_problem(newest) is None


@pytest.fixture(scope="module")
def reference(tmp_path_factory, mnist_dir):
    """Per framework: the uninterrupted run's final state and the calls it made."""
    done = {}

    def get(framework: str):
        if framework not in done:
            model_dir = tmp_path_factory.mktemp(framework) / "model"
            log = model_dir.parent / "log"
            process = start(framework, "none", 0, command(framework, model_dir, mnist_dir), log)
            assert process.wait(600) == 0, log.read_text()
            calls = dict(re.findall(r"(\w+)=(\d+)", log.read_text().splitlines()[-1]))
            done[framework] = final_state(framework, model_dir), {k: int(v) for k, v in calls.items()}
        return done[framework]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "tf"])
def test_kill_9_leaves_a_loadable_newest_checkpoint_and_resume_ends_the_same(
        framework, reference, mnist_dir, tmp_path, ledger):
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    expected, calls = reference(framework)
    rng = random.Random(f"kill {framework}")
    n = trials(1, 100, slow=True)
    lost, moments = 0, []
    try:
        for trial in range(n):
            model_dir = tmp_path / f"trial{trial}" / "model"
            argv = command(framework, model_dir, mnist_dir)
            # each moment once (the frameworks starting at different ones), then drawn at random
            first = ["pytorch", "tf"].index(framework)
            moment = MOMENTS[(first + trial) % len(MOMENTS)] if trial < len(MOMENTS) else rng.choice(MOMENTS)
            log = tmp_path / f"trial{trial}.log"
            if moment == "time":
                process = start(framework, "none", 0, argv, log)
                while "Step=" not in log.read_text() and process.poll() is None:
                    time.sleep(0.02)
                time.sleep(rng.uniform(0, 1.5))
                process.send_signal(signal.SIGKILL)
            else:
                at = rng.randint(1, calls[moment])
                moment = f"{moment} {at} of {calls[moment]}"
                process = start(framework, moment.split()[0], at, argv, log)
            status = process.wait(600)
            moments.append(moment)
            loadable = newest_loads(framework, model_dir)
            # the same command resumes, in a process of its own as the reference ran: this process's state
            # (its threads, its environment, what earlier tests left) is not the user's
            resume_log = tmp_path / f"trial{trial}.resume.log"
            assert start(framework, "none", 0, argv, resume_log).wait(600) == 0, resume_log.read_text()
            got = final_state(framework, model_dir)
            same = got.keys() == expected.keys() and all(np.array_equal(got[k], expected[k]) for k in expected)
            lost += not (loadable and same)
            assert loadable, f"trial {trial} ({moment}, status {status}): the newest checkpoint does not load"
            assert same, f"trial {trial} ({moment}): resumed weights differ: " + ", ".join(
                f"{k} (by {np.max(np.abs(got[k] - expected[k])) if k in got else 'missing'})"
                for k in expected if k not in got or not np.array_equal(got[k], expected[k]))
    finally:
        ledger.record(f"kill -9 during training or a checkpoint save ({framework} mnist), then resume",
                      len(moments), lost)
