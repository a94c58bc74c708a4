"""Damaged and mismatched .mdl checkpoints in pytorch/mnist's model_dir, on the CPU and the emulator.

A damaged newest checkpoint falls back to the newest that reads, with a warning naming the
bad file; none readable is an error naming them (never a silent start from step 0); an
explicit --checkpoint_path that does not read stays an error (tests/pytorch/test_pt_bad_input.py).
A checkpoint of another model says what differs, on one line cut at no word.
"""

import hashlib
import os
from pathlib import Path

import pytest

from common.data import write_fake_mnist
from common.folder import load_run_module

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
