"""A model's own 16-bit values in a float32 run (``.half()``, as the vendor's BERT and GPT-2 return their loss):
every op whose output torch holds in float16 rounds it to float16 on the emulator too, forward and backward,
so the emulator's losses are torch's, not the float32 sums before the last rounding."""

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.runner import FrameworkSteps, Runner
from tests.pytorch.recording import recording


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = torch.nn.Linear(6, 8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        h = torch.tanh(self.hidden(x))
        h = (h.half() * 3 + 0.1).float()  # a 16-bit stretch inside the forward, back to float32
        return self.out(h).squeeze(-1)


class Model(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, Net(), device)

    def __call__(self, batch):
        x, y = batch
        prediction = self.model(x)
        total = F.mse_loss(prediction, y).half()  # the vendor's pattern: the loss in float16, a second term added
        total += (prediction.mean() * 0.37).half()
        return total


def loader(params):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(32, 6, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(-1) * 3.3), batch_size=8)


def train(model_dir, device):
    params = load_params(None, {"optimizer": {"optimizer_type": "sgd", "learning_rate": 0.01},
                                "runconfig": {"model_dir": str(model_dir), "max_steps": 4, "log_steps": 4,
                                              "checkpoint_steps": 4, "seed": 1}})
    runner = Runner(argparse.Namespace(mode="train", device=device, checkpoint_path=None), params, Model, loader,
                    loader, recording(EmulatorSteps if device == "emulator" else FrameworkSteps))
    runner.execute()
    return runner.steps.losses


def test_the_emulators_float16_losses_are_torchs_float16_losses(tmp_path):
    cpu = train(tmp_path / "cpu", "cpu")
    emulated = train(tmp_path / "emulator", "emulator")
    assert len(cpu) == 4
    assert all(np.float16(loss) == loss for loss in emulated)  # each a float16 value, as torch's
    assert emulated == cpu
