"""nn.LSTM, nn.GRU and nn.RNN captured from PyTorch (device/capture/torch/recurrent.py): every
attribute of their aten ops gives torch's loss and gradients, or is refused at the user's line.

Each case is one layer with one attribute away from the default (and the forms the
family blocks use: two layers, batch_first), its whole output sequence and final states
in the loss, so that every step and every direction is checked.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from device.capture.torch import capture, weights_of  # noqa: E402
from device.passes.validate import validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402
from zoo_base.errors import UserError  # noqa: E402

SEQ, BATCH, FEATURES, HIDDEN = 4, 3, 5, 6


class Recurrent(nn.Module):
    """A recurrent layer; the loss reads the output sequence and every final state."""

    def __init__(self, kind: str, initial_state: bool = False, **options):
        super().__init__()
        self.rnn = getattr(nn, kind)(FEATURES, HIDDEN, **options)
        states = self.rnn.num_layers * (2 if self.rnn.bidirectional else 1)
        rows = self.rnn.proj_size or HIDDEN
        self.h0 = nn.Parameter(torch.randn(states, BATCH, rows) * 0.5) if initial_state else None
        self.c0 = nn.Parameter(torch.randn(states, BATCH, HIDDEN) * 0.5) if initial_state and kind == "LSTM" else None

    def forward(self, x):
        hx = None
        if self.h0 is not None:
            hx = (self.h0, self.c0) if self.c0 is not None else self.h0
        out, final = self.rnn(x, hx)  # <the layer's line>
        finals = final if isinstance(final, tuple) else (final,)
        loss = (out * torch.linspace(-1.0, 1.0, out.shape[-1])).square().mean()
        return loss + sum((f * 0.3).sum() for f in finals)


def _sequences(batch_first: bool):
    shape = (BATCH, SEQ, FEATURES) if batch_first else (SEQ, BATCH, FEATURES)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(7))


CASES = {
    "lstm": ("LSTM", {}),
    "lstm-2-layers": ("LSTM", {"num_layers": 2}),
    "lstm-batch-first": ("LSTM", {"batch_first": True}),
    "lstm-bidirectional": ("LSTM", {"bidirectional": True, "num_layers": 2}),
    "lstm-no-bias": ("LSTM", {"bias": False}),
    "lstm-proj-size": ("LSTM", {"proj_size": 2, "num_layers": 2, "bidirectional": True}),
    "lstm-initial-state": ("LSTM", {"initial_state": True, "num_layers": 2}),
    "gru": ("GRU", {}),
    "gru-2-layers-batch-first": ("GRU", {"num_layers": 2, "batch_first": True}),
    "gru-bidirectional": ("GRU", {"bidirectional": True}),
    "gru-no-bias": ("GRU", {"bias": False}),
    "gru-initial-state": ("GRU", {"initial_state": True}),
    "rnn-tanh": ("RNN", {"num_layers": 2}),
    "rnn-relu-bidirectional": ("RNN", {"nonlinearity": "relu", "bidirectional": True}),
    "rnn-batch-first-no-bias-initial-state": ("RNN", {"batch_first": True, "bias": False, "initial_state": True}),
}

# every argument of the aten ops, walked from torch's schema: the layer option that sets it away
# from its default, implemented and checked by a case above (dropout and train: the dropout test)
OPTIONS = {"input": None, "params": None, "hx": "initial_state", "has_biases": "bias", "num_layers": "num_layers",
           "bidirectional": "bidirectional", "batch_first": "batch_first", "dropout": "dropout", "train": "dropout"}
OPS = {"LSTM": torch.ops.aten.lstm.input, "GRU": torch.ops.aten.gru.input, "RNN": torch.ops.aten.rnn_tanh.input,
       "RNN-relu": torch.ops.aten.rnn_relu.input}


@pytest.mark.parametrize("kind", list(OPS))
def test_every_schema_argument_is_implemented_by_a_case(kind):
    op = OPS[kind]
    assert {a.name for a in op._schema.arguments} == set(OPTIONS), f"{op}: add a case for each new argument"
    for argument, option in OPTIONS.items():
        if option in (None, "dropout"):  # operands; dropout and train: test_dropout_between_layers_...
            continue
        layer = kind.split("-")[0]
        assert any(k == layer and option in options for k, options in CASES.values()), (kind, argument)


@pytest.mark.parametrize("case", list(CASES))
def test_loss_and_gradients_match_torch(case):
    kind, options = CASES[case]
    torch.manual_seed(0)
    model = Recurrent(kind, **options)
    x = _sequences(options.get("batch_first", False))
    graph = capture(lambda b: model(b[0]), model, [x])
    report = validate(graph, mode="train", profile=None)
    assert report.ok, report.to_text()
    assert {n.op for n in graph.nodes} <= {"matmul", "add", "sub", "mul", "sigmoid", "tanh", "relu", "slice",
                                           "reshape", "transpose", "concat", "square", "reduce_mean",
                                           "reduce_sum", "broadcast_to"}, "unrolled into the IR's own ops"
    loss, grads = Program(graph, weights_of(model, graph)).gradients([x.numpy()])
    model.zero_grad()
    expected = model(x)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    assert set(grads) == {name for name, _ in model.named_parameters()}
    for name, param in model.named_parameters():
        np.testing.assert_allclose(grads[name], param.grad.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_dropout_between_layers_is_the_devices_dropout_and_only_in_training():
    torch.manual_seed(0)
    model = Recurrent("GRU", num_layers=3, dropout=0.25)
    x = _sequences(False)
    graph = capture(lambda b: model(b[0]), model, [x])
    assert [n.attrs for n in graph.nodes if n.op == "dropout"] == [{"rate": 0.25}] * 2  # after layers 0 and 1
    program = Program(graph, weights_of(model, graph), seed=0)
    model.eval()  # torch without dropout: the emulator's eval forward is the same
    with torch.no_grad():
        expected = model(x).item()
    np.testing.assert_allclose(program.forward([x.numpy()], training=False)["loss"], expected, rtol=1e-5)
    assert program.forward([x.numpy()], training=True)["loss"] != pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("initial_state", [False, True])
def test_packed_sequences_are_refused_in_one_line_at_the_users_line(initial_state):
    torch.manual_seed(0)
    rnn = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
    lengths = torch.tensor([4, 2, 3])
    hx = (torch.zeros(1, BATCH, HIDDEN),) * 2 if initial_state else None

    def step(batch):
        packed = nn.utils.rnn.pack_padded_sequence(batch[0], lengths, batch_first=True, enforce_sorted=False)
        out, _ = rnn(packed, hx)  # <packed>
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0].sum()

    with pytest.raises(UserError) as refused:
        capture(step, rnn, [_sequences(True)])
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{__file__}:{_line('# <packed>')}: out, _ = rnn(packed, hx)")
    assert "packed sequences (pack_padded_sequence)" in message and "pad the sequences to one length" in message


def _line(marker: str) -> int:
    return next(i for i, text in enumerate(open(__file__), 1) if marker in text and "_line(" not in text)
