"""A run's lifecycle without a framework: the model_dir lock, Ctrl-C / SIGTERM, the stop line.

The runners' side (a real training stopped by a signal, a second run refused, a run killed
with -9) is in tests/test_run_lifecycle.py.
"""

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from common import runlock
from common.cli import guarded
from common.data.mnist import resolve_mnist, write_fake_mnist
from common.errors import UserError
from common.interrupt import Interrupted, raise_on_signals, stop_between_steps
from common.log import TrainMeter

ROOT = Path(__file__).resolve().parents[2]

# a process that takes model_dir's lock, says so, and holds it until its stdin closes
HOLDER = """
import sys
from common.runlock import RunLock
lock = RunLock(sys.argv[1], "train")
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
"""


def env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def holder(tmp_path):
    """Another process holding tmp_path/model's lock."""
    model_dir = tmp_path / "model"
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, env=env())
    assert process.stdout.readline().strip() == "locked"
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


def lock_file(tmp_path) -> Path:
    return tmp_path / "model" / runlock.LOCK_NAME


def test_a_second_run_is_refused_naming_the_first(tmp_path, holder):
    model_dir = str(tmp_path / "model")
    before = lock_file(tmp_path).read_text()
    for attempt in (runlock.check_free, lambda d: runlock.RunLock(d, "eval").acquire()):
        with pytest.raises(UserError) as refused:
            attempt(model_dir)
        message = str(refused.value)
        assert message.startswith(f"{model_dir} is in use by another run: pid {holder.pid} on host "
                                  f"{socket.gethostname()} (train, since ")
        assert "\n" not in message and "another --model_dir" in message
    assert lock_file(tmp_path).read_text() == before  # the refused run wrote nothing
    assert sorted(os.listdir(model_dir)) == [runlock.LOCK_NAME]

    holder.communicate("")  # the first run ends: its lock and the file go
    assert holder.returncode == 0 and not lock_file(tmp_path).exists()
    with runlock.RunLock(model_dir, "train") as lock:
        lock.acquire()
        assert json.loads(lock_file(tmp_path).read_text())["pid"] == os.getpid()
    assert not lock_file(tmp_path).exists()


def test_a_lock_left_by_kill_9_is_taken_over_with_a_warning(tmp_path, holder, caplog):
    holder.kill()  # SIGKILL: no cleanup, the file stays with the dead run's pid
    holder.wait()
    assert json.loads(lock_file(tmp_path).read_text())["pid"] == holder.pid
    runlock.check_free(str(tmp_path / "model"))  # nothing holds it any more
    lock = runlock.RunLock(str(tmp_path / "model"), "train")
    with caplog.at_level(logging.WARNING, logger="zoo"):
        lock.acquire()
    try:
        assert f"taking over the lock of pid {holder.pid} on host" in caplog.text
        assert "no longer running" in caplog.text
        assert json.loads(lock_file(tmp_path).read_text())["pid"] == os.getpid()
    finally:
        lock.release()


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


@pytest.mark.parametrize("locks", ["flock", "pid only"])
def test_lock_files_by_pid(tmp_path, monkeypatch, caplog, locks):
    """A file system without locks (some network mounts): the pid in the file decides. A
    live foreign pid on this host (the test's parent) refuses; a dead one is taken over."""
    if locks == "pid only":
        monkeypatch.setattr(runlock, "fcntl", None)
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    path = model_dir / runlock.LOCK_NAME
    record = {"host": socket.gethostname(), "mode": "train", "started": 0}

    path.write_text(json.dumps({**record, "pid": dead_pid()}))
    with caplog.at_level(logging.WARNING, logger="zoo"), runlock.RunLock(str(model_dir), "train") as lock:
        lock.acquire()
        assert "no longer running" in caplog.text
    assert not path.exists()

    path.write_text(json.dumps({**record, "pid": os.getppid()}))
    if locks == "flock":  # no process holds the flock: the file is a leftover, whatever its pid
        with caplog.at_level(logging.WARNING, logger="zoo"), runlock.RunLock(str(model_dir), "train") as lock:
            lock.acquire()
            assert f"the lock of pid {os.getppid()} on host {socket.gethostname()}" in caplog.text
            assert "which holds it no longer" in caplog.text
        return
    for attempt in (runlock.check_free, lambda d: runlock.RunLock(d, "train").acquire()):
        with pytest.raises(UserError, match=f"in use by another run: pid {os.getppid()} on host"):
            attempt(str(model_dir))
    path.write_text(json.dumps({**record, "pid": os.getppid(), "host": "elsewhere"}))
    with pytest.raises(UserError, match="pid .* on host elsewhere"):  # another host's pid: cannot tell, refuse
        runlock.check_free(str(model_dir))


def args(mode="train"):
    return argparse.Namespace(verbose=False, mode=mode)


def test_guarded_releases_the_lock_however_the_run_ends(tmp_path, capsys):
    def body(_):
        runlock.RunLock(str(tmp_path / "model"), "train").acquire()
        raise UserError("bad input")

    with pytest.raises(SystemExit) as exit_info:
        guarded(body, args())
    assert exit_info.value.code == 2 and capsys.readouterr().err == "error: bad input\n"
    assert not lock_file(tmp_path).exists() and runlock._held == []


@pytest.mark.parametrize("raised, status, line", [
    (Interrupted(signal.SIGTERM, "interrupted by SIGTERM at step 3 of 9; saved x"), 143,
     "interrupted by SIGTERM at step 3 of 9; saved x"),
    (KeyboardInterrupt(), 130, "interrupted by SIGINT during --mode train"),  # before the params: no model_dir known
])
def test_guarded_turns_a_signal_into_one_line_and_the_shells_status(capsys, raised, status, line):
    def body(_):
        raise raised

    with pytest.raises(SystemExit) as exit_info:
        guarded(body, args())
    assert exit_info.value.code == status
    assert capsys.readouterr().err == line + "\n"


def test_sigterm_raises_inside_guarded_and_not_after():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as raised, raise_on_signals():
        os.kill(os.getpid(), signal.SIGTERM)
    assert raised.value.exit_code == 143 and raised.value.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_first_signal_asks_to_stop_the_second_stops_at_once():
    before = signal.getsignal(signal.SIGINT)  # default_int_handler; SIG_IGN in a shell's background job
    with pytest.raises(Interrupted) as raised, stop_between_steps() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and stop.signum == signal.SIGINT  # no exception: the step goes on
        os.kill(os.getpid(), signal.SIGTERM)
        pytest.fail("the second signal did not stop at once")
    assert raised.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGINT) is before  # put back as it was


class _StderrInAWrite:
    """sys.stderr as a signal finds it when it lands inside a write: any write is reentrant."""

    def write(self, text):
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    def flush(self):
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")


def test_the_stop_warning_does_not_write_through_sys_stderr(monkeypatch, capfd):
    # a signal landing while the log writes a line ran the handler's own log write into the
    # same buffered stream: "RuntimeError: reentrant call" and a logging traceback
    monkeypatch.setattr(sys, "stderr", _StderrInAWrite())
    logging.getLogger("zoo").addHandler(handler := logging.StreamHandler(sys.stderr))
    try:
        with pytest.raises(Interrupted), stop_between_steps() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.requested
            os.kill(os.getpid(), signal.SIGTERM)
    finally:
        logging.getLogger("zoo").removeHandler(handler)
    err = capfd.readouterr().err
    assert "WARNING SIGTERM: stopping after the current step (send it again to stop at once)" in err, err
    assert "Logging error" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("start, explicit, saved, stopped, line", [
    (None, False, None, 3, "interrupted by SIGINT at step 3 of 100, before the first checkpoint; the same command "
                           "starts again from step 0"),
    ("md/c_10", False, None, 13, "interrupted by SIGINT at step 13 of 100, before this run's first checkpoint; the "
                                 "same command starts again from md/c_10 (step 10)"),
    (None, False, ("md/c_40", 40), 40, "interrupted by SIGINT at step 40 of 100; saved md/c_40: the same command "
                                       "resumes from there"),
    (None, False, ("md/c_40", 40), 42, "interrupted by SIGINT at step 42 of 100; the newest checkpoint is md/c_40 "
                                       "(step 40): the same command resumes from it"),
    ("x/c_10", True, ("md/c_40", 40), 40, "interrupted by SIGINT at step 40 of 100; saved md/c_40: to resume from it, "
                                          "run the same command without --checkpoint_path (with it, the run starts "
                                          "from x/c_10 again)"),
])
def test_the_stop_line_says_where_the_same_command_resumes(start, explicit, saved, stopped, line):
    meter = TrainMeter("cpu", 10 if start else 0, 100, start, explicit_start=explicit)
    if saved:
        meter.saved(*saved)
    assert meter.interrupted(signal.SIGINT, stopped) == line


@pytest.mark.parametrize("dataset", ["auto", "mnist"])
def test_data_dir_that_is_a_file(tmp_path, dataset):
    write_fake_mnist(tmp_path, n_train=8, n_test=8)
    images = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    with pytest.raises(UserError) as error:
        resolve_mnist(str(images), dataset)
    assert str(error.value) == (f"data_dir {images} is a file, not a folder: give the folder that holds MNIST/raw "
                                f"(or that MNIST/raw folder itself)")


def test_a_model_dir_that_is_a_file(tmp_path):
    path = tmp_path / "model"
    path.write_text("not a folder")
    with pytest.raises(UserError, match=f"^model_dir {path} is a file, not a folder$"):
        runlock.RunLock(str(path), "train").acquire()
    assert path.read_text() == "not a folder"
