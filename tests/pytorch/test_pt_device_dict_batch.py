"""A DataLoader of dicts (``{"input_ids": ..., "attention_mask": ..., "labels": ...}``, the habit
of Hugging Face and of the vendor's zoo) on the device: captured, validated, compiled, trained,
evaluated and predicted as its tuple twin is, with the graph's inputs named by the dict's keys."""

import argparse
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from common.errors import UserError
from common.params import load_params
from common.pytorch import device_run
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.runner import FrameworkSteps, Runner
from tests.pytorch.recording import recording
from device.errors import DeviceCompileError

VOCAB, WIDTH, CLASSES, LENGTH, EXAMPLES = 11, 8, 3, 6, 12
KEYS = ["input_ids", "attention_mask", "labels"]


class Tagger(torch.nn.Module):
    """Token embeddings averaged over the unmasked positions, then a linear head (no dropout)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, WIDTH)
        self.head = torch.nn.Linear(WIDTH, CLASSES)

    def forward(self, input_ids, attention_mask):  # (B, T) int64 each
        mask = attention_mask.unsqueeze(-1).to(torch.float32)  # (B, T, 1)
        pooled = (self.embed(input_ids) * mask).sum(1) / mask.sum(1)  # (B, W)
        return self.head(pooled)  # (B, CLASSES)


class DictModel(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, Tagger(), device)

    def __call__(self, data):
        logits = self.model(data["input_ids"], data["attention_mask"])
        return F.cross_entropy(logits, data["labels"]), {"logits": logits}


class TupleModel(DictModel):
    """The dict model's twin, fed the same tensors as a tuple."""

    def __call__(self, batch):
        input_ids, attention_mask, labels = batch
        logits = self.model(input_ids, attention_mask)
        return F.cross_entropy(logits, labels), {"logits": logits}


class Examples(Dataset):
    """EXAMPLES sequences of 2 to LENGTH tokens, padded to LENGTH, as dicts (or as tuples)."""

    def __init__(self, as_tuples=False):
        self.as_tuples = as_tuples

    def __len__(self):
        return EXAMPLES

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        mask = (torch.arange(LENGTH) < 2 + index % (LENGTH - 1)).long()
        example = {"input_ids": torch.randint(1, VOCAB, (LENGTH,), generator=generator) * mask,
                   "attention_mask": mask, "labels": torch.tensor(index % CLASSES)}
        return tuple(example[key] for key in KEYS) if self.as_tuples else example


def dicts(params):
    return DataLoader(Examples(), batch_size=4, shuffle=True)


def tuples(params):
    return DataLoader(Examples(as_tuples=True), batch_size=4, shuffle=True)


def params_of(model_dir, **runconfig):
    return load_params(None, {"optimizer": {"optimizer_type": "adam", "learning_rate": 0.05},
                              "runconfig": {"model_dir": str(model_dir), "max_steps": 4, "log_steps": 4,
                                            "checkpoint_steps": 4, "seed": 1, **runconfig}})


def run(model_dir, mode, device, model_fn, data_fn):
    backend = recording(EmulatorSteps if device == "emulator" else FrameworkSteps)
    runner = Runner(argparse.Namespace(mode=mode, device=device, checkpoint_path=None), params_of(model_dir),
                    model_fn, data_fn, data_fn, backend)
    return runner, runner.execute()


def test_a_dict_batch_trains_evaluates_and_predicts_on_the_emulator_as_on_the_cpu_and_as_its_tuple_twin(tmp_path):
    emulator, _ = run(tmp_path / "dict", "train", "emulator", DictModel, dicts)
    twin, _ = run(tmp_path / "tuple", "train", "emulator", TupleModel, tuples)
    cpu, _ = run(tmp_path / "cpu", "train", "cpu", DictModel, dicts)
    assert emulator.steps.graph.inputs == KEYS  # named by the dict's keys, in its order
    assert twin.steps.graph.inputs == ["batch_0", "batch_1", "batch_2"]
    assert len(emulator.steps.losses) == 4 and emulator.steps.losses == twin.steps.losses  # the same numbers
    assert emulator.steps.losses[0] == pytest.approx(cpu.steps.losses[0], abs=1e-4)
    assert emulator.steps.losses == pytest.approx(cpu.steps.losses, abs=1e-4)

    _, dict_eval = run(tmp_path / "dict", "eval", "emulator", DictModel, dicts)
    _, twin_eval = run(tmp_path / "tuple", "eval", "emulator", TupleModel, tuples)
    _, cpu_eval = run(tmp_path / "dict", "eval", "cpu", DictModel, dicts)  # the emulator's checkpoint, on torch
    assert dict_eval == twin_eval and dict_eval["loss"] == pytest.approx(cpu_eval["loss"], abs=1e-4)

    for folder, model_fn, data_fn in (("dict", DictModel, dicts), ("tuple", TupleModel, tuples)):
        run(tmp_path / folder, "predict", "emulator", model_fn, data_fn)
    predicted = np.load(tmp_path / "dict" / "predictions.npz")["logits"]
    assert predicted.shape == (EXAMPLES, CLASSES)
    assert np.array_equal(predicted, np.load(tmp_path / "tuple" / "predictions.npz")["logits"])
    run(tmp_path / "dict", "predict", "cpu", DictModel, dicts)
    assert np.allclose(predicted, np.load(tmp_path / "dict" / "predictions.npz")["logits"], atol=1e-4)


def device_args(validate_only=False, compile_only=False):
    return argparse.Namespace(device=None, mode="train", validate_only=validate_only, compile_only=compile_only)


def test_validate_only_and_compile_only_take_a_dict_batch_and_name_its_inputs_by_key(tmp_path, capsys):
    params = params_of(tmp_path)
    report = device_run.compile_for_device(device_args(validate_only=True), params, DictModel, dicts, None)
    assert report.ok and capsys.readouterr().out.startswith("validation passed")
    result = device_run.compile_for_device(device_args(compile_only=True), params, DictModel, dicts, None)
    assert result.graph.inputs == KEYS
    assert json.loads((tmp_path / "compile" / "ir.json").read_text())["inputs"] == KEYS
    assert "report.txt" in os.listdir(tmp_path / "compile")


def test_the_validators_findings_name_a_dict_batchs_input_by_its_key(tmp_path):
    ragged = lambda params: DataLoader(Examples(), batch_size=5)  # noqa: E731 - 12 examples: 5, 5, then 2
    with pytest.raises(DeviceCompileError) as error:
        device_run.compile_for_device(device_args(validate_only=True), params_of(tmp_path), DictModel, ragged, None)
    assert "input 'input_ids' (first used here) has a dynamic shape (None, 6)" in str(error.value)


def emulator_steps(model, params, loader):
    runner = argparse.Namespace(model=model, params=params, mode="train", global_step=0, train_loader=loader,
                                eval_loader=None)
    return EmulatorSteps(runner)


def test_a_later_dict_batch_is_read_by_key_whatever_its_order_and_must_hold_the_first_batchs_keys(tmp_path):
    params = params_of(tmp_path)
    batch = next(iter(dicts(params)))
    first = emulator_steps(DictModel(params, "cpu"), params, dicts(params)).train(batch)
    reordered = {key: batch[key] for key in reversed(KEYS)}
    assert emulator_steps(DictModel(params, "cpu"), params, dicts(params)).train(reordered) == first
    steps = emulator_steps(DictModel(params, "cpu"), params, dicts(params))
    with pytest.raises(UserError) as error:
        steps.train({key: batch[key] for key in KEYS[1:]})
    assert str(error.value) == ("a batch holds the tensors attention_mask, labels; the first batch, which the model "
                                "was compiled for, held input_ids, attention_mask, labels: every batch must hold the "
                                "same")


class Texts(Examples):
    """Examples that carry their text as well: a list of str under "text" once collated."""

    def __getitem__(self, index):
        return {**super().__getitem__(index), "text": f"example {index}"}


@pytest.mark.parametrize("training", [True, False])
def test_a_dict_batch_holding_strings_is_refused_in_one_line_naming_the_key(tmp_path, training):
    params = params_of(tmp_path)
    batch = next(iter(DataLoader(Texts(), batch_size=4)))
    with pytest.raises(UserError) as error:
        device_run.capture_step(DictModel(params, "cpu"), batch, training, params)
    assert str(error.value) == ("batch['text'] is a list of str; the device takes a batch whose values are tensors, "
                                "or tuples, lists or dicts of tensors")
