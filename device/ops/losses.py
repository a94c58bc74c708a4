"""Losses: per-example loss from logits and integer labels. A loss and what follows it run in fp32."""

from __future__ import annotations

import numpy as np

from device.ops.arrays import check_ids
from device.ops.record import FLOAT, INTEGER, OpRecord, Shape, per_input_element


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


RECORDS = (
    # flops per logit: the softmax, then one log per row
    OpRecord("sparse_softmax_cross_entropy", "-log softmax(logits)[label], per example", ("logits", "labels"), (),
             "loss", (FLOAT, INTEGER), _per_example_shape, _cross_entropy_forward, _cross_entropy_backward,
             cost=per_input_element(5), loss=True),
)
