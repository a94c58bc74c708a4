"""Bad input to pytorch/mnist's run.py: one error line, a non-zero exit, nothing in model_dir overwritten."""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.data import write_fake_mnist
from common.folder import load_run_module

ROOT = Path(__file__).resolve().parents[2]
MNIST = str(ROOT / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")


@pytest.fixture
def data_dir(tmp_path):
    folder = tmp_path / "data"
    write_fake_mnist(folder, n_train=64, n_test=32, seed=0)
    return folder


@pytest.fixture
def model_dir(tmp_path, data_dir):
    """A model_dir that a good run already filled: checkpoints, params, summaries."""
    folder = tmp_path / "model_dir"
    main(["--params", TINY, "--model_dir", str(folder), f"train_input.data_dir={data_dir}"])
    return folder


def main(argv):
    return load_run_module(MNIST).main(argv)


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def expect_one_error_line(capsys, argv, model_dir: Path, *fragments: str) -> str:
    before = snapshot(model_dir)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    error_lines = [line for line in err.splitlines() if "error:" in line]
    assert len(error_lines) == 1 and err.strip().splitlines()[-1] == error_lines[0]
    for fragment in fragments:
        assert fragment in error_lines[0]
    assert snapshot(model_dir) == before, "model_dir changed"
    return error_lines[0]


def argv_for(model_dir, data_dir, *extra, params=TINY):
    return ["--params", str(params), "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}",
            f"eval_input.data_dir={data_dir}", "runconfig.max_steps=8", *extra]


def test_malformed_yaml(tmp_path, capsys, model_dir, data_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  hidden_sizes: [32, 16\n  dropout: 0.1\n")
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, params=bad), model_dir, str(bad), "malformed YAML")


def test_unknown_key(tmp_path, capsys, model_dir, data_dir):
    bad = tmp_path / "typo.yaml"
    bad.write_text("model:\n  hidden_sizes: [8]\n  hiden_size: 3\n")
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, params=bad), model_dir,
                          f"{bad}:3", "unknown key 'model.hiden_size'", "did you mean")


def test_mistyped_value(tmp_path, capsys, model_dir, data_dir):
    bad = tmp_path / "type.yaml"
    bad.write_text("model:\n  dropout: high\n")
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, params=bad), model_dir,
                          f"{bad}:2", "'model.dropout' must be a number")


def test_missing_params_file(tmp_path, capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, params=tmp_path / "nope.yaml"), model_dir,
                          "nope.yaml: params file not found")


def test_mnist_asked_for_with_a_data_dir_that_does_not_exist(tmp_path, capsys, model_dir):
    missing = tmp_path / "no_such_dir"
    expect_one_error_line(capsys, argv_for(model_dir, missing, "train_input.dataset=mnist"), model_dir,
                          f"data_dir {missing} does not exist")


def test_truncated_idx(tmp_path, capsys, model_dir):
    broken = tmp_path / "truncated"
    write_fake_mnist(broken, n_train=64, n_test=32, seed=0)
    images = broken / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(images.read_bytes()[:5000])
    expect_one_error_line(capsys, argv_for(model_dir, broken), model_dir, str(images), "truncated IDX")


def test_wrong_magic_idx(tmp_path, capsys, model_dir):
    broken = tmp_path / "magic"
    write_fake_mnist(broken, n_train=64, n_test=32, seed=0)
    labels = broken / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    labels.write_bytes(b"\x12\x34\x56\x78" + labels.read_bytes()[4:])
    expect_one_error_line(capsys, argv_for(model_dir, broken), model_dir, str(labels), "magic 0x12345678")


def test_checkpoint_path_missing(tmp_path, capsys, model_dir, data_dir):
    missing = tmp_path / "checkpoint_9.mdl"
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--checkpoint_path", str(missing)), model_dir,
                          f"{missing}: checkpoint not found")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_checkpoint_path_corrupt(tmp_path, capsys, model_dir, data_dir, mode):
    corrupt = tmp_path / "checkpoint_3.mdl"
    corrupt.write_bytes((model_dir / "checkpoint_4.mdl").read_bytes()[:1000])  # a cut-off zip
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--mode", mode, "--checkpoint_path", str(corrupt)),
                          model_dir, f"{corrupt}: not a readable checkpoint")


class NotWeights:
    """An object a safe (weights-only) load refuses to unpickle."""


def test_checkpoint_with_arbitrary_objects_is_refused(tmp_path, capsys, model_dir, data_dir):
    unsafe = tmp_path / "checkpoint_5.mdl"
    torch.save({"model": NotWeights()}, unsafe)
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--mode", "eval", "--checkpoint_path", str(unsafe)),
                          model_dir, f"{unsafe}: not a readable checkpoint (it holds Python objects beyond tensors")


def test_checkpoint_of_another_model(tmp_path, capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "model.hidden_sizes=[7]", "--mode", "eval"),
                          model_dir, "checkpoint_4.mdl: does not fit this model")


def test_no_readable_checkpoint_in_model_dir(capsys, model_dir, data_dir):
    """Every checkpoint damaged: an error naming them, not a silent start from step 0 over them
    (one damaged newest one falls back: tests/pytorch/test_pt_checkpoint_fallback.py)."""
    for name in ("checkpoint_2.mdl", "checkpoint_4.mdl"):
        (model_dir / name).write_bytes(b"garbage")
    expect_one_error_line(capsys, argv_for(model_dir, data_dir), model_dir,
                          "none of its 2 checkpoints reads (checkpoint_4.mdl, checkpoint_2.mdl",
                          f"{model_dir / 'checkpoint_4.mdl'}: not a readable checkpoint")


def test_invalid_mode(capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--mode", "fit"), model_dir, "--mode",
                          "invalid choice: 'fit'")


def test_validate_only_with_compile_only(capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--validate_only", "--compile_only"), model_dir,
                          "not allowed with argument")


def test_bad_schedule(capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "optimizer.learning_rate={scheduler: Cosine}"),
                          model_dir, "optimizer.learning_rate: scheduler Cosine needs")


def test_log_steps_zero(capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "runconfig.log_steps=0"), model_dir,
                          "command line 'runconfig.log_steps=0': 'runconfig.log_steps' must be at least 1, got 0")


@pytest.mark.parametrize("dtype, fragment", [("float16", "float16 needs --device gpu"),
                                             ("cb16", "cb16 exists on the device only")])
def test_mixed_precision_dtype_the_cpu_lacks(capsys, model_dir, data_dir, dtype, fragment):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "mixed_precision.enabled=true",
                                           f"mixed_precision.dtype={dtype}"), model_dir, fragment)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_without_cuda(capsys, model_dir, data_dir):
    expect_one_error_line(capsys, argv_for(model_dir, data_dir, "--device", "gpu"), model_dir,
                          "--device gpu: no CUDA device")


def test_eval_with_no_checkpoint(tmp_path, capsys, data_dir):
    empty = tmp_path / "empty"
    empty.mkdir()
    expect_one_error_line(capsys, argv_for(empty, data_dir, "--mode", "eval"), empty, "no checkpoint to eval")
    assert not list(empty.iterdir())


def test_the_real_entry_point(tmp_path, data_dir):
    """`python pytorch/mnist/run.py` from another folder: trains; bad input exits 2 with one line."""
    model_dir = tmp_path / "md"
    cmd = [sys.executable, os.path.join(MNIST, "run.py"), "--params", TINY, "--model_dir", str(model_dir),
           f"train_input.data_dir={data_dir}"]
    good = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    assert "| Train Device=cpu Step=4 Loss=" in good.stderr
    assert (model_dir / "checkpoint_4.mdl").is_file() and (model_dir / "params_train.yaml").is_file()

    bad = subprocess.run([*cmd, "model.dropout=2"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == ("error: command line 'model.dropout=2': 'model.dropout' must be "
                                                     "in [0, 1), got 2.0")
    assert "Traceback" not in bad.stderr


# run.py as `python pytorch/mnist/run.py ...` runs it, reporting its exit status and whether torch was imported
RUN_AS_MAIN = ("import runpy, sys\n"
               "sys.argv = sys.argv[1:]\n"
               "try:\n"
               "    runpy.run_path(sys.argv[0], run_name='__main__')\n"
               "except SystemExit as e:\n"
               "    print(e.code, 'torch' in sys.modules)\n")


def test_a_misspelt_mode_is_refused_before_torch_loads(tmp_path):
    done = subprocess.run([sys.executable, "-c", RUN_AS_MAIN, os.path.join(MNIST, "run.py"), "--mode", "trian",
                           "--run_name", "x", "model.dropout=0"],  # an unknown flag is left to the whole parser
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.stdout == "2 False\n", done.stderr
    assert done.stderr == ("mnist/run.py: error: argument -m/--mode: invalid choice: 'trian' (choose from 'train', "
                           "'eval', 'eval_all', 'train_and_eval', 'predict') (see --help)\n")
