"""Atomic writes and TensorBoard event files."""

import os

import pytest

from common.io import atomic_open, atomic_write_text
from common.summaries import ScalarWriter, read_scalars


def test_atomic_write_replaces_only_on_success(tmp_path):
    path = tmp_path / "ckpt"
    atomic_write_text(path, "good")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as f:
            f.write("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "good"
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary file left behind


def test_event_file_is_read_by_tensorboard(tmp_path):
    writer = ScalarWriter(str(tmp_path / "train"))
    writer.scalars(1, {"loss": 2.5, "lr": 0.1})
    writer.scalars(2, {"loss": 1.5})
    writer.close()
    assert read_scalars(str(tmp_path / "train"))["loss"] == [(1, 2.5), (2, 1.5)]
    # TensorBoard's own reader agrees (it checks the record CRCs)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(tmp_path / "train"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("loss")] == [2.5, 1.5]
    assert [e.step for e in acc.Scalars("lr")] == [1]


def test_atomic_write_has_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "f").stat().st_mode & 0o777 == 0o644
