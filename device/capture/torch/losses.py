"""Handlers of losses, each kept whole as one node at the user's line: cross entropy (and
log_softmax followed by nll_loss), binary cross entropy with logits, CTC.

Each handler takes the lowering, the FX node and the node's arguments by schema name
(``self`` spelled ``self_``), and returns the IR value name(s) of the node's result(s), or
None (``self.decline(reason)``) for a variant the device does not take. table.py maps the
aten ops onto them.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.fx

from device.capture.torch.lowering import _Lowering, _axis, _broadcast


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_loss(self: _Lowering, node, self_, target, weight, reduction, ignore_index):
    """log_softmax(logits) followed by nll_loss (or nll_loss2d) is the IR's cross_entropy_loss."""
    source = self_
    if not (isinstance(source, torch.fx.Node) and str(source.target) in ("aten._log_softmax.default",
                                                                          "aten.log_softmax.int")):
        return self.decline("nll_loss on something other than log_softmax")
    rank = len(source.meta["val"].shape)
    if _axis(source.args[1], rank) != min(1, rank - 1):
        return self.decline("log_softmax over an axis other than the classes (axis 1)")
    loss = _cross_entropy(self, node, source.args[0], target, weight, reduction, ignore_index, 0.0)
    return loss if loss is None else (loss, None)


def _cross_entropy(self: _Lowering, node, logits, target, weight, reduction, ignore_index, label_smoothing):
    """cross_entropy_loss over the classes at axis 1 ((N, C), (N, C, H, W), ...; (C,) unbatched)."""
    if weight is not None and weight not in self.known:
        return self.decline("weight (class weights) computed in the step (only a constant vector)", form="weight")
    if not isinstance(target, torch.fx.Node) or target.meta["val"].dtype.is_floating_point:
        return self.decline("class probabilities as the target (only class ids)", form="probabilities")
    shape, dtype = self.out(node) if not isinstance(node.meta["val"], (tuple, list)) else self.out(node, 0)
    z = self.tensor(logits)
    axis = min(1, len(self.shape(z)) - 1)
    attrs = {"axis": axis, "reduction": _REDUCTIONS[reduction], "ignore_index": int(ignore_index)}
    if label_smoothing:
        attrs["label_smoothing"] = float(label_smoothing)
    if weight is not None:
        attrs["weight"] = self.known[weight].double().flatten().tolist()
    return self.emit("cross_entropy_loss", [z, self.tensor(target)], shape, dtype, **attrs)


def _cross_entropy_loss(self: _Lowering, node, self_, target, weight=None, reduction=1, ignore_index=-100,
                        label_smoothing=0.0):
    return _cross_entropy(self, node, self_, target, weight, reduction, ignore_index, label_smoothing)


def _bce_with_logits(self: _Lowering, node, self_, target, weight=None, pos_weight=None, reduction=1):
    """One sigmoid_cross_entropy node; pos_weight (known at capture time) is its attribute, weight a
    multiply of the per-element loss, as torch applies them."""
    attrs = {}
    if pos_weight is not None:
        if pos_weight not in self.known or self.known[pos_weight].dim() > 1:
            return self.decline("pos_weight computed in the step (only a constant vector)", form="pos_weight")
        attrs["pos_weight"] = self.known[pos_weight].double().flatten().tolist()
    shape, dtype = self.out(node)
    x = self.tensor(self_)
    z = self.tensor(target, self.dtype(x))
    if self.shape(z) != self.shape(x):
        return self.decline(f"a target of shape {self.shape(z)} for logits of shape {self.shape(x)}")
    per_element = self.emit("sigmoid_cross_entropy", [x, z], self.shape(x), dtype, **attrs)
    if weight is not None:
        per_element = self.binary("mul", per_element, self.tensor(weight, dtype))
    if _REDUCTIONS[reduction] == "none":
        return per_element
    op = "reduce_mean" if _REDUCTIONS[reduction] == "mean" else "reduce_sum"
    return self.reduce(op, per_element, list(range(len(self.shape(x)))), False)


def _ctc_loss(self: _Lowering, node, log_probs, targets, input_lengths, target_lengths, blank, reduction,
              zero_infinity):
    """The ctc_loss record reads its targets as targets[targets_mask]: labels.masked_select(mask) (the
    targets transformers' Wav2Vec2 passes, whose size is the data's) is its labels and mask; padded (N, S)
    targets are masked below each target length; concatenated ones whole."""
    shape, dtype = self.out(node)
    lengths = self.tensor(target_lengths)
    if isinstance(targets, torch.fx.Node) and str(targets.target) == "aten.masked_select.default":
        labels, mask = (self.tensor(arg) for arg in targets.args)
        both = _broadcast(self.shape(labels), self.shape(mask))  # masked_select broadcasts its two
        labels, mask = (v if self.shape(v) == both else self.emit("broadcast_to", [v], both, self.dtype(v),
                                                                  shape=list(both)) for v in (labels, mask))
    else:
        labels = self.tensor(targets)
        if len(self.shape(labels)) == 2:
            positions = self.constant(np.arange(self.shape(labels)[1])[None], "int64", f"{node.name}.positions")
            column = self.reshape(lengths, self.shape(lengths) + (1,))
            mask = self.emit("less", [positions, column], self.shape(labels), "bool")
        else:
            mask = self.constant(np.ones(self.shape(labels), dtype=bool), "bool", f"{node.name}.mask")
    return self.emit("ctc_loss", [self.tensor(log_probs), labels, self.tensor(input_lengths), lengths, mask],
                     shape, dtype, blank=int(blank), reduction=reduction, zero_infinity=bool(zero_infinity))
