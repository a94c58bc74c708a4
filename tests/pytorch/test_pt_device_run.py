"""common/pytorch/device_run.py's pieces on a small model: the optimizer's state between torch
and the emulator, the model built for a compile without its weights, the batch dimension a
partial last batch makes dynamic, and the one-line refusals."""

import argparse
import io
import logging
import os
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from common.errors import UserError
from common.params import load_params
from common.pytorch import device_run
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.data_order import epoch_batches
from common.pytorch.metrics import Accuracy, AccuracyMetric

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
    module = Tied

    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, self.module(), device)
        self.metrics = {"accuracy": Accuracy(output="logits")}

    def __call__(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits, y), {"logits": logits}


def params_of(optimizer="adam", runconfig=(), **extra):
    return load_params(None, {"optimizer": {"optimizer_type": optimizer, "learning_rate": 0.01, **extra},
                              "runconfig": {"max_steps": 2, **dict(runconfig)}})


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


class Batches(IterableDataset):
    def __iter__(self):
        return iter([batch(4), batch(4)])


@pytest.mark.parametrize("loader, dynamic", [
    (DataLoader(TensorDataset(*batch(8)), batch_size=4), False),
    (DataLoader(TensorDataset(*batch(6)), batch_size=4), True),  # 4, then 2
    (DataLoader(TensorDataset(*batch(6)), batch_size=4, drop_last=True), False),
    (DataLoader(Stream(), batch_size=4), True),  # no length: its last batch may be partial
    (DataLoader(Stream(), batch_size=4, drop_last=True), False),
    (DataLoader(Batches(), batch_size=None), False)])  # the dataset's own batches
def test_a_partial_last_batch_makes_the_batch_dimension_dynamic(loader, dynamic):
    model = Model(params_of(), "cpu")
    graph, _ = device_run.capture_step(model, device_run.first_batch(loader, 0), True, params_of())
    graph = device_run.mark_dynamic_batch(graph, loader)
    shapes = [graph.values[name].shape for name in graph.inputs]
    assert shapes == [(None if dynamic else 4, FEATURES), (None if dynamic else 4,)]


class DictModel(Model):
    """Model, reading its batch as a dict: {"x": ..., "y": ...}."""

    def __call__(self, batch):
        return super().__call__((batch["x"], batch["y"]))


def test_the_one_line_refusals_of_the_device_runner(tmp_path):
    with pytest.raises(UserError) as error:
        device_run.first_batch(DataLoader(TensorDataset(*batch(2)), batch_size=4, drop_last=True), 0)
    assert str(error.value) == ("the data yielded no batch to capture the model with (is the dataset smaller than "
                                "batch_size with drop_last?)")
    graph, _ = device_run.capture_step(DictModel(params_of(), "cpu"), dict(zip(["x", "y"], batch())), True,
                                       params_of())
    assert graph.inputs == ["x", "y"]  # a dict batch is captured, its inputs named by its keys
    with pytest.raises(UserError) as error:
        device_run.capture_step(DictModel(params_of(), "cpu"), {"x": batch()[0], "y": ["a", "b"]}, True, params_of())
    assert str(error.value) == ("batch['y'] is a list of str; the device takes a batch whose values are tensors, or "
                                "tuples, lists or dicts of tensors")
    with pytest.raises(UserError) as error:
        device_run.capture_step(Model(params_of(), "cpu"), (batch()[0], [1, 2]), True, params_of())
    assert str(error.value) == ("batch[1] is a list of int; the device takes a batch whose values are tensors, or "
                                "tuples, lists or dicts of tensors")
    with pytest.raises(UserError) as error:
        device_run.capture_step(Model(params_of(), "cpu"), batch()[0], True, params_of())
    assert str(error.value) == "the device takes a batch that is a tuple, list or dict of tensors; the batch is a Tensor"
    gpu = argparse.Namespace(device="gpu", mode="train", validate_only=True, compile_only=False)
    with pytest.raises(UserError) as error:
        device_run.compile_for_device(gpu, params_of(), Model, None, None)
    assert str(error.value) == ("--device gpu does not go with --validate_only / --compile_only, which compile for "
                                "the device (drop --device, or use --device emulator)")


class WithSpare(Tied):
    """Tied, with a parameter and a buffer that the forward pass never reads."""

    def __init__(self):
        super().__init__()
        self.spare = torch.nn.Parameter(torch.ones(2))
        self.register_buffer("unread", torch.zeros(2))


class SpareModel(Model):
    module = WithSpare


def test_a_parameter_the_steps_never_updated_goes_to_the_emulator_without_slots_and_back_without():
    first = SpareModel(params_of("adam"), "cpu")
    for _ in range(2):
        first.train_step(batch())
    state = device_run.emulator_optimizer_state(first, "adam")
    assert state["spare"] == {} and state["step"] == 2 and sorted(state["encode.weight"]) == ["m", "v"]
    second = SpareModel(params_of("adam"), "cpu")
    device_run.load_torch_optimizer_state(second, state, "adam")
    assert second.model.spare not in second.optimizer.state
    assert sorted(second.optimizer.state_dict()["state"]) == sorted(first.optimizer.state_dict()["state"])


def test_a_loss_scale_without_its_good_steps_starts_counting_them_at_0():
    params = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01,
                                              "loss_scaling_factor": "dynamic", "initial_loss_scale": 256},
                                "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    model = Model(params, "cpu")
    device_run.load_torch_optimizer_state(model, {"step": 0, "loss_scale": 32.0}, "adam")
    assert model.scaler.get_scale() == 32.0 and model.scaler.state_dict()["_growth_tracker"] == 0


class Big(torch.nn.Module):
    """5 GiB of weights, never allocated (built on the meta device, then of stand-ins): 4 GiB in
    float32, 1 GiB in bfloat16, and a frozen vector."""

    def __init__(self):
        super().__init__()
        self.wide = torch.nn.Linear(2**15, 2**15, bias=False)
        self.narrow = torch.nn.Linear(2**15, 2**14, bias=False).to(torch.bfloat16)
        self.frozen = torch.nn.Parameter(torch.zeros(4), requires_grad=False)


class BigModel(Model):
    module = Big


def test_a_model_too_large_for_this_machine_keeps_its_dtypes_and_frozen_weights_and_its_figures_are_in_gib(caplog):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        model = device_run.model_for_capture(BigModel, params_of(), memory=7 * 2**30)
    weights = dict(model.model.named_parameters())
    assert {name: (p.shape, p.dtype, p.requires_grad) for name, p in weights.items()} == {
        "wide.weight": ((2**15, 2**15), torch.float32, True), "narrow.weight": ((2**14, 2**15), torch.bfloat16, True),
        "frozen": ((4,), torch.float32, False)}
    assert all(p.device.type == "cpu" and p.stride() == (0,) * p.dim() for p in weights.values())
    assert [r.getMessage() for r in caplog.records if r.name == "zoo"][-1] == (
        "the model's 5.0 GiB of weights exceed half of the 7.0 GiB this machine has available: built without them "
        "(shapes only) for the compile")

    class Normed(BigModel):
        def __init__(self, params, device):
            super().__init__(params, device)
            self.model.norm = torch.nn.BatchNorm1d(CLASSES)

    with pytest.raises(UserError) as error:
        device_run.model_for_capture(Normed, params_of(), memory=7 * 2**30)
    assert str(error.value) == (
        "the model's weights need 5.0 GiB, more than half of the 7.0 GiB this machine has available, and built "
        "without them (torch's meta device) its buffer 'norm.running_mean' would have no value; compile it on a "
        "machine with 10 GiB")


def test_the_memory_is_this_machines_unless_given_and_the_model_fn_is_handed_the_cpu(monkeypatch):
    built_on = []

    def recording(params, device):
        built_on.append(device)
        return Model(params, device)

    monkeypatch.setattr(device_run, "available_memory", lambda: 200)
    assert not device_run.model_for_capture(recording, params_of()).model.encode.weight.any()  # stand-ins
    assert built_on == [torch.device("meta")]
    built_on.clear()
    monkeypatch.setattr(device_run, "available_memory", lambda: None)  # not known: built on the CPU
    assert device_run.model_for_capture(recording, params_of()).model.encode.weight.any()
    assert built_on == [torch.device("meta"), torch.device("cpu")]


def test_the_memory_available_is_meminfos_figure_in_bytes_and_none_without_it(monkeypatch):
    files = {"/proc/meminfo": "MemTotal:        4000 kB\nMemAvailable:    1500 kB\nSwapTotal:  0 kB\n"}

    def fake_open(path, *args, **kwargs):
        if path not in files:
            raise FileNotFoundError(2, "No such file or directory", path)
        return io.StringIO(files[path])

    monkeypatch.setattr(device_run, "open", fake_open, raising=False)
    assert device_run.available_memory() == 1500 * 1024
    files["/proc/meminfo"] = "MemTotal:        4000 kB\n"
    assert device_run.available_memory() is None
    del files["/proc/meminfo"]
    assert device_run.available_memory() is None


class Sentences(torch.utils.data.Dataset):
    """Eight sequences of 1 to 8 values, each batch padded to its longest (as a text collator
    does): the first batch fixes the captured graph's sequence length."""

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return torch.arange(1.0, index + 2.0), index % CLASSES


def padded(samples):
    sequences, labels = zip(*samples)
    return torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True), torch.tensor(labels)


class Pooled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(1, CLASSES)

    def forward(self, x):
        return self.linear(x.mean(dim=1, keepdim=True))


class PooledModel(Model):
    module = Pooled


def sentences(params):
    """With seed 3, the first batch of epoch 0 is 7 long; of epoch 1, 6; of seed None, 6."""
    return DataLoader(Sentences(), batch_size=2, shuffle=True, collate_fn=padded)


def device_args(mode="train", validate_only=False, compile_only=False):
    return argparse.Namespace(device=None, mode=mode, validate_only=validate_only, compile_only=compile_only)


def test_validate_only_prints_the_validation_and_the_count_of_kernels_matched(tmp_path, capsys):
    params = params_of(runconfig={"model_dir": str(tmp_path)})
    loader = DataLoader(TensorDataset(*batch(8)), batch_size=4)
    report = device_run.compile_for_device(device_args(validate_only=True), params, Model, lambda p: loader, None)
    graph, _ = device_run.capture_step(Model(params, "cpu"), batch(), True, params)
    ours, kernels = device_run.validate_and_match(graph, mode="train", profile_name="wse2")
    assert report.ok and report.summary() == ours.summary()
    assert capsys.readouterr().out == f"{ours.summary()}; {len(kernels)} kernels matched\n" + (
        f"{ours.to_text()}\n" if ours.to_text() else "")
    assert os.listdir(tmp_path) == []


def test_compile_only_compiles_the_eval_datas_first_batch_with_the_device_settings_and_flushes_its_report(
        tmp_path, monkeypatch):
    params = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01},
                                "device": {"execution_mode": "weight_streaming", "micro_batch_size": 1},
                                "runconfig": {"model_dir": str(tmp_path), "seed": 3}})

    def eval_data(given):
        assert given is params
        return sentences(given)

    def train_data(given):
        raise AssertionError("an eval compile reads the eval data")

    events = []

    class Stdout(io.StringIO):
        def write(self, text):
            events.append(("write", text))
            return super().write(text)

        def flush(self):
            events.append(("flush",))

    handler = logging.Handler()
    handler.emit = lambda record: events.append(("log", record.getMessage()))
    logger = logging.getLogger("zoo")
    logger.addHandler(handler)
    level, logger.level = logger.level, logging.INFO
    monkeypatch.setattr(sys, "stdout", Stdout())
    try:
        result = device_run.compile_for_device(device_args("eval", compile_only=True), params, PooledModel,
                                               train_data, eval_data)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    length = next(iter(epoch_batches(sentences(params), 3, epoch=0)))[0].shape[1]  # what training draws first
    assert [result.graph.values[name].shape for name in result.graph.inputs] == [(2, length), (2,)]
    assert result.execution_mode == "weight_streaming" and result.cost.micro_batch_size == 1  # the largest: 2
    assert sorted(os.listdir(tmp_path / "compile")) == ["ir.json", "placement.svg", "report.json", "report.txt",
                                                        "systems.svg"]
    written = [event[1] for event in events if event[0] == "write" and event[1]]
    assert "".join(written) == device_run.render_report(result) == (tmp_path / "compile" / "report.txt").read_text()
    logged = events.index(("log", f"compile report: {tmp_path / 'compile'} (report.txt, report.json, ir.json, "
                                  "placement.svg, systems.svg)"))
    last_write = max(i for i, event in enumerate(events) if event[0] == "write" and event[1])
    assert ("flush",) in events[last_write:logged]  # the report shows before the log line (stderr)


def emulator_steps(model, params, mode, loader, global_step=0):
    """EmulatorSteps for the runner's parts that it reads."""
    runner = SimpleNamespace(model=model, params=params, mode=mode, global_step=global_step,
                             train_loader=loader if mode == "train" else None,
                             eval_loader=None if mode == "train" else loader)
    return device_run.EmulatorSteps(runner)


class Dropped(torch.nn.Module):
    """Dropout that reads the top module's own training flag (as F.dropout(x, p, self.training) does)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(FEATURES, CLASSES)

    def forward(self, x):
        return self.linear(F.dropout(x, 0.5, self.training))


class DroppedModel(Model):
    module = Dropped


def test_the_emulators_dropout_masks_come_from_the_seed_and_the_starting_step():
    def first_loss(seed, step):
        params = params_of(runconfig={"seed": seed})
        model = DroppedModel(params, "cpu")
        steps = emulator_steps(model, params, "train", DataLoader(TensorDataset(*batch(8)), batch_size=4), step)
        return steps.train(batch())

    assert first_loss(1, 0) == first_loss(1, 0)
    assert len({first_loss(1, 0), first_loss(1, 5), first_loss(2, 0)}) == 3


def test_the_emulator_captures_training_s_first_batch():
    params = params_of(runconfig={"seed": 3})
    steps = emulator_steps(PooledModel(params, "cpu"), params, "train", sentences(params))
    length = next(iter(epoch_batches(sentences(params), 3, epoch=0)))[0].shape[1]  # what training draws first
    assert [steps.graph.values[name].shape for name in steps.graph.inputs] == [(2, length), (2,)]


def test_the_emulator_compiles_with_the_devices_micro_batch_size(caplog):
    params = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01},
                                "device": {"execution_mode": "weight_streaming", "micro_batch_size": 2}})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        steps = emulator_steps(Model(params, "cpu"), params, "train", DataLoader(TensorDataset(*batch(8)),
                                                                                  batch_size=4))
    ours = device_run.compile_graph(steps.graph, mode="train", profile_name="wse2",
                                    execution_mode="weight_streaming", micro_batch_size=2)
    largest = device_run.compile_graph(steps.graph, mode="train", profile_name="wse2",
                                       execution_mode="weight_streaming")
    assert ours.cost.micro_batch_size == 2 and largest.cost.micro_batch_size == 4
    assert [r.getMessage() for r in caplog.records if r.name == "zoo"][-1] == (
        f"compiled for the emulator: {len(ours.kernels)} kernels, weight_streaming, profile wse2, float32 compute "
        f"(estimated {ours.cost.samples_per_s:.0f} samples/s on the device)")
    assert f"{ours.cost.samples_per_s:.0f}" != f"{largest.cost.samples_per_s:.0f}"


@pytest.mark.parametrize("clipping", [{"max_gradient_norm": 1.5}, {"max_gradient_value": 0.5}])
def test_the_capture_takes_the_compute_format_the_clipping_and_the_loss_scaling_of_the_params(clipping):
    params = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01, **clipping,
                                              "loss_scaling_factor": "dynamic", "initial_loss_scale": 1024,
                                              "steps_per_increase": 7},
                                "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    model = Model(params, "cpu")
    training, _ = device_run.capture_step(model, batch(), True, params)
    evaluation, _ = device_run.capture_step(model, batch(), False, params)
    assert training.precision == evaluation.precision == "bfloat16"
    spec = training.optimizer
    assert (spec.max_gradient_norm, spec.max_gradient_value) == (clipping.get("max_gradient_norm"),
                                                                 clipping.get("max_gradient_value"))
    assert (spec.loss_scale, spec.initial_loss_scale, spec.steps_per_increase) == ("dynamic", 1024, 7)
    assert evaluation.optimizer is None


class Measured(Model):
    """A model that calls a vendor metric in training too (no ``if not self.model.training`` guard)."""

    def __init__(self, params, device):
        super().__init__(params, device)
        self.accuracy_metric = AccuracyMetric(name="eval/measured_accuracy")

    def __call__(self, batch):
        x, y = batch
        logits = self.model(x)
        self.accuracy_metric(labels=y, predictions=logits.argmax(-1))
        return F.cross_entropy(logits, y), {"logits": logits}


def test_a_training_capture_drops_the_models_metric_calls_and_an_eval_capture_keeps_them():
    model = Measured(params_of(), "cpu")
    training, training_calls = device_run.capture_step(model, batch(), True, params_of())
    evaluation, eval_calls = device_run.capture_step(model, batch(), False, params_of())
    assert training_calls.outputs == {} and sorted(training.outputs) == ["logits"]
    assert sorted(eval_calls.outputs) == ["cb_metric:0:0", "cb_metric:0:1"]
    assert sorted(evaluation.outputs) == ["cb_metric:0:0", "cb_metric:0:1", "logits"]


class MeasuredInAList(Measured):
    def __call__(self, batch):
        loss, outputs = super().__call__(batch)
        return loss, [outputs["logits"]]


def test_a_capture_names_the_models_call_that_returns_neither_the_loss_nor_loss_and_outputs():
    line = MeasuredInAList.__call__.__code__.co_firstlineno
    for training in (False, True):
        with pytest.raises(UserError) as error:
            device_run.capture_step(MeasuredInAList(params_of(), "cpu"), batch(), training, params_of())
        assert str(error.value) == (f"MeasuredInAList.__call__ ({__file__}:{line}) returned (Tensor, list); a model's "
                                    f"__call__ returns the loss (a tensor) or (loss, outputs: a dict of tensors)")


def test_the_emulators_loss_scale_is_none_without_a_scaler():
    loader = DataLoader(TensorDataset(*batch(8)), batch_size=4)
    dynamic = load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.01,
                                               "loss_scaling_factor": "dynamic", "initial_loss_scale": 256},
                                 "mixed_precision": {"enabled": True, "dtype": "float16"}})
    assert emulator_steps(Model(dynamic, "cpu"), dynamic, "train", loader).loss_scale() == 256.0
    assert emulator_steps(Model(params_of(), "cpu"), params_of(), "train", loader).loss_scale() is None
    assert emulator_steps(Model(dynamic, "cpu"), dynamic, "eval", loader).loss_scale() is None


class NormedSpare(WithSpare):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(CLASSES)

    def forward(self, x):
        return self.norm(super().forward(x))


class NormedSpareModel(Model):
    module = NormedSpare


def test_the_emulator_evaluates_the_torch_models_weights_and_buffers_and_eval_all_each_checkpoints():
    params = params_of()
    model = NormedSpareModel(params, "cpu")
    model.model.norm.running_mean.fill_(0.5)  # a checkpoint's statistics, not the fresh ones
    model.model.norm.running_var.fill_(2.0)

    def torch_eval():
        model.model.eval()
        with torch.no_grad():
            return float(model(batch())[0])

    steps = emulator_steps(model, params, "eval", DataLoader(TensorDataset(*batch(8)), batch_size=4))
    before = torch_eval()
    assert steps.eval(batch())[0] == pytest.approx(before, rel=1e-5)
    with torch.no_grad():  # the next checkpoint, loaded into the torch model
        for p in model.model.parameters():
            p.mul_(2)
        model.model.norm.running_mean.fill_(-1.0)
        model.model.unread.fill_(1)
    steps.restored()
    after = torch_eval()
    assert steps.eval(batch())[0] == pytest.approx(after, rel=1e-5) and after != pytest.approx(before)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("flag", [True, False])
def test_a_capture_leaves_the_models_training_flag_as_it_was(training, flag):
    model = Model(params_of(), "cpu")
    model.model.train(flag)
    device_run.capture_step(model, batch(), training, params_of())
    assert model.model.training is flag
