"""The PyTorch runner on the device: --validate_only, --compile_only, --device emulator.

The loss checks run pytorch/mnist's default model (784-500-300-10, Adam, batch 256) with
dropout off on generated digits, at learning rate 1e-4 so that the loss stays far from 0
for all 50 steps (a relative difference of losses near 0 says nothing). At the default
1e-3 the two agree as closely for the first steps, and then drift apart by more than 1e-4:
Adam scales every gradient to about the learning rate, so a gradient near its epsilon
that the two compute with a different rounding gives a visibly different update.
"""

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common.data import write_fake_mnist
from common.folder import import_beside, load_run_module
from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.checkpoint import list_checkpoints, load_checkpoint
from common.pytorch.device_run import emulator_optimizer_state, load_torch_optimizer_state
from common.pytorch.run import run
from common.summaries import read_scalars

ROOT = Path(__file__).resolve().parents[2]
MNIST = str(ROOT / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")
model, data, utils = import_beside(os.path.join(MNIST, "run.py"), "model", "data", "utils")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=1024, n_test=256, seed=0)  # 4 batches of 256 per epoch
    return str(folder)


def mnist(model_dir, data_dir, *extra, params=None):
    argv = ["--model_dir", str(model_dir), f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}",
            *extra]
    if params:
        argv += ["--params", params]
    return load_run_module(MNIST).main(argv)


def train_50(model_dir, data_dir, *extra):
    """50 steps of the default mnist model, a log line and a checkpoint every 25; the losses."""
    mnist(model_dir, data_dir, "model.dropout=0.0", "optimizer.learning_rate=0.0001", "runconfig.max_steps=50",
          "runconfig.log_steps=1", "runconfig.checkpoint_steps=25", "runconfig.keep_checkpoint_max=0", *extra)
    return np.array([v for _, v in read_scalars(str(Path(model_dir) / "train"))["loss"]])


def relative(a, b):
    return np.abs(np.asarray(a) - np.asarray(b)) / np.abs(np.asarray(b))


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("cpu")
    return folder, train_50(folder, data_dir)


@pytest.fixture(scope="module")
def emulator_run(tmp_path_factory, data_dir):
    folder = tmp_path_factory.mktemp("emulator")
    return folder, train_50(folder, data_dir, "--device", "emulator")


def test_fp32_losses_match_the_cpu_for_50_steps(cpu_run, emulator_run):
    (_, cpu), (emulator_dir, emulator) = cpu_run, emulator_run
    assert len(cpu) == len(emulator) == 50
    assert cpu[-1] < 0.5 * cpu[0]  # it learns
    assert relative(emulator, cpu).max() < 1e-4
    assert [step for step, _ in list_checkpoints(emulator_dir)] == [25, 50]


@pytest.mark.parametrize("dtype, reference", [("bfloat16", "cpu bfloat16"), ("float16", "cpu float32"),
                                              ("cb16", "cpu float32")])
def test_mixed_precision_losses_within_2e_2(tmp_path, data_dir, cpu_run, emulator_run, dtype, reference):
    mixed = ["mixed_precision.enabled=true", f"mixed_precision.dtype={dtype}"]
    if dtype == "float16":
        mixed.append("optimizer.loss_scaling_factor=dynamic")
    emulator = train_50(tmp_path / "emulator", data_dir, "--device", "emulator", *mixed)
    # bfloat16 against the CPU's bfloat16 autocast; the CPU has no float16 or cb16 to compare with
    cpu = train_50(tmp_path / "cpu", data_dir, *mixed) if reference == "cpu bfloat16" else cpu_run[1]
    assert relative(emulator, cpu).max() < 2e-2
    # and it is 16-bit training: fp32 on the emulator is within 1e-4 of the CPU (above), and
    # identical to these losses if mixed precision were off anywhere between params and
    # kernels; 16-bit rounding moves them by 3e-4 (float16, cb16) to 3e-3 (bfloat16)
    assert relative(emulator, emulator_run[1]).max() > 1e-4
    if reference == "cpu bfloat16":
        assert relative(cpu, cpu_run[1]).max() > 1e-4  # the CPU side ran its autocast, too
    if dtype == "float16":
        scales = read_scalars(str(tmp_path / "emulator" / "train"))["loss_scale"]
        assert len(scales) == 50 and all(v >= 1.0 for _, v in scales)
        assert load_checkpoint(str(tmp_path / "emulator" / "checkpoint_50.mdl"))["scaler"]["scale"] == scales[-1][1]


def test_emulator_checkpoint_evaluates_and_resumes_on_the_cpu(tmp_path, data_dir, emulator_run):
    emulator_dir, emulator = emulator_run
    on_emulator = mnist(emulator_dir, data_dir, "--mode", "eval", "--device", "emulator", "model.dropout=0.0")
    on_cpu = mnist(emulator_dir, data_dir, "--mode", "eval", "model.dropout=0.0")
    assert on_cpu["accuracy"] == on_emulator["accuracy"]
    assert on_cpu["loss"] == pytest.approx(on_emulator["loss"], rel=1e-5)
    # the CPU continues from the emulator's step 25 (weights and Adam's moments) as the emulator did
    resumed = train_50(tmp_path / "cpu", data_dir, "--checkpoint_path", str(emulator_dir / "checkpoint_25.mdl"))
    assert len(resumed) == 25
    assert relative(resumed, emulator[25:]).max() < 1e-4


def test_cpu_checkpoint_resumes_on_the_emulator(tmp_path, data_dir, cpu_run):
    cpu_dir, cpu = cpu_run
    resumed = train_50(tmp_path / "emulator", data_dir, "--device", "emulator",
                       "--checkpoint_path", str(cpu_dir / "checkpoint_25.mdl"))
    assert len(resumed) == 25
    assert relative(resumed, cpu[25:]).max() < 1e-4
    state = load_checkpoint(str(tmp_path / "emulator" / "checkpoint_50.mdl"))
    assert state["global_step"] == 50 and state["lr_scheduler"]["last_epoch"] == 50
    assert all(float(s["step"]) == 50 for s in state["optimizer"]["state"].values())


def test_optimizer_state_round_trip_between_torch_and_the_emulator_format():
    params = load_params(TINY, utils.default_params(), ["optimizer.optimizer_type=momentum"])
    first = model.model_fn(params, torch.device("cpu"))
    batch = (torch.randn(4, 1, 28, 28), torch.tensor([1, 2, 3, 4]))
    first.train_step(batch)
    state = emulator_optimizer_state(first, "momentum")
    assert set(state["layers.1.weight"]) == {"momentum"}
    second = model.model_fn(params, torch.device("cpu"))
    load_torch_optimizer_state(second, state, "momentum")
    for a, b in zip(first.optimizer.state_dict()["state"].values(), second.optimizer.state_dict()["state"].values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])


def test_eval_all_and_predict_on_the_emulator(tmp_path, data_dir):
    mnist(tmp_path, data_dir, "--device", "emulator", "model.dropout=0.2", params=TINY)  # dropout in training
    results = mnist(tmp_path, data_dir, "--mode", "eval_all", "--device", "emulator", "model.dropout=0.2",
                    params=TINY)
    assert list(results) == [2, 4]
    path = mnist(tmp_path, data_dir, "--mode", "predict", "--device", "emulator", "model.dropout=0.2", params=TINY)
    with np.load(path) as predictions:
        assert predictions["logits"].shape == (256, 10)


def test_validate_only_prints_the_report_and_writes_nothing(tmp_path, data_dir, capsys):
    report = mnist(tmp_path / "md", data_dir, "--validate_only", params=TINY)
    assert report.ok
    out = capsys.readouterr().out
    assert out.startswith("validation passed") and "kernels matched" in out
    assert not (tmp_path / "md").exists()


def test_compile_only_writes_the_report_in_model_dir_compile(tmp_path, data_dir, capsys):
    mnist(tmp_path, data_dir, "--compile_only", "mixed_precision.enabled=true", params=TINY)
    assert sorted(os.listdir(tmp_path)) == ["compile"]
    assert sorted(os.listdir(tmp_path / "compile")) == ["ir.json", "placement.svg", "report.json", "report.txt"]
    out = capsys.readouterr().out
    assert "Estimated overall performance" in out and "model.py" in out  # kernels point at the user's lines


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("extra, message", [
    (["--mode", "train_and_eval", "--device", "emulator"], "train_and_eval is not allowed on the device"),
    (["--device", "emulator", "device.profile=wse9"], "wse9"),
    (["--validate_only", "device.profile=wse9"], "wse9"),
    (["--validate_only", "--device", "gpu"], "--device gpu does not go with"),
    # 1,024 generated digits in batches of 96: the last batch of an epoch is smaller
    (["--validate_only", "train_input.drop_last=false", "train_input.batch_size=96"], "drop_last=True"),
    (["--device", "emulator", "train_input.drop_last=false", "train_input.batch_size=96"], "drop_last=True"),
    (["--compile_only", "model.hidden_sizes=[4096, 4096]", "device.profile=tiny"],
     "the largest kernel 'dense_1'"),
])
def test_device_bad_input_one_message_nothing_overwritten(tmp_path, data_dir, capsys, extra, message):
    """Each a clear error, exit 2, no traceback, model_dir untouched: train_and_eval on the device,
    an unknown profile, a batch dimension that changes, a model too large to lay out whole."""
    mnist(tmp_path, data_dir, params=TINY)  # a model_dir with a CPU run in it
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        mnist(tmp_path, data_dir, *extra, params=TINY)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and message in err
    assert [line for line in err.splitlines() if "error:" in line][0].startswith("error: ")
    assert snapshot(tmp_path) == before


def test_too_large_for_pipelined_says_how_much_and_compiles_with_weight_streaming(tmp_path, data_dir, capsys):
    big = ["--compile_only", "model.hidden_sizes=[4096, 4096]", "device.profile=tiny"]
    with pytest.raises(SystemExit):
        mnist(tmp_path / "a", data_dir, *big, params=TINY)
    err = capsys.readouterr().err
    assert "needs 268,582,912 bytes" in err and "50,331,648 bytes (48.0 MiB) are available" in err
    assert "device.execution_mode=weight_streaming" in err and "pytorch/mnist/model.py:" in err
    mnist(tmp_path / "b", data_dir, *big, "device.execution_mode=weight_streaming", params=TINY)
    assert (tmp_path / "b" / "compile" / "report.txt").read_text().count("weight_streaming") >= 1


class Sorting(PyTorchBaseModel):
    """A model with two ops the device lacks (sort, cumprod), for the validation report."""

    def __init__(self, params, device):
        super().__init__(params, torch.nn.Linear(4, 3), device)

    def __call__(self, batch):
        features, labels = batch
        hidden = torch.sort(features, dim=-1).values  # unsupported
        hidden = torch.cumprod(hidden, dim=-1)  # unsupported
        return F.cross_entropy(self.model(hidden), labels)


def sorting_data(params):
    dataset = TensorDataset(torch.randn(16, 4), torch.arange(16) % 3)
    return DataLoader(dataset, batch_size=8, drop_last=True)


def test_validate_only_reports_every_unsupported_op_with_its_line(tmp_path, capsys):
    params_file = tmp_path / "params.yaml"
    params_file.write_text("runconfig:\n  max_steps: 2\n")
    argv = ["--params", str(params_file), "--model_dir", str(tmp_path / "md"), "--validate_only"]
    with pytest.raises(SystemExit) as exit_info:
        run(lambda params, device: Sorting(params, device), sorting_data, sorting_data, dict, argv=argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: validation failed: 2 error(s)" in err
    lines = {line for line in err.splitlines() if __file__ in line}
    assert any("sort" in line for line in lines) and any("cumprod" in line for line in lines)
    assert not (tmp_path / "md").exists()
