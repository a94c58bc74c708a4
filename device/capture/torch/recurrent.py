"""Recurrent layers of the PyTorch frontend: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN``, unrolled.

torch.export gives each layer as one aten op (``aten.lstm.input``, ``aten.gru.input``,
``aten.rnn_tanh.input``, ``aten.rnn_relu.input``). The capture keeps it whole (export.py's
``_KEPT_WHOLE``) and the handlers here unroll it over its static sequence length into the
IR's matmul, add, slice, sigmoid, tanh, mul, sub and concat, with torch's gate order and
arithmetic (ATen's RNN.cpp cells; the formulas of the torch.nn.LSTM and GRU docs):

    LSTM  i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh)        (4 gates on the last axis)
          c' = sigmoid(f) * c + sigmoid(i) * tanh(g);  h' = sigmoid(o) * tanh(c')  (then h' W_hr^T: proj_size)
    GRU   r = sigmoid(x_r + h_r), z = sigmoid(x_z + h_z), n = tanh(x_n + r * h_n),
          h' = (h - n) * z + n       with x_* of x W_ih^T + b_ih, h_* of h W_hh^T + b_hh (3 gates)
    RNN   h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh), or relu

Every attribute of the ops is implemented: layers, biases, batch_first, bidirectional (the
reverse direction walks the steps backwards), proj_size, the initial state, and dropout
between layers in training (the IR's dropout, whose masks are the emulator's own, as for
nn.Dropout).

Why not torch's own decomposition of these ops: in training it drops the dropout between
layers (``_rnn_helper`` in torch/_decomp/decompositions.py resets ``dropout`` to 0.0 by a
condition that never holds), so a model with dropout would train on other numbers than
torch's without a word; and it reverses the sequence with ``flip`` where an unrolled loop
simply walks it backwards.

Packed sequences (``pack_padded_sequence``) run each step on the sequences still going, a
count read from the lengths in the batch: torch.export stops at that data-dependent size, and
the capture's one-line refusal says so at the user's line (``packed_sequence_hint``).
"""

from __future__ import annotations

import os

import torch
from torch.nn.utils.rnn import PackedSequence

# gates per cell, in the order torch stacks them in weight_ih / weight_hh
GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _recurrent(kind: str):
    """The handler of aten.<kind>.input: (output, h_n) or, for the LSTM, (output, h_n, c_n)."""

    def lower(self, node, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
        directions = 2 if bidirectional else 1
        if kind == "lstm":
            h0, c0 = (self.tensor(t) for t in hx)
        else:
            h0, c0 = self.tensor(hx), None
        weights = [self.tensor(p) for p in params]
        per_layer = len(weights) // (num_layers * directions)  # w_ih, w_hh[, b_ih, b_hh][, w_hr]
        x = self.tensor(input)
        if batch_first:
            x = self.transpose(x, [1, 0, 2])  # (B, T, I) -> (T, B, I)
        last_h, last_c = [], []
        for layer in range(num_layers):
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                own = weights[index * per_layer:(index + 1) * per_layer]
                w_ih, w_hh = own[:2]
                b_ih, b_hh = own[2:4] if has_biases else (None, None)
                w_hr = own[-1] if per_layer in (3, 5) else None  # proj_size > 0
                h = _row(self, h0, index)
                c = _row(self, c0, index) if c0 is not None else None
                y, h, c = _layer(self, kind, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse=direction == 1)
                outputs.append(y)
                last_h.append(h)
                last_c.append(c)
            x = outputs[0] if directions == 1 else _concat(self, outputs, 2)  # (T, B, D * H)
            if dropout and train and layer < num_layers - 1:
                x = self.emit("dropout", [x], self.shape(x), self.dtype(x), rate=float(dropout))
        if batch_first:
            x = self.transpose(x, [1, 0, 2])
        h_n = _concat(self, [_unsqueeze0(self, h) for h in last_h], 0)  # (L * D, B, H)
        if kind != "lstm":
            return x, h_n
        return x, h_n, _concat(self, [_unsqueeze0(self, c) for c in last_c], 0)

    return lower


def _layer(self, kind, x, h, c, w_ih, w_hh, b_ih, b_hh, w_hr, reverse):
    """One direction of one layer over the sequence x (T, B, I): (output (T, B, H), last h, last c)."""
    steps, dtype = self.shape(x)[0], self.dtype(x)
    gates = GATES[kind]
    size = self.shape(w_hh)[0] // gates  # H
    xw = _linear(self, x, w_ih, b_ih)  # (T, B, G * H): the input's share of every step at once
    w_hh_t = self.transpose(w_hh, [1, 0])  # laid out once for all steps
    w_hr_t = self.transpose(w_hr, [1, 0]) if w_hr is not None else None
    out = [None] * steps
    for t in (reversed(range(steps)) if reverse else range(steps)):
        xt = self.reshape(self.slice(xw, 0, t, t + 1), self.shape(xw)[1:])  # (B, G * H)
        hw = _matmul(self, h, w_hh_t)
        if b_hh is not None:
            hw = self.binary("add", hw, b_hh)
        if kind == "lstm":
            summed = self.binary("add", hw, xt)
            i, f, g, o = (_gate(self, summed, k, size) for k in range(4))
            i, f, o = (_unary(self, "sigmoid", v) for v in (i, f, o))
            c = self.binary("add", self.binary("mul", f, c), self.binary("mul", i, _unary(self, "tanh", g)))
            h = self.binary("mul", o, _unary(self, "tanh", c))
            if w_hr_t is not None:
                h = _matmul(self, h, w_hr_t)
        elif kind == "gru":
            r = _unary(self, "sigmoid", self.binary("add", _gate(self, hw, 0, size), _gate(self, xt, 0, size)))
            z = _unary(self, "sigmoid", self.binary("add", _gate(self, hw, 1, size), _gate(self, xt, 1, size)))
            n = _unary(self, "tanh", self.binary("add", _gate(self, xt, 2, size),
                                                  self.binary("mul", _gate(self, hw, 2, size), r)))
            h = self.binary("add", self.binary("mul", self.binary("sub", h, n), z), n)
        else:
            h = _unary(self, "tanh" if kind == "rnn_tanh" else "relu", self.binary("add", hw, xt))
        out[t] = _unsqueeze0(self, h)
    y = out[0] if steps == 1 else self.emit("concat", out, (steps, *self.shape(h)), dtype, axis=0)
    return y, h, c


def _linear(self, x, w, b):
    y = _matmul(self, x, self.transpose(w, [1, 0]))
    return y if b is None else self.binary("add", y, b)


def _matmul(self, a, b):
    shape = (*self.shape(a)[:-1], self.shape(b)[-1])
    return self.emit("matmul", [a, b], shape, self.dtype(a))


def _gate(self, x, k, size):
    return self.slice(x, len(self.shape(x)) - 1, k * size, (k + 1) * size)


def _unary(self, op, x):
    return self.emit(op, [x], self.shape(x), self.dtype(x))


def _row(self, x, index):
    """Row ``index`` of a stacked state (L * D, B, H): (B, H)."""
    return self.reshape(self.slice(x, 0, index, index + 1), self.shape(x)[1:])


def _unsqueeze0(self, x):
    return self.reshape(x, (1, *self.shape(x)))


def _concat(self, names, axis):
    if len(names) == 1:
        return names[0]
    shape = list(self.shape(names[0]))
    shape[axis] = sum(self.shape(n)[axis] for n in names)
    return self.emit("concat", names, shape, self.dtype(names[0]), axis=axis)


def packed_sequence_hint(error: BaseException) -> str:
    """What to do, if tracing stopped in a recurrent layer fed a packed sequence ("" otherwise):
    torch.export stops there at a size read from the lengths (a data-dependent size)."""
    layers = os.path.join(os.path.dirname(torch.nn.modules.rnn.__file__), "")
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_filename.startswith(layers) and any(
                isinstance(v, PackedSequence) for v in frame.f_locals.values()):
            return ("packed sequences (pack_padded_sequence) take each step's batch from the lengths in the data, "
                    "and the device runs one static graph: pad the sequences to one length, run the layer on "
                    "the padded batch, and pick each sequence's last step by index (or mask the padding)")
        tb = tb.tb_next
    return ""

