"""Losses: from logits and labels, each one fused record so that findings name the user's loss.
A loss and what follows it run in fp32."""

from __future__ import annotations

import numpy as np

from device.ops.arrays import check_ids
from device.ops.record import FLOAT, INTEGER, OpRecord, Shape, per_element, per_input_element, same_shape


def _cross_entropy_forward(inputs, attrs, ctx):
    logits, labels = inputs  # (..., C), (...) ints -> per-example loss (...)
    check_ids(labels, logits.shape[-1], "labels")
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    picked = np.take_along_axis(shifted, labels[..., None], axis=-1)
    loss = (np.log(total) - picked)[..., 0]
    return [loss], (e / total, labels)


def _cross_entropy_backward(saved, grads, attrs, needs):
    probs, labels = saved
    g = grads[0][..., None]  # (..., 1)
    dlogits = probs * g  # softmax - one_hot(label), times the upstream gradient
    index = labels[..., None]
    np.put_along_axis(dlogits, index, np.take_along_axis(dlogits, index, axis=-1) - g, axis=-1)
    return [dlogits, None]


def _per_example_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    return [tuple(shapes[0][:-1])]  # logits (..., C) -> (...)


# ---- vision and losses ----


def _sigmoid_cross_entropy_forward(inputs, attrs, ctx):
    x, z = inputs  # logits and targets in [0, 1], the same shape
    pos_weight = attrs.get("pos_weight")
    if pos_weight is None:
        # max(x, 0) - x z + log(1 + e^-|x|): no overflow for any x (TF's and torch's stable form)
        return [np.maximum(x, 0) - x * z + np.log1p(np.exp(-np.abs(x)))], (x, z, None)
    # torch's pos_weight p (broadcast along the last axis): (1 - z) x + (1 + (p - 1) z) softplus(-x)
    p = np.asarray(pos_weight, dtype=x.dtype)
    softplus_neg = np.maximum(-x, 0) + np.log1p(np.exp(-np.abs(x)))  # log(1 + e^-x), no overflow
    return [(1 - z) * x + (1 + (p - 1) * z) * softplus_neg], (x, z, (p, softplus_neg))


def _sigmoid_cross_entropy_backward(saved, grads, attrs, needs):
    x, z, weighted = saved
    g = grads[0]
    sigmoid = np.exp(-np.logaddexp(0, -x)).astype(x.dtype, copy=False)  # 1 / (1 + e^-x), no overflow
    if weighted is None:
        return [(sigmoid - z) * g if needs[0] else None, -x * g if needs[1] else None]
    p, softplus_neg = weighted
    # d/dx softplus(-x) = -(1 - sigmoid(x))
    dx = ((1 - z) - (1 + (p - 1) * z) * (1 - sigmoid)) * g if needs[0] else None
    dz = (-x + (p - 1) * softplus_neg) * g if needs[1] else None
    return [dx, dz]


REDUCTIONS = ("none", "mean", "sum")


def _class_last(logits: np.ndarray, attrs: dict) -> tuple[np.ndarray, int]:
    axis = attrs.get("axis", -1) % logits.ndim
    return np.moveaxis(logits, axis, -1), axis


def _cross_entropy_loss_forward(inputs, attrs, ctx):
    logits, labels = inputs
    z, axis = _class_last(logits, attrs)  # (..., C)
    classes = z.shape[-1]
    ignore = attrs.get("ignore_index")
    keep = labels != ignore if ignore is not None else np.ones(labels.shape, dtype=bool)  # (...)
    picked_labels = np.where(keep, labels, 0)
    check_ids(picked_labels, classes, "labels")
    shifted = z - z.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=-1, keepdims=True)
    log_p = shifted - np.log(total)
    nll = -np.take_along_axis(log_p, picked_labels[..., None], axis=-1)[..., 0]
    eps = float(attrs.get("label_smoothing") or 0.0)
    weight = attrs.get("weight")  # class weights, as torch's: w[label] scales an example, sum(w[label]) divides
    w = np.ones(classes, dtype=z.dtype) if weight is None else np.asarray(weight, dtype=z.dtype)
    picked_weight = np.where(keep, w[picked_labels], 0).astype(z.dtype, copy=False)  # (...)
    # label smoothing as torch: (1 - eps) w[label] nll + eps / C * (-sum over the classes of w log p)
    per_example = picked_weight * nll
    if eps:
        per_example = (1 - eps) * per_example - (eps / classes) * np.where(keep, (log_p * w).sum(axis=-1), 0)
    per_example = per_example.astype(z.dtype, copy=False)
    reduction = attrs.get("reduction", "mean")
    divisor = picked_weight.sum(dtype=z.dtype)  # the number of labels not ignored, unweighted
    if reduction == "none":
        loss = per_example
    elif reduction == "sum":
        loss = np.asarray(per_example.sum(), dtype=z.dtype)
    else:  # the (weighted) mean over the labels not ignored: NaN over no weight, as torch (whose
        # likelihood term is then 0 / 0 even where label smoothing's is not 0)
        loss = np.asarray(per_example.sum() / divisor if divisor else np.nan, dtype=z.dtype)
    return [loss], (e / total, picked_labels, keep, picked_weight, w, axis, divisor)


def _cross_entropy_loss_backward(saved, grads, attrs, needs):
    probs, labels, keep, picked_weight, w, axis, divisor = saved
    classes = probs.shape[-1]
    eps = float(attrs.get("label_smoothing") or 0.0)
    reduction = attrs.get("reduction", "mean")
    g = grads[0] if reduction == "none" else np.broadcast_to(grads[0], keep.shape)
    if reduction == "mean":
        # over no weight: NaN where a label is kept (its weight 0 over 0), 0 where ignored, as torch
        g = g / divisor if divisor else np.full(np.shape(g), np.nan, dtype=probs.dtype)
    g = np.where(keep, g, 0).astype(probs.dtype, copy=False)[..., None]  # (..., 1)
    # d/dz of each example: (1 - eps) w[label] (softmax - one_hot(label)) + eps / C (sum(w) softmax - w)
    dz = (1 - eps) * picked_weight[..., None] * probs
    index = labels[..., None]
    np.put_along_axis(dz, index, np.take_along_axis(dz, index, axis=-1) - (1 - eps) * picked_weight[..., None],
                      axis=-1)
    if eps:
        dz += (eps / classes) * (w.sum() * probs - w)
    return [np.moveaxis(dz * g, -1, axis), None]


def _cross_entropy_loss_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    logits, labels = tuple(shapes[0]), tuple(shapes[1])
    axis = attrs.get("axis", -1) % len(logits)
    if attrs.get("reduction", "mean") not in REDUCTIONS:
        raise ValueError(f"reduction {attrs.get('reduction')!r} is not one of {', '.join(REDUCTIONS)}")
    if not 0.0 <= float(attrs.get("label_smoothing") or 0.0) <= 1.0:
        raise ValueError(f"label_smoothing {attrs.get('label_smoothing')} is not in [0, 1]")
    per_example = logits[:axis] + logits[axis + 1:]
    weight = attrs.get("weight")
    if weight is not None and logits[axis] is not None and len(weight) != logits[axis]:
        raise ValueError(f"weight has {len(weight)} entries for {logits[axis]} classes")
    if len(per_example) != len(labels) or any(a is not None and b is not None and a != b
                                              for a, b in zip(per_example, labels)):
        raise ValueError(f"labels of shape {labels} do not fit logits of shape {logits} with classes on axis {axis}")
    return [per_example if attrs.get("reduction", "mean") == "none" else ()]


RECORDS = (
    # flops per logit: the softmax, then one log per row
    OpRecord("sparse_softmax_cross_entropy", "-log softmax(logits)[label], per example", ("logits", "labels"), (),
             "loss", (FLOAT, INTEGER), _per_example_shape, _cross_entropy_forward, _cross_entropy_backward,
             cost=per_input_element(5), loss=True),
    # vision and losses: torch's BCEWithLogitsLoss and TF's sigmoid_cross_entropy_with_logits
    OpRecord("sigmoid_cross_entropy", "max(x, 0) - x * z + log(1 + e ** -abs(x)): binary cross-entropy of logits x "
             "and targets z, elementwise; pos_weight (along the last axis) weighs the positive term as torch's",
             ("logits", "targets"), ("pos_weight?",), "loss", (FLOAT, FLOAT), same_shape,
             _sigmoid_cross_entropy_forward, _sigmoid_cross_entropy_backward, cost=per_element(7), loss=True),
    # torch's cross_entropy whole: classes on any axis, ignore_index, label_smoothing, its reductions
    OpRecord("cross_entropy_loss", "-log softmax(logits)[label] along axis, label-smoothed and class-weighted as "
             "torch; labels equal to ignore_index count nothing; reduction none, sum, or mean over the labels not "
             "ignored", ("logits", "labels"), ("axis", "reduction", "ignore_index?", "label_smoothing?", "weight?"),
             "loss",
             (FLOAT, INTEGER), _cross_entropy_loss_shape, _cross_entropy_loss_forward, _cross_entropy_loss_backward,
             cost=per_input_element(6), loss=True),
)
