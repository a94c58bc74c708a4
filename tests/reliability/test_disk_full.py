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

from tests.reliability.conftest import mnist_argv, needs, one_error_line, run_main


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
