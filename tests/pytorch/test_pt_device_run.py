"""common/pytorch/device_run.py's pieces on a small model: the optimizer's state between torch
and the emulator, the model built for a compile without its weights, the batch dimension a
partial last batch makes dynamic, and the one-line refusals."""

import argparse
import logging

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from common.errors import UserError
from common.params import load_params
from common.pytorch import device_run
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.metrics import Accuracy

FEATURES, CLASSES = 5, 3


class Tied(torch.nn.Module):
    """Two layers, the second's weight the first's (transposed use): one parameter, shared."""

    def __init__(self):
        super().__init__()
        self.encode = torch.nn.Linear(FEATURES, CLASSES)
        self.decode = torch.nn.Linear(CLASSES, FEATURES, bias=False)
        self.decode.weight = torch.nn.Parameter(self.encode.weight.t().contiguous())
        self.head = torch.nn.Linear(FEATURES, CLASSES)
        self.head.weight = self.encode.weight  # tied

    def forward(self, x):
        return self.head(self.decode(self.encode(x)))


class Model(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, Tied(), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}

    def __call__(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits, y), {"logits": logits}


def params_of(optimizer="adam", **extra):
    return load_params(None, {"optimizer": {"optimizer_type": optimizer, "learning_rate": 0.01, **extra},
                              "runconfig": {"max_steps": 2}})


def batch(n=4):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, FEATURES, generator=generator), torch.arange(n) % CLASSES


def test_a_fresh_optimizer_has_no_state_for_the_emulator():
    assert device_run.emulator_optimizer_state(Model(params_of(), "cpu"), "adam") is None


@pytest.mark.parametrize("kind, slots", [("adam", {"m": "exp_avg", "v": "exp_avg_sq"}),
                                         ("adamw", {"m": "exp_avg", "v": "exp_avg_sq"}),
                                         ("momentum", {"momentum": "momentum_buffer"})])
def test_the_optimizer_state_goes_to_the_emulator_and_back_whole(kind, slots):
    first = Model(params_of(kind), "cpu")
    for _ in range(3):
        first.train_step(batch())
    state = device_run.emulator_optimizer_state(first, kind)
    names = [name for name, _ in first.model.named_parameters()]  # the tied weight once
    assert sorted(k for k in state if k != "step") == sorted(names) and state["step"] == (3 if kind != "momentum"
                                                                                          else 0)
    torch_state = first.optimizer.state
    for name, p in first.model.named_parameters():
        assert sorted(state[name]) == sorted(slots)
        for slot, key in slots.items():
            np.testing.assert_array_equal(state[name][slot], torch_state[p][key].numpy())
    second = Model(params_of(kind), "cpu")
    device_run.load_torch_optimizer_state(second, state, kind)
    theirs, ours = first.optimizer.state_dict(), second.optimizer.state_dict()
    assert theirs["param_groups"] == ours["param_groups"] and sorted(theirs["state"]) == sorted(ours["state"])
    for index, entry in theirs["state"].items():
        assert sorted(entry) == sorted(ours["state"][index])
        for key, value in entry.items():
            assert torch.equal(torch.as_tensor(value, dtype=torch.float32),
                               torch.as_tensor(ours["state"][index][key], dtype=torch.float32)), (index, key)


def test_the_dynamic_loss_scale_and_its_good_steps_go_to_the_emulator_and_back():
    params = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01,
                                              "loss_scaling_factor": "dynamic", "initial_loss_scale": 256,
                                              "steps_per_increase": 10},
                                "mixed_precision": {"enabled": True, "dtype": "bfloat16"},
                                "runconfig": {"max_steps": 2}})
    first = Model(params, "cpu")
    for _ in range(3):
        first.train_step(batch())
    state = device_run.emulator_optimizer_state(first, "adam")
    assert (state["loss_scale"], state["loss_scale_good_steps"]) == (256.0, 3)
    second = Model(params, "cpu")
    device_run.load_torch_optimizer_state(second, {**state, "loss_scale": 64.0, "loss_scale_good_steps": 2}, "adam")
    assert second.scaler.get_scale() == 64.0 and second.scaler.state_dict()["_growth_tracker"] == 2
    third = Model(params, "cpu")
    device_run.load_torch_optimizer_state(third, {"step": 0}, "adam")  # no scale in the state: the scaler as it was
    assert third.scaler.get_scale() == 256.0 and third.optimizer.state_dict()["state"] == {}


def test_a_model_too_large_for_this_machine_is_built_of_stand_ins_sharing_one_zero(caplog):
    params = params_of()
    real = device_run.model_for_capture(Model, params, memory=2**40)
    assert real.model.encode.weight.abs().sum() > 0  # enough memory: the model itself
    with caplog.at_level(logging.INFO, logger="zoo"):
        small = device_run.model_for_capture(Model, params, memory=200)
    weights = list(small.model.parameters())
    assert len(weights) == len(list(real.model.parameters())) == 4  # the tied weight once
    assert small.model.head.weight is small.model.encode.weight
    for p in weights:
        assert p.device.type == "cpu" and not p.any() and p.stride() == (0,) * p.dim() and p.requires_grad
    assert [p.shape for p in weights] == [p.shape for p in real.model.parameters()]
    assert {id(p) for group in small.optimizer.param_groups for p in group["params"]} == {id(p) for p in weights}
    assert list(small.metrics) == ["accuracy"]
    needed = sum(p.numel() * 4 for p in weights)
    assert [r.getMessage() for r in caplog.records if r.name == "zoo"][-1] == (
        f"the model's {needed / 2**30:.1f} GiB of weights exceed half of the {200 / 2**30:.1f} GiB this machine has "
        f"available: built without them (shapes only) for the compile")
    assert device_run.model_for_capture(Model, params, memory=2 * needed).model.encode.weight.any()  # half: fits


def test_a_model_that_cannot_be_built_without_its_weights_is_built_on_the_cpu_and_one_with_buffers_is_refused():
    built_on = []

    def needs_values(params, device):
        built_on.append(torch.device(device).type)
        if torch.device(device).type == "meta":
            raise RuntimeError("loads a checkpoint")
        return Model(params, device)

    assert isinstance(device_run.model_for_capture(needs_values, params_of(), memory=200), Model)
    assert built_on == ["meta", "cpu"]

    def refuses(params, device):
        raise UserError("a bad key")

    with pytest.raises(UserError, match="a bad key"):
        device_run.model_for_capture(refuses, params_of(), memory=200)

    class Normed(Model):
        def __init__(self, params, device):
            super().__init__(params, device)
            self.model.norm = torch.nn.BatchNorm1d(CLASSES)

    with pytest.raises(UserError) as error:
        device_run.model_for_capture(Normed, params_of(), memory=200)
    needed = sum(p.numel() * 4 for p in Normed(params_of(), "cpu").model.parameters())
    assert str(error.value) == (
        f"the model's weights need {needed / 2**30:.1f} GiB, more than half of the {200 / 2**30:.1f} GiB this "
        f"machine has available, and built without them (torch's meta device) its buffer 'norm.running_mean' "
        f"would have no value; compile it on a machine with {2 * needed / 2**30:.0f} GiB")


def test_the_memory_available_is_read_from_meminfo():
    with open("/proc/meminfo") as f:
        line = next(line for line in f if line.startswith("MemAvailable:"))
    assert abs(device_run.available_memory() - int(line.split()[1]) * 1024) < 2**30  # it moves a little


class Stream(IterableDataset):
    def __iter__(self):
        return iter(zip(*batch(6)))


@pytest.mark.parametrize("loader, dynamic", [
    (DataLoader(TensorDataset(*batch(8)), batch_size=4), False),
    (DataLoader(TensorDataset(*batch(6)), batch_size=4), True),  # 4, then 2
    (DataLoader(TensorDataset(*batch(6)), batch_size=4, drop_last=True), False),
    (DataLoader(Stream(), batch_size=4), True),  # no length: its last batch may be partial
    (DataLoader(Stream(), batch_size=4, drop_last=True), False)])
def test_a_partial_last_batch_makes_the_batch_dimension_dynamic(loader, dynamic):
    model = Model(params_of(), "cpu")
    graph, _ = device_run.capture_step(model, device_run.first_batch(loader, 0), True, params_of())
    graph = device_run.mark_dynamic_batch(graph, loader)
    shapes = [graph.values[name].shape for name in graph.inputs]
    assert shapes == [(None if dynamic else 4, FEATURES), (None if dynamic else 4,)]


def test_the_one_line_refusals_of_the_device_runner(tmp_path):
    with pytest.raises(UserError) as error:
        device_run.first_batch(DataLoader(TensorDataset(*batch(2)), batch_size=4, drop_last=True), 0)
    assert str(error.value) == ("the data yielded no batch to capture the model with (is the dataset smaller than "
                                "batch_size with drop_last?)")
    with pytest.raises(UserError) as error:
        device_run.capture_step(Model(params_of(), "cpu"), {"x": batch()[0]}, True, params_of())
    assert str(error.value) == "the device takes batches that are a tuple or list of tensors; the DataLoader gives dict"
    with pytest.raises(UserError) as error:
        device_run.capture_step(Model(params_of(), "cpu"), (batch()[0], [1, 2]), True, params_of())
    assert str(error.value).endswith("the DataLoader gives tuple")
    gpu = argparse.Namespace(device="gpu", mode="train", validate_only=True, compile_only=False)
    with pytest.raises(UserError) as error:
        device_run.compile_for_device(gpu, params_of(), Model, None, None)
    assert str(error.value) == ("--device gpu does not go with --validate_only / --compile_only, which compile for "
                                "the device (drop --device, or use --device emulator)")
