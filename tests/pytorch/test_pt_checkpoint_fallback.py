"""Damaged and mismatched .mdl checkpoints in pytorch/mnist's model_dir, on the CPU and the emulator.

A damaged newest checkpoint falls back to the newest that reads, with a warning naming the
bad file; none readable is an error naming them (never a silent start from step 0); an
explicit --checkpoint_path that does not read stays an error (tests/pytorch/test_pt_bad_input.py).
A checkpoint of another model says what differs, on one line cut at no word. Then
common/pytorch/checkpoint.py's pieces on their own.
"""

import hashlib
import logging
import os
import random
import re
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from common.data import write_fake_mnist
from common.errors import UserError
from common.folder import load_run_module
from common.pytorch import checkpoint as checkpoint_module
from common.pytorch.checkpoint import (UnreadableCheckpoint, _shorten, describe_mismatch, last_readable,
                                       latest_checkpoint, list_checkpoints, load_checkpoint, not_saved,
                                       optimizer_mismatch, rng_state, save_checkpoint, set_rng_state)

ROOT = Path(__file__).resolve().parents[2]
MNIST = str(ROOT / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")


def main(argv):
    return load_run_module(MNIST).main(argv)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    write_fake_mnist(folder, n_train=64, n_test=32, seed=0)
    return folder


def argv_for(model_dir, data_dir, *extra):
    return ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}",
            f"eval_input.data_dir={data_dir}", *extra]


@pytest.fixture
def model_dir(tmp_path, data_dir, capsys):
    """The tiny config trained: checkpoint_2.mdl and checkpoint_4.mdl; the newest cut short."""
    folder = tmp_path / "model_dir"
    main(argv_for(folder, data_dir))
    capsys.readouterr()  # the tests read their own run's log
    newest = folder / "checkpoint_4.mdl"
    newest.write_bytes(newest.read_bytes()[:1000])  # a copy cut short, a disk that filled up
    return folder


def fallback_warning(model_dir: Path) -> str:
    return (f"{model_dir / 'checkpoint_4.mdl'}: not a readable checkpoint (not a torch.save archive: truncated, "
            f"damaged or another format); skipped, using {model_dir / 'checkpoint_2.mdl'} instead")


@pytest.mark.parametrize("device", ["cpu", "emulator"])
def test_train_resumes_from_the_newest_readable_checkpoint(capsys, model_dir, data_dir, device):
    main(argv_for(model_dir, data_dir, "--device", device, "runconfig.max_steps=6"))
    err = capsys.readouterr().err
    assert fallback_warning(model_dir) in err
    assert f"starting from {model_dir / 'checkpoint_2.mdl'} (step 2)" in err
    assert f"| Train Device={device} Step=3 " in err  # from step 2, not from 0
    assert "Step=1 " not in err


def test_eval_and_eval_all_skip_the_damaged_checkpoint(capsys, model_dir, data_dir):
    metrics = main(argv_for(model_dir, data_dir, "--mode", "eval"))
    err = capsys.readouterr().err
    assert fallback_warning(model_dir) in err and "| Eval Device=cpu Step=2 " in err
    assert set(metrics) == {"loss", "accuracy"}

    results = main(argv_for(model_dir, data_dir, "--mode", "eval_all"))
    assert list(results) == [2]
    assert f"{model_dir / 'checkpoint_4.mdl'}: not a readable checkpoint" in capsys.readouterr().err


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def expect_error(capsys, argv, model_dir) -> str:
    before = snapshot(model_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and snapshot(model_dir) == before
    line = err.strip().splitlines()[-1]
    assert line.startswith("error: ") and [l for l in err.splitlines() if "error:" in l] == [line]
    return line


@pytest.mark.parametrize("device", ["cpu", "emulator"])
def test_the_only_checkpoint_damaged_is_an_error_not_a_start_from_0(capsys, model_dir, data_dir, device):
    (model_dir / "checkpoint_2.mdl").unlink()
    line = expect_error(capsys, argv_for(model_dir, data_dir, "--device", device), model_dir)
    assert line == (f"error: {model_dir / 'checkpoint_4.mdl'}: not a readable checkpoint (not a torch.save "
                    f"archive: truncated, damaged or another format), and {model_dir} holds no other checkpoint; "
                    f"move it away to start from step 0, or pass --checkpoint_path")


def test_a_checkpoint_of_another_model_says_what_differs(capsys, model_dir, data_dir):
    newest_good = model_dir / "checkpoint_2.mdl"
    line = expect_error(capsys, argv_for(model_dir, data_dir, "--mode", "eval", "model.hidden_sizes=[32, 16, 8, 4]"),
                        model_dir)
    # the model's layers: 784 -> 32 -> 16 -> 8 -> 4 -> 10; the checkpoint's: 784 -> 32 -> 16 -> 10
    assert line == (f"error: {newest_good}: does not fit this model: 4 missing from the checkpoint "
                    f"(layers.7.weight, layers.7.bias, layers.9.weight and 1 more); 2 of another shape, "
                    f"checkpoint -> model (layers.5.weight 10x16 -> 8x16, layers.5.bias 10 -> 8) (a checkpoint of "
                    f"another model or config?)")


def test_resuming_with_another_optimizer_is_one_line(capsys, model_dir, data_dir):
    line = expect_error(capsys, argv_for(model_dir, data_dir, "optimizer.optimizer_type=sgd",
                                         "runconfig.max_steps=6"), model_dir)
    assert line.startswith(f"error: {model_dir / 'checkpoint_2.mdl'}: does not fit this run: its optimizer state "
                           f"is another optimizer's: it has amsgrad, betas, ")
    assert "where this run's optimizer has dampening, momentum, nesterov; resume with the optimizer_type" in line


def test_list_checkpoints_takes_only_checkpoint_files_in_step_order(tmp_path):
    assert list_checkpoints(str(tmp_path / "absent")) == [] and latest_checkpoint(str(tmp_path / "absent")) is None
    for name in ("checkpoint_10.mdl", "checkpoint_9.mdl", "checkpoint_0.mdl", ".checkpoint_11.mdl.x.tmp",
                 "checkpoint_12.mdl.tmp", "xcheckpoint_13.mdl", "checkpoint_x.mdl", "params_train.yaml"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "checkpoint_14.mdl").mkdir()  # a name match is enough: loading it says what is wrong
    assert list_checkpoints(str(tmp_path)) == [(step, str(tmp_path / f"checkpoint_{step}.mdl"))
                                               for step in (0, 9, 10, 14)]
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint_14.mdl")


def test_save_checkpoint_keeps_the_newest_or_all(tmp_path):
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "lr_scheduler": {}, "global_step": 0}
    for step in (1, 2, 3):
        assert save_checkpoint(dict(state, global_step=step), str(tmp_path), step, keep_max=0) == \
            str(tmp_path / f"checkpoint_{step}.mdl")
    assert [step for step, _ in list_checkpoints(str(tmp_path))] == [1, 2, 3]
    save_checkpoint(dict(state, global_step=4), str(tmp_path), 4, keep_max=1)
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_4.mdl"]
    assert load_checkpoint(str(tmp_path / "checkpoint_4.mdl"))["global_step"] == 4


def test_a_checkpoint_written_on_a_gpu_loads_on_a_cpu_machine(tmp_path, monkeypatch):
    """A checkpoint from a GPU run (its tensors tagged cuda:0) resumes or evaluates on a machine
    without CUDA: its tensors come back on the CPU."""
    state = {"model": {"w": torch.ones(2)}, "optimizer": {}, "lr_scheduler": {}, "global_step": 7}
    with monkeypatch.context() as patch:  # what torch.save records for a tensor on the first GPU
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        path = save_checkpoint(state, str(tmp_path), 7, keep_max=0)
    assert not torch.cuda.is_available()
    with pytest.raises(RuntimeError, match="CUDA"):  # what torch does without a map_location
        torch.load(path, weights_only=True)
    loaded = load_checkpoint(path)
    assert loaded["global_step"] == 7 and loaded["model"]["w"].device == torch.device("cpu")
    torch.testing.assert_close(loaded["model"]["w"], torch.ones(2))


def test_a_refused_write_names_the_file_the_reason_and_the_checkpoint_kept(tmp_path, monkeypatch):
    disk_full = OSError(28, "No space left on device")
    assert str(not_saved("m/checkpoint_6.mdl", disk_full, "m/checkpoint_4.mdl")) == (
        "m/checkpoint_6.mdl: not saved (No space left on device); the newest complete checkpoint is kept: "
        "m/checkpoint_4.mdl")
    assert isinstance(not_saved("p", disk_full, None), UserError)
    assert str(not_saved("p", disk_full, None)).endswith("is kept: none (none was written yet)")
    # torch.save's RuntimeError with the OSError as its cause, or raised while handling it
    wrapped = RuntimeError("write failed")
    wrapped.__cause__ = disk_full
    assert str(not_saved("p", wrapped, None)).startswith("p: not saved (No space left on device);")
    handled = RuntimeError("write failed")
    handled.__context__ = OSError(122, "Disk quota exceeded")
    assert str(not_saved("p", handled, None)).startswith("p: not saved (Disk quota exceeded);")
    assert str(not_saved("p", OSError("no errno"), None)).startswith("p: not saved (no errno);")
    bug = RuntimeError("a bug")
    assert not_saved("p", bug, None) is bug

    # save_checkpoint raises it, naming the newest checkpoint there
    state = {"model": {}, "optimizer": {}, "lr_scheduler": {}, "global_step": 2}
    save_checkpoint(state, str(tmp_path), 2, keep_max=0)

    def disk_full_save(obj, f, *args, **kwargs):
        raise disk_full

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full_save)
    with pytest.raises(UserError) as error:
        save_checkpoint(state, str(tmp_path), 4, keep_max=0)
    assert str(error.value) == (f"{tmp_path / 'checkpoint_4.mdl'}: not saved (No space left on device); the newest "
                                f"complete checkpoint is kept: {tmp_path / 'checkpoint_2.mdl'}")
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_2.mdl"]


def test_load_checkpoint_says_what_is_wrong(tmp_path, monkeypatch):
    with pytest.raises(UnreadableCheckpoint) as error:
        load_checkpoint(str(tmp_path / "x.mdl"))
    assert str(error.value) == f"{tmp_path / 'x.mdl'}: checkpoint not found"
    torch.save({"model": {}, "global_step": 1}, tmp_path / "partial.mdl")
    with pytest.raises(UnreadableCheckpoint) as error:
        load_checkpoint(str(tmp_path / "partial.mdl"))
    assert str(error.value) == f"{tmp_path / 'partial.mdl'}: not a zoo checkpoint (missing optimizer, lr_scheduler)"
    torch.save([1, 2], tmp_path / "list.mdl")
    with pytest.raises(UnreadableCheckpoint) as error:
        load_checkpoint(str(tmp_path / "list.mdl"))
    assert str(error.value) == (f"{tmp_path / 'list.mdl'}: not a zoo checkpoint "
                                f"(missing model, optimizer, lr_scheduler, global_step)")

    # one flipped byte inside a tensor's stored bytes: torch.load would read it as a wrong weight
    good = tmp_path / "good.mdl"
    torch.save({"model": {"w": torch.zeros(64)}, "optimizer": {}, "lr_scheduler": {}, "global_step": 3}, good)
    assert load_checkpoint(str(good))["global_step"] == 3
    data = bytearray(good.read_bytes())
    with zipfile.ZipFile(good) as archive:
        entry = next(info for info in archive.infolist() if info.filename.endswith("/data/0"))
    header = entry.header_offset  # the local header: 30 bytes, the name, then its own extra field
    start = header + 30 + int.from_bytes(data[header + 26:header + 28], "little") + \
        int.from_bytes(data[header + 28:header + 30], "little")
    data[start + 10] ^= 0xFF
    bad = tmp_path / "bad.mdl"
    bad.write_bytes(bytes(data))
    with pytest.raises(UnreadableCheckpoint) as error:
        load_checkpoint(str(bad))
    assert str(error.value) == (f"{bad}: not a readable checkpoint (damaged: the CRC-32 of entry {entry.filename} "
                                f"does not match its bytes)")

    # a zip that is no torch archive: torch's reason, its first line; or the error's kind without words
    foreign = tmp_path / "foreign.mdl"
    with zipfile.ZipFile(foreign, "w") as archive:
        archive.writestr("hello.txt", "hi")
    with pytest.raises(UnreadableCheckpoint) as error:
        load_checkpoint(str(foreign))
    assert re.fullmatch(re.escape(f"{foreign}: not a readable checkpoint (") + r"\[enforce fail at [^]]+\] \. "
                        r"file in archive is not in a subdirectory: hello\.txt\)", str(error.value)), str(error.value)
    real_load = torch.load
    for raised, shown in ((RuntimeError("  first line\nsecond line"), "first line"), (RuntimeError(), "RuntimeError")):
        def fail(*args, raised=raised, **kwargs):
            raise raised

        monkeypatch.setattr(checkpoint_module.torch, "load", fail)
        with pytest.raises(UnreadableCheckpoint) as error:
            load_checkpoint(str(good))
        assert str(error.value) == f"{good}: not a readable checkpoint ({shown})"
    monkeypatch.setattr(checkpoint_module.torch, "load", real_load)

    # a garbled entry header counts as a bad entry
    data = bytearray(good.read_bytes())
    data[header:header + 4] = b"XX\x03\x04"
    bad.write_bytes(bytes(data))
    with pytest.raises(UnreadableCheckpoint, match=f"damaged: the CRC-32 of entry {entry.filename} does not"):
        load_checkpoint(str(bad))

    # the archive's reader failing on the data (cut short, a garbled stream): its words, or its kind without them
    for raised, shown in ((zlib.error("Error -3 while decompressing data:  invalid\nblock"),
                           "Error -3 while decompressing data: invalid block"), (EOFError(), "EOFError")):
        def fail(self, raised=raised):
            raise raised

        monkeypatch.setattr(zipfile.ZipFile, "testzip", fail)
        with pytest.raises(UnreadableCheckpoint) as error:
            load_checkpoint(str(good))
        assert str(error.value) == f"{good}: not a readable checkpoint (damaged: {shown})"


def test_last_readable_skips_bad_ones_and_names_them_all_when_none_reads(tmp_path, caplog):
    state = {"model": {}, "optimizer": {}, "lr_scheduler": {}, "global_step": 2}
    save_checkpoint(state, str(tmp_path), 2, keep_max=0)
    for step in (4, 6):
        (tmp_path / f"checkpoint_{step}.mdl").write_bytes(b"not a zip")
    checkpoints = list_checkpoints(str(tmp_path))
    assert last_readable([], str(tmp_path)) is None
    with caplog.at_level(logging.WARNING, logger="zoo"):
        path, loaded = last_readable(checkpoints, str(tmp_path), warn=False)
    assert path == str(tmp_path / "checkpoint_2.mdl") and loaded["global_step"] == 2 and not caplog.records
    with caplog.at_level(logging.WARNING, logger="zoo"):
        last_readable(checkpoints, str(tmp_path))
    reason = "not a readable checkpoint (not a torch.save archive: truncated, damaged or another format)"
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / f'checkpoint_{step}.mdl'}: {reason}; skipped, using {path} instead" for step in (6, 4)]

    with pytest.raises(UserError) as error:
        last_readable(checkpoints[1:], str(tmp_path))
    assert str(error.value) == (f"{tmp_path}: none of its 2 checkpoints reads (checkpoint_6.mdl, checkpoint_4.mdl; "
                                f"the newest: {tmp_path / 'checkpoint_6.mdl'}: {reason}); move them away to start "
                                f"from step 0, or pass --checkpoint_path")


def test_shorten_cuts_at_a_word_on_one_line():
    assert _shorten("a\n  b\tc ") == "a b c"
    assert _shorten("x" * 200) == "x" * 200
    assert _shorten("y " * 100 + "z") == " ".join(["y"] * 100) + " ..."  # 201 characters: over 200
    assert _shorten("wordX " * 50) == " ".join(["wordX"] * 33) + " ..."  # only , ; : come off the end
    assert _shorten("word " * 40 + "end") == ("word " * 40).strip() + " ..."  # 203 characters
    assert _shorten("ab, " * 60) == ("ab, " * 50).strip().rstrip(",") + " ..."
    assert _shorten("one two three", limit=8) == "one two ..."
    assert _shorten("one two; three", limit=9) == "one two ..."


def test_mismatch_messages_name_the_first_three_keys():
    model = {name: torch.zeros(2) for name in ("a", "b")}
    assert describe_mismatch([1], model, ValueError()) == "its 'model' entry is a list, not a state_dict"
    saved = {"a": torch.zeros(2), "b": torch.zeros(2), "c": 1, "d": 1, "e": 1, "f": 1}
    assert describe_mismatch(saved, model, ValueError()) == "4 not in the model (c, d, e and 1 more)"
    assert describe_mismatch({"a": torch.zeros(3), "b": 5}, model, ValueError()) == (
        "1 of another shape, checkpoint -> model (a 3 -> 2)")
    assert describe_mismatch({"a": torch.zeros(2, 3), "b": torch.tensor(1.0)}, model, ValueError()) == (
        "2 of another shape, checkpoint -> model (a 2x3 -> 2, b scalar -> 2)")
    assert describe_mismatch(model, model, ValueError("  loaded state dict\ncontains a parameter group  ")) == (
        "the weights fit, the rest does not: loaded state dict contains a parameter group")
    assert describe_mismatch(model, model, KeyError()) == "the weights fit, the rest does not: KeyError"

    adam = {"param_groups": [{"params": [0], "lr": 1, "betas": 1, "eps": 1, "amsgrad": 1, "weight_decay": 0}]}
    sgd = {"param_groups": [{"params": [0], "lr": 1, "momentum": 0, "dampening": 0, "nesterov": 0,
                             "weight_decay": 0}]}
    assert optimizer_mismatch(adam, sgd) == (
        "its optimizer state is another optimizer's: it has amsgrad, betas, eps where this run's optimizer has "
        "dampening, momentum, nesterov; resume with the optimizer_type it was trained with, or use another model_dir")
    more = {"param_groups": [{"params": [0], "lr": 1, "a": 1, "b": 1, "c": 1, "d": 1}]}
    assert "it has a, b, c and 1 more where" in optimizer_mismatch(more, sgd)
    older = {"param_groups": [{"params": [0], "lr": 1, "momentum": 0}]}  # settings only ours: a newer torch's
    assert optimizer_mismatch(older, sgd) is None and optimizer_mismatch(sgd, older) is None
    for saved in (None, {}, {"param_groups": []}, {"param_groups": [1]}, {"param_groups": {"lr": 1}},
                  {"param_groups": ({"params": [0], "lr": 1, "betas": 1},)}):
        assert optimizer_mismatch(saved, sgd) is None
    two = {"param_groups": [{"params": [0], "lr": 1}, {"params": [1], "betas": 1}]}
    assert "it has betas where" in optimizer_mismatch(two, sgd)


def test_the_rng_states_come_back_as_they_were(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn()  # numpy keeps the second Gaussian of a pair: the state holds it
    random.gauss(0, 1)
    state = rng_state()
    assert state["numpy"]["has_gauss"] == 1 and state["python"]["gauss_next"] is not None

    def draws():
        return (torch.rand(3).tolist(), np.random.randn(3).tolist(), np.random.rand(2).tolist(), random.random(),
                random.gauss(0, 1))

    expected = draws()
    draws()
    set_rng_state(state)
    assert draws() == expected
    torch.save(state, tmp_path / "rng")  # through a file read as a checkpoint is: tensors and plain values only
    draws()
    set_rng_state(torch.load(tmp_path / "rng", weights_only=True))
    assert draws() == expected


def test_the_cuda_rng_states_are_saved_and_restored_when_cuda_runs(monkeypatch):
    """Without a GPU here: torch.cuda's answers stood in for, the states passed through as they are."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu 0 state"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = rng_state()
    assert state["cuda"] == ["gpu 0 state"]
    set_rng_state(state)
    assert restored == [["gpu 0 state"]]
    del state["cuda"]  # a checkpoint of a CPU run resumed on a GPU: the GPU's RNG as it is
    set_rng_state(state)
    assert restored == [["gpu 0 state"]]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert "cuda" not in rng_state()
