"""The emulator trains on the batches the CPU trains on, even from data that draws another order
on each pass: a sampler that shuffles its own list in place, a stream that carries on where its
last pass stopped (as persistent DataLoader workers do). The emulator's runner draws a first
batch to compile the model for; its training loop must continue that draw, not draw again."""

import argparse
import random

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset, Sampler, TensorDataset

from common.params import load_params
from common.pytorch.base_model import PyTorchBaseModel
from common.pytorch.data_order import TrainOrder, eval_shard, peek_first_batch
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.runner import FrameworkSteps, Runner

FEATURES, CLASSES, EXAMPLES, BATCH = 5, 3, 16, 4


def examples():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(EXAMPLES, FEATURES, generator=generator), torch.arange(EXAMPLES) % CLASSES


class ShuffledInPlace(Sampler):
    """Each pass shuffles the order the last pass left: another order every pass."""

    def __init__(self, size: int):
        self.indices = list(range(size))

    def __iter__(self):
        random.Random(0).shuffle(self.indices)
        return iter(list(self.indices))

    def __len__(self):
        return len(self.indices)


class Continuing(IterableDataset):
    """Each pass yields the next EXAMPLES // 2 examples of an endless stream."""

    def __init__(self):
        self.x, self.y = examples()
        self.position = 0

    def __iter__(self):
        for _ in range(EXAMPLES // 2):
            i = self.position % EXAMPLES
            self.position += 1
            yield self.x[i], self.y[i]


def shuffled_in_place(params=None):
    return DataLoader(TensorDataset(*examples()), batch_size=BATCH, sampler=ShuffledInPlace(EXAMPLES))


def continuing(params=None):
    return DataLoader(Continuing(), batch_size=BATCH, drop_last=True)


DATA = [shuffled_in_place, continuing]


def first_batches(batches, n=3):
    return [b for b, _ in zip(batches, range(n))]


def assert_same_batches(got, expected):
    assert len(got) == len(expected)
    for (gx, gy), (ex, ey) in zip(got, expected):
        assert torch.equal(gx, ex) and torch.equal(gy, ey)


@pytest.mark.parametrize("data", DATA)
def test_training_after_a_peek_continues_the_peeked_draw(data):
    expected = first_batches(TrainOrder(data(), seed=3))  # a fresh loader: the CPU's first draw
    loader = data()
    first = peek_first_batch(loader, 3)
    got = first_batches(TrainOrder(loader, seed=3))
    assert_same_batches([first], expected[:1])
    assert_same_batches(got, expected)
    # the peek is given once: the next draw is a draw of its own, as on the CPU
    again = first_batches(TrainOrder(loader, seed=3))
    cpu = data()
    first_batches(TrainOrder(cpu, seed=3))
    assert_same_batches(again, first_batches(TrainOrder(cpu, seed=3)))


@pytest.mark.parametrize("data", DATA)
def test_an_eval_after_a_peek_continues_the_peeked_draw(data):
    expected = list(eval_shard(data(), 3, limit=3))
    loader = data()
    peek_first_batch(loader, 3)
    assert_same_batches(list(eval_shard(loader, 3, limit=3)), expected)


def test_a_peek_of_another_seed_is_dropped():
    loader = shuffled_in_place()
    peek_first_batch(loader, 3)
    cpu = shuffled_in_place()
    first_batches(TrainOrder(cpu, seed=4))
    assert_same_batches(first_batches(TrainOrder(loader, seed=4)), first_batches(TrainOrder(cpu, seed=4)))


class Linear(PyTorchBaseModel):
    def __init__(self, params, device):
        torch.manual_seed(0)
        super().__init__(params, torch.nn.Linear(FEATURES, CLASSES), device)

    def __call__(self, batch):
        x, y = batch
        logits = self.model(x)
        return F.cross_entropy(logits, y), {"logits": logits}


def recording(steps_class, record: list):
    """``steps_class``, each trained batch and its loss appended to ``record``."""
    class Recording(steps_class):
        def train(self, batch):
            loss = super().train(batch)
            record.append((batch, float(loss)))
            return loss
    return Recording


def trained(tmp_path, device, steps_class, data):
    params = load_params(None, {"runconfig": {"model_dir": str(tmp_path / device), "max_steps": 3, "log_steps": 1,
                                              "checkpoint_steps": 3, "seed": 3},
                                "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}})
    args = argparse.Namespace(mode="train", device=device, checkpoint_path=None)
    record: list = []
    Runner(args, params, Linear, data, data, recording(steps_class, record)).execute()
    return record


@pytest.mark.parametrize("data", DATA)
def test_the_emulator_trains_on_the_cpus_batches_and_gets_its_losses(tmp_path, data):
    cpu = trained(tmp_path, "cpu", FrameworkSteps, data)
    emulator = trained(tmp_path, "emulator", EmulatorSteps, data)
    assert_same_batches([b for b, _ in emulator], [b for b, _ in cpu])
    assert [loss for _, loss in emulator] == pytest.approx([loss for _, loss in cpu], abs=1e-5)


def resumed(tmp_path, device, steps_class, data, start):
    """A run to step ``start`` on the CPU, then resumed to step 8 on ``device``: the resumed run's batches."""
    model_dir = tmp_path / f"{device}_{start}"

    def params(max_steps):
        return load_params(None, {"runconfig": {"model_dir": str(model_dir), "max_steps": max_steps,
                                                "log_steps": 1, "checkpoint_steps": start, "seed": 3},
                                  "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1}})

    Runner(argparse.Namespace(mode="train", device="cpu", checkpoint_path=None), params(start), Linear, data, data,
           FrameworkSteps).execute()
    record: list = []
    Runner(argparse.Namespace(mode="train", device=device, checkpoint_path=None), params(8), Linear, data, data,
           recording(steps_class, record)).execute()
    return record


@pytest.mark.parametrize("start", [4, 5])  # at an epoch's end (the shuffled data's), inside one
@pytest.mark.parametrize("data", DATA)
def test_a_run_resumed_after_epoch_0_trains_on_the_emulator_on_the_cpus_batches(tmp_path, data, start):
    cpu = resumed(tmp_path, "cpu", FrameworkSteps, data, start)
    emulator = resumed(tmp_path, "emulator", EmulatorSteps, data, start)
    assert len(cpu) == 8 - start
    assert_same_batches([b for b, _ in emulator], [b for b, _ in cpu])
    assert [loss for _, loss in emulator] == pytest.approx([loss for _, loss in cpu], abs=1e-5)


def test_a_peek_at_an_epochs_end_keeps_the_empty_draw_and_gives_the_next_epochs_first():
    loader = shuffled_in_place()
    state = {"epoch": 2, "batch": EXAMPLES // BATCH, "global_batch": BATCH}
    first = peek_first_batch(loader, 3, 2, EXAMPLES // BATCH)
    cpu = shuffled_in_place()
    expected = first_batches(TrainOrder(cpu, seed=3, state=state))
    assert_same_batches([first], expected[:1])
    assert_same_batches(first_batches(TrainOrder(loader, seed=3, state=state)), expected)
