"""The PyTorch capture of a batch that is a dict (device/capture/torch/step.py: batch_tensors): the
graph's inputs named by its keys, one level of tuple, list or dict inside it, and the one-line
refusal of anything else, naming where in the batch it is."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from common.errors import UserError  # noqa: E402
from device.api import build_program, capture_torch, torch_batch, torch_state, torch_weights  # noqa: E402


class Scaled(torch.nn.Module):
    """A linear layer whose output a top-level parameter named ``scale`` multiplies."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)
        self.scale = torch.nn.Parameter(torch.full((3,), 2.0))

    def forward(self, x):  # (B, 4) -> (B, 3)
        return self.linear(x) * self.scale


def tensors(n=2):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=generator), torch.arange(n) % 3, torch.rand(n, generator=generator)


def test_a_dict_batch_s_inputs_are_its_keys_in_order_and_a_value_s_tuple_list_or_dict_one_level_in():
    x, y, w = tensors()
    assert list(torch_batch({"x": x, "pair": (y, w), "more": [w], "sub": {"a": x, "b": y}})) == [
        "x", "pair.0", "pair.1", "more.0", "sub.a", "sub.b"]
    assert list(torch_batch((x, (y, w)))) == ["batch_0", "batch_1.0", "batch_1.1"]
    assert list(torch_batch({"labels": y, "x": x})) == ["labels", "x"]  # the dict's order, not sorted


def test_a_captured_dict_batch_holding_a_tuple_runs_on_the_emulator_as_in_torch():
    module = Scaled()
    x, y, w = tensors()

    def step(batch):  # a loss weighted per example, the weights beside the labels
        logits = module(batch["features"])
        labels, weights = batch["targets"]
        return (F.cross_entropy(logits, labels, reduction="none") * weights).mean(), {"logits": logits}

    batch = {"features": x, "targets": (y, w)}
    graph = capture_torch(step, module, batch)
    assert graph.inputs == ["features", "targets.0", "targets.1"]
    program = build_program(graph, torch_weights(module, graph), torch_state(module, graph))
    outputs = program.eval_step([t.numpy() for t in torch_batch(batch).values()])
    with torch.no_grad():
        loss, expected = step(batch)
    assert float(outputs["loss"]) == pytest.approx(float(loss), rel=1e-6)
    assert np.allclose(outputs["logits"], expected["logits"].numpy(), atol=1e-6)


Example = collections.namedtuple("Example", ["x", "y"])


def test_a_namedtuple_batch_reaches_the_step_as_itself():
    module = Scaled()
    x, y, _ = tensors()
    graph = capture_torch(lambda batch: F.cross_entropy(module(batch.x), batch.y), module, Example(x, y))
    assert graph.inputs == ["batch_0", "batch_1"]


def test_a_key_that_names_a_parameter_leaves_its_input_the_position_s_name():
    module = Scaled()
    x, _, w = tensors()
    graph = capture_torch(lambda batch: (module(batch["x"]).sum(1) * batch["scale"]).mean(), module,
                          {"x": x, "scale": w})
    assert graph.inputs == ["x", "batch_1"] and graph.params["scale"] == "scale"


@pytest.mark.parametrize("batch, message", [
    ({"x": tensors()[0], "text": ["a b", "c"]},
     "batch['text'] is a list of str; the device takes a batch whose values are tensors, or tuples, lists or "
     "dicts of tensors"),
    ({"x": tensors()[0], "size": 2},
     "batch['size'] is an int; the device takes a batch whose values are tensors, or tuples, lists or dicts of "
     "tensors"),
    ({"x": ((tensors()[0],),)},
     "batch['x'] is a tuple of tuple; the device takes a batch whose values are tensors, or tuples, lists or "
     "dicts of tensors"),
    ((tensors()[0], [1, 2]),
     "batch[1] is a list of int; the device takes a batch whose values are tensors, or tuples, lists or dicts of "
     "tensors"),
    ({0: tensors()[0]},
     "batch has the key 0, an int; the keys of a dict in the batch name the device's inputs: they must be str"),
    ({"x": {1: tensors()[0]}},
     "batch['x'] has the key 1, an int; the keys of a dict in the batch name the device's inputs: they must be "
     "str"),
    ({"sub": {"a": tensors()[0]}, "sub.a": tensors()[0]},
     "batch['sub.a'] would be the device's input 'sub.a', as another tensor of the batch is: rename one of their "
     "keys"),
    ("input_ids", "the device takes a batch that is a tuple, list or dict of tensors; the batch is a str"),
    ({}, "the batch holds no tensor; the device takes a batch that is a tuple, list or dict of tensors"),
])
def test_a_batch_the_device_does_not_take_is_one_line_naming_where_in_it(batch, message):
    for refuse in (torch_batch, lambda b: capture_torch(lambda _: torch.zeros(()), Scaled(), b)):
        with pytest.raises(UserError) as error:
            refuse(batch)
        assert str(error.value) == message
