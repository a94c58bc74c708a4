"""Dynamic loss scaling across a resume, through pytorch/mnist's run.py: the scale and the
count of finite steps towards its next doubling (GradScaler's growth tracker, the
emulator's good steps) come back from the checkpoint, on the CPU and on the emulator."""

import os
from pathlib import Path

import pytest

from common.data import write_fake_mnist
from common.folder import load_run_module
from common.pytorch.checkpoint import load_checkpoint
from common.summaries import read_scalars

MNIST = str(Path(__file__).resolve().parents[2] / "pytorch" / "mnist")
TINY = os.path.join(MNIST, "configs", "params_tiny.yaml")
# the scale doubles after every 2 finite steps: 8 -> 16 at step 2 -> 32 at step 4; a resume
# at step 3 lands between two doublings, with one finite step counted
DYNAMIC = ("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic", "optimizer.initial_loss_scale=8.0",
           "optimizer.steps_per_increase=2", "runconfig.checkpoint_steps=1", "runconfig.keep_checkpoint_max=0",
           "runconfig.log_steps=1", "model.dropout=0.0")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=200, n_test=64, seed=0)
    return str(folder)


def run_mnist(model_dir, data_dir, *extra):
    argv = ["--params", TINY, "--model_dir", str(model_dir), f"train_input.data_dir={data_dir}",
            f"eval_input.data_dir={data_dir}", *DYNAMIC, *extra]
    return load_run_module(MNIST).main(argv)


@pytest.mark.parametrize("device", [["mixed_precision.dtype=bfloat16"],
                                    ["--device", "emulator", "mixed_precision.dtype=float16"]],
                         ids=["cpu", "emulator"])
def test_a_resumed_run_continues_the_dynamic_loss_scale(tmp_path, data_dir, device):
    once, twice = tmp_path / "once", tmp_path / "twice"
    run_mnist(once, data_dir, "runconfig.max_steps=4", *device)
    run_mnist(twice, data_dir, "runconfig.max_steps=3", *device)
    assert load_checkpoint(str(twice / "checkpoint_3.mdl"))["scaler"]["_growth_tracker"] == 1
    run_mnist(twice, data_dir, "runconfig.max_steps=4", *device)
    whole, resumed = (load_checkpoint(str(d / "checkpoint_4.mdl"))["scaler"] for d in (once, twice))
    assert (whole["scale"], whole["_growth_tracker"]) == (32.0, 0)
    assert (resumed["scale"], resumed["_growth_tracker"]) == (32.0, 0)
    scales = {d: [v for _, v in read_scalars(str(d / "train"))["loss_scale"]] for d in (once, twice)}
    assert scales[twice] == scales[once]  # the resumed run's log continues the one of steps 1-3
