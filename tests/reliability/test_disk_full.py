"""A disk that fills up during a checkpoint save (ENOSPC, injected into the writer): the run
stops with one line naming the checkpoint not saved and the one kept; that previous
checkpoint stays intact and the newest in model_dir, nothing half-written is left; with
space again, the same command resumes from it to the same final weights as a run that
never met a full disk.

mnist's tiny config, 4 steps, checkpoints at 2 and 4; the save at step 4 fails. PyTorch:
the checkpoint's file refuses bytes past a point (0, a few hundred, most of it). TF: the
tensor files fail to reach the disk (fsync), or the state file naming the new checkpoint
cannot be written.
"""

from __future__ import annotations

import contextlib
import errno
import os

import numpy as np
import pytest

from tests.reliability.conftest import FULL, mnist_argv, needs, one_error_line, run_main


class _FillingFile:
    """A file that takes ``room`` bytes and then reports the disk full."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, mnist_dir):
    """Each framework's final checkpoint of the same 4 steps, never interrupted."""
    done = {}

    def get(framework):
        if framework not in done:
            model_dir = tmp_path_factory.mktemp(framework) / "model"
            assert run_main(framework, mnist_argv(framework, model_dir, mnist_dir)) == 0
            done[framework] = model_dir
        return done[framework]

    return get


def _leftovers(model_dir) -> list[str]:
    return [name for name in os.listdir(model_dir) if name.endswith(".tmp") or "_temp" in name]


@pytest.mark.parametrize("room", [0, 300, 2000, 20000])
def test_pytorch_a_full_disk_during_a_save_keeps_the_previous_checkpoint(
        room, uninterrupted, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    needs("torch")
    import torch

    from common.pytorch import checkpoint

    reference = uninterrupted("pytorch")
    real_open = checkpoint.atomic_open

    @contextlib.contextmanager
    def filling_open(path, mode="wb"):
        with real_open(path, mode) as f:
            yield _FillingFile(f, room) if path.endswith("checkpoint_4.mdl") else f

    model_dir = tmp_path / "model"
    argv = mnist_argv("pytorch", model_dir, mnist_dir)
    monkeypatch.setattr(checkpoint, "atomic_open", filling_open)
    status = run_main("pytorch", argv)
    err = capsys.readouterr().err
    kept = model_dir / "checkpoint_2.mdl"
    newest = checkpoint.latest_checkpoint(str(model_dir))
    intact = newest == str(kept) and checkpoint.load_checkpoint(newest)["global_step"] == 2 and not _leftovers(model_dir)

    monkeypatch.setattr(checkpoint, "atomic_open", real_open)  # space again: the same command resumes
    assert run_main("pytorch", argv) == 0
    capsys.readouterr()
    final = checkpoint.load_checkpoint(str(model_dir / "checkpoint_4.mdl"))["model"]
    expected = checkpoint.load_checkpoint(str(reference / "checkpoint_4.mdl"))["model"]
    same = all(torch.equal(final[k], expected[k]) for k in expected)
    line = one_error_line(status, err)
    ledger.record("disk full during a checkpoint save (pytorch mnist)", 1, not (intact and same))
    assert line == (f"error: {model_dir / 'checkpoint_4.mdl'}: not saved (No space left on device); the newest "
                    f"complete checkpoint is kept: {kept}"), line
    assert intact and same


@pytest.mark.parametrize("where", ["fsync", "state file"])
def test_tf_a_full_disk_during_a_save_keeps_the_previous_checkpoint(
        where, uninterrupted, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    needs("tensorflow")
    from common.tf.estimator import checkpoints
    from common.weights_io import tf_variables

    reference = uninterrupted("tf")
    name, real = ("_fsync", checkpoints._fsync) if where == "fsync" else \
        ("atomic_write_text", checkpoints.atomic_write_text)

    def full(path, *args):
        if "model.ckpt-4" in path or (where == "state file" and "model.ckpt-4" in args[0]):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, *args)

    model_dir = tmp_path / "model"
    argv = mnist_argv("tf", model_dir, mnist_dir)
    monkeypatch.setattr(checkpoints, name, full)
    status = run_main("tf", argv)
    err = capsys.readouterr().err
    kept = os.path.join(os.path.abspath(model_dir), "model.ckpt-2")
    newest = checkpoints.latest_checkpoint(str(model_dir))
    intact = (newest == kept and checkpoints.checkpoint_problem(kept) is None and not _leftovers(model_dir)
              and not any(n.startswith("model.ckpt-4") for n in os.listdir(model_dir)))

    monkeypatch.setattr(checkpoints, name, real)
    assert run_main("tf", argv) == 0
    capsys.readouterr()
    final, expected = tf_variables(str(model_dir / "model.ckpt-4")), tf_variables(str(reference / "model.ckpt-4"))
    same = final.keys() == expected.keys() and all(np.array_equal(final[k], expected[k]) for k in expected)
    line = one_error_line(status, err)
    ledger.record("disk full during a checkpoint save (tf mnist)", 1, not (intact and same))
    assert line == (f"error: {kept[:-1]}4: not saved (No space left on device); the newest complete "
                    f"checkpoint is kept: {kept}"), line
    assert intact and same


# --- a full disk while writing reports: the compile report, predictions, eval results -------

def _not_written(path) -> str:
    return (f"error: {path}: not written (No space left on device); nothing half-written is left, and a file of "
            f"that name written before is kept as it was")


def _files(folder) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


def _filling_open(real, target: str, room: int):
    """``atomic_open`` whose file for a path ending in ``target`` takes ``room`` bytes and then reports the disk full."""

    @contextlib.contextmanager
    def filling_open(path, mode="wb"):
        with real(path, mode) as f:
            yield _FillingFile(f, room) if os.fspath(path).endswith(target) else f

    return filling_open


@pytest.mark.parametrize("framework,target,room", [("pytorch", "report.json", 100), ("tf", "placement.svg", 0),
                                                   ("tf", "ir.json", 5000)])
def test_a_full_disk_while_writing_the_compile_report_keeps_the_previous_report(
        framework, target, room, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    if not FULL and framework != "pytorch":
        pytest.skip("RELIABILITY_FULL=1 runs every file of the report")
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    import zoo_base.io

    model_dir = tmp_path / "model"
    argv = mnist_argv(framework, model_dir, mnist_dir, "--compile_only", "train_input.batch_size=16")
    assert run_main(framework, argv) == 0
    folder = model_dir / "compile"
    before = _files(folder)
    # another batch size: another report, so that a mix of the two compiles' files would show
    monkeypatch.setattr(zoo_base.io, "atomic_open", _filling_open(zoo_base.io.atomic_open, target, room))
    status = run_main(framework, [*argv[:-1], "train_input.batch_size=32"])
    err = capsys.readouterr().err
    kept = _files(folder) == before and not _leftovers(folder)
    ledger.record("disk full while writing the compile report (both frameworks)", 1, not kept)
    assert one_error_line(status, err) == _not_written(folder / target)
    assert kept, sorted(os.listdir(folder))


@pytest.mark.parametrize("framework", ["pytorch", "tf"])
def test_a_full_disk_while_writing_predictions_keeps_the_previous_ones(
        framework, uninterrupted, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    if not FULL and framework != "pytorch":
        pytest.skip("RELIABILITY_FULL=1 runs both frameworks")
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    import shutil

    model_dir = tmp_path / "model"
    shutil.copytree(uninterrupted(framework), model_dir)
    argv = mnist_argv(framework, model_dir, mnist_dir, "--mode", "predict")
    assert run_main(framework, argv) == 0
    path = model_dir / "predictions.npz"
    before = path.read_bytes()
    if framework == "pytorch":
        from common.pytorch import runner as module
        earlier = model_dir / "checkpoint_2.mdl"
    else:
        from common.tf import run as module
        earlier = model_dir / "model.ckpt-2"
    monkeypatch.setattr(module, "atomic_open", _filling_open(module.atomic_open, "predictions.npz", 1000))
    # the predictions of an earlier checkpoint: other numbers, so that a half-replaced file would show
    status = run_main(framework, [*argv, "--checkpoint_path", str(earlier)])
    err = capsys.readouterr().err
    kept = path.read_bytes() == before and not _leftovers(model_dir)
    ledger.record("disk full while writing predictions.npz (both frameworks)", 1, not kept)
    assert one_error_line(status, err) == _not_written(path)
    assert kept


class _NearlyFullFile:
    """An unbuffered file that takes ``room`` more bytes (the last write only partly), then reports the disk full."""

    def __init__(self, f, room: int):
        self.f, self.room = f, room

    def write(self, data) -> int:
        if self.room == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        taken = self.f.write(bytes(data[:self.room]))
        self.room -= taken
        return taken

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("framework", ["pytorch", "tf"])
def test_a_full_disk_while_writing_eval_results_leaves_no_half_record(
        framework, uninterrupted, mnist_dir, tmp_path, capsys, monkeypatch, ledger):
    if not FULL and framework != "pytorch":
        pytest.skip("RELIABILITY_FULL=1 runs both frameworks")
    needs({"pytorch": "torch", "tf": "tensorflow"}[framework])
    import builtins
    import shutil

    from common import summaries

    model_dir = tmp_path / "model"
    shutil.copytree(uninterrupted(framework), model_dir)
    argv = mnist_argv(framework, model_dir, mnist_dir, "--mode", "eval")
    assert run_main(framework, argv) == 0
    eval_dir = model_dir / "eval"
    before = summaries.read_scalars(str(eval_dir))
    opened = []

    def nearly_full_open(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        if os.path.dirname(os.fspath(path)) == str(eval_dir) and "a" in mode:
            opened.append(os.fspath(path))
            return _NearlyFullFile(f, 60)  # the file's first record whole, the metrics' record cut short
        return f

    monkeypatch.setattr(summaries, "open", nearly_full_open, raising=False)
    status = run_main(framework, argv)
    err = capsys.readouterr().err
    monkeypatch.undo()
    header = len(open(opened[0], "rb").read()) if opened else -1
    kept = summaries.read_scalars(str(eval_dir)) == before and 0 < header <= 60
    ledger.record("disk full while writing eval results (event files, both frameworks)", 1, not kept)
    assert opened and one_error_line(status, err) == _not_written(opened[0])
    assert kept, (header, summaries.read_scalars(str(eval_dir)), before)
