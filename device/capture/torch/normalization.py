"""Handlers of normalization: softmax and log_softmax, layer norm, batch norm, group norm.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import numpy as np

from device.capture.torch.lowering import _Lowering, _axis


def _softmax(op: str):
    def lower(self: _Lowering, node, self_, dim, half_to_float=False, dtype=None):
        shape, out_dtype = self.out(node)
        x = self.tensor(self_, out_dtype)
        return self.emit(op, [x], shape, out_dtype, axis=_axis(dim, len(shape)))
    return lower


def _ones_or(self: _Lowering, arg, shape, fill: float, dtype: str, hint: str) -> str:
    """An optional affine parameter: the tensor, or a constant of ones/zeros when absent."""
    return self.tensor(arg) if arg is not None else self.constant(np.full(shape, fill), dtype, hint)


def _layer_norm(self: _Lowering, node, input, normalized_shape, weight, bias, eps):
    shape, dtype = self.out(node, 0)
    x = self.tensor(input)
    rank = len(shape)
    gamma = _ones_or(self, weight, normalized_shape, 1.0, dtype, f"{node.name}.gamma")
    beta = _ones_or(self, bias, normalized_shape, 0.0, dtype, f"{node.name}.beta")
    y = self.emit("layer_norm", [x, gamma, beta], shape, dtype,
                  axes=list(range(rank - len(normalized_shape), rank)), eps=float(eps))
    return y, None, None


def _batch_norm(self: _Lowering, node, input, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch norm in training form: outputs (y, new running mean, new running var).

    The runtime writes the two new statistics back into the state inputs (the batch_norm
    record's state_updates, device/ops/normalization.py). momentum is torch's:
    new = (1 - momentum) * running + momentum * batch.
    """
    if not training:
        return self.decline("batch norm in eval form inside a training step")
    shape, dtype = self.out(node, 0)
    channels = (shape[1],)
    gamma = _ones_or(self, weight, channels, 1.0, dtype, f"{node.name}.gamma")
    beta = _ones_or(self, bias, channels, 0.0, dtype, f"{node.name}.beta")
    mean, var = self.tensor(running_mean), self.tensor(running_var)
    outputs = [self.new_value(shape, dtype),
               self.new_value(self.shape(mean), self.dtype(mean), f"{node.name}.running_mean"),
               self.new_value(self.shape(var), self.dtype(var), f"{node.name}.running_var")]
    self.g.add_node("batch_norm", [self.tensor(input), gamma, beta, mean, var], outputs,
                    {"axis": 1, "eps": float(eps), "momentum": float(momentum)}, self.loc, name=outputs[0])
    return outputs[0], None, None, outputs[1], outputs[2]


def _group_norm(self: _Lowering, node, input, weight, bias, N, C, HxW, group, eps):
    """Each example's channels in ``group`` groups, each normalised over its channels and positions:
    the layer norm of (N, group, C / group * HxW), then the per-channel scale and shift."""
    shape, dtype = self.out(node, 0)
    per_group = int(C) // int(group) * int(HxW)
    x = self.reshape(self.tensor(input), (shape[0], int(group), per_group))
    gamma = self.constant(np.ones(per_group), dtype, f"{node.name}.gamma")
    beta = self.constant(np.zeros(per_group), dtype, f"{node.name}.beta")
    y = self.emit("layer_norm", [x, gamma, beta], self.shape(x), dtype, axes=[2], eps=float(eps))
    y = self.reshape(y, shape)
    channels = (int(C),) + (1,) * (len(shape) - 2)
    if weight is not None:
        y = self.emit("mul", [y, self.reshape(self.tensor(weight), channels)], shape, dtype)
    if bias is not None:
        y = self.emit("add", [y, self.reshape(self.tensor(bias), channels)], shape, dtype)
    return y, None, None
