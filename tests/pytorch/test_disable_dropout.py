"""``runconfig.disable_dropout: true``: every dropout of a PyTorch model at rate 0, even one its code fixes, so
that the CPU and the emulator (which draw their masks from generators of their own) train alike from the first
step; a rate the switch cannot reach is one line naming the user's source line, on either."""

import argparse
import inspect

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common.errors import UserError
from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.dropout_off import switch_off
from common.pytorch.runner import FrameworkSteps, Runner
from tests.pytorch.recording import recording


class HFLikeAttention(torch.nn.Module):
    """As Hugging Face's attention modules: the rate kept as a float, handed to SDPA in forward."""

    def __init__(self):
        super().__init__()
        self.attention_dropout = 0.1
        self.is_causal = True


def test_switch_off_reaches_dropout_modules_attention_and_float_rates():
    model = torch.nn.ModuleDict({
        "drop": torch.nn.Dropout(0.3), "drop2d": torch.nn.Dropout2d(0.2), "alpha": torch.nn.AlphaDropout(0.1),
        "mha": torch.nn.MultiheadAttention(8, 2, dropout=0.1, batch_first=True),
        "layer": torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.1, batch_first=True),
        "hf": HFLikeAttention(), "off": torch.nn.Dropout(0.0)})
    changed = switch_off(model)
    assert changed == ["drop", "drop2d", "alpha", "mha.dropout", "layer.self_attn.dropout", "layer.dropout",
                       "layer.dropout1", "layer.dropout2", "hf.attention_dropout"]
    rates = [m.p for m in model.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    assert rates == [0.0] * 7 and model["mha"].dropout == 0.0 and model["hf"].attention_dropout == 0.0
    assert model["hf"].is_causal is True  # a bool is not a rate
    assert switch_off(model) == []


WIDTH = 6


class FixedDropout(torch.nn.Module):
    """A rate its code fixes, as a config cannot reach it (the vendor's token classifier's encoder)."""

    def __init__(self, functional=False):
        super().__init__()
        self.functional = functional
        self.hidden = torch.nn.Linear(WIDTH, 16)
        self.drop = torch.nn.Dropout(0.5)
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        h = torch.relu(self.hidden(x))
        h = F.dropout(h, 0.25, self.training) if self.functional else self.drop(h)  # FUNCTIONAL
        return self.out(h).squeeze(-1)


class Model(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, FixedDropout(params["model"]["functional"]), device)

    def __call__(self, batch):
        x, y = batch
        return F.mse_loss(self.model(x), y)


def loader(params):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, WIDTH, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(-1)), batch_size=8, shuffle=True)


def train(model_dir, device, disable_dropout, functional=False):
    params = load_params(None, {"model": {"functional": functional},
                                "optimizer": {"optimizer_type": "adam", "learning_rate": 0.01},
                                "runconfig": {"model_dir": str(model_dir), "max_steps": 4, "log_steps": 4,
                                              "checkpoint_steps": 4, "seed": 1, "disable_dropout": disable_dropout}})
    backend = recording(EmulatorSteps if device == "emulator" else FrameworkSteps)
    runner = Runner(argparse.Namespace(mode="train", device=device, checkpoint_path=None), params, Model, loader,
                    loader, backend)
    runner.execute()
    return runner.steps.losses


def test_with_dropout_fixed_in_code_the_cpu_and_the_emulator_train_alike_once_it_is_disabled(tmp_path, caplog):
    caplog.set_level("INFO", logger="zoo")
    cpu = train(tmp_path / "cpu", "cpu", True)
    assert "runconfig.disable_dropout: 1 dropout rate set to 0 (drop)" in caplog.text
    emulated = train(tmp_path / "emulated", "emulator", True)
    assert len(cpu) == 4 and emulated == pytest.approx(cpu, abs=1e-5)
    dropped = train(tmp_path / "dropped", "cpu", False)
    assert abs(dropped[0] - cpu[0]) > 1e-3  # the switch is what makes them alike


FUNCTIONAL_LINE = next(i for i, line in enumerate(inspect.getsource(inspect.getmodule(FixedDropout)).splitlines(), 1)
                       if line.endswith("# FUNCTIONAL"))


@pytest.mark.parametrize("device", ["cpu", "emulator"])
def test_a_rate_written_into_the_code_is_refused_naming_its_line(tmp_path, device):
    with pytest.raises(UserError) as error:
        train(tmp_path / device, device, True, functional=True)
    assert str(error.value).startswith(f"{__file__}:{FUNCTIONAL_LINE}: ")
    assert "drops at rate 0.25 with runconfig.disable_dropout: true, a rate written into the code" in str(error.value)


def test_without_the_switch_a_functional_rate_trains_as_written(tmp_path):
    assert len(train(tmp_path / "cpu", "cpu", False, functional=True)) == 4
