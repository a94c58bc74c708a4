"""Losses: from logits and labels, each one fused record so that findings name the user's loss.
A loss and what follows it run in fp32."""

from __future__ import annotations

import numpy as np

from device.ops.arrays import check_ids
from device.ops.record import FLOAT, INTEGER, OpRecord, Shape, per_element, per_input_element, same_shape
from zoo_base.errors import UserError


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


# ---- audio: CTC ----


def _log_sum(*terms):
    """log(sum(exp(terms))) elementwise, shifted by the largest term (a row of -inf gives -inf), in the
    terms' dtype: torch's CTC kernel adds its three paths the same way."""
    top = np.maximum.reduce(terms)
    shift = np.where(np.isneginf(top), top.dtype.type(0), top)
    with np.errstate(divide="ignore"):  # log(0): -inf, a state no alignment reaches
        return np.log(sum(np.exp(t - shift) for t in terms)) + shift


def _ctc_examples(inputs):
    """(the extended labels (N, 2 L + 1): blanks around each target, the input and target lengths), read
    from the targets as torch reads its concatenated form: targets[targets_mask] in row-major order (as
    torch.masked_select), each example taking the next target_lengths[n] of them."""
    log_probs, targets, input_lengths, target_lengths, mask = inputs
    steps, batch, classes = log_probs.shape
    il, tl = input_lengths.astype(np.int64), target_lengths.astype(np.int64)
    if il.size and (il.min() < 1 or il.max() > steps):
        raise UserError(f"input_lengths in [{il.min()}, {il.max()}], expected [1, {steps}] (the log_probs' "
                        f"{steps} steps)")
    if tl.size and tl.min() < 0:
        raise UserError(f"target_lengths has a negative value ({tl.min()})")
    flat = targets[mask]
    if tl.sum() != flat.size:  # torch's check, for padded targets: no target longer than a row
        raise UserError(f"target_lengths add up to {tl.sum()} labels, the targets hold {flat.size}")
    check_ids(flat, classes, "targets")
    return flat, il, tl


def _ctc_forward(inputs, attrs, ctx):
    log_probs = inputs[0]  # (T, N, C)
    flat, il, tl = _ctc_examples(inputs)
    steps, batch, _ = log_probs.shape
    blank = int(attrs.get("blank", 0))
    states = 2 * int(tl.max(initial=0)) + 1
    ext = np.full((batch, states), blank, dtype=np.int64)  # (N, S): blank, l1, blank, l2, ..., blank
    starts = np.concatenate([[0], np.cumsum(tl)[:-1]]).astype(np.int64)
    for n in range(batch):
        ext[n, 1:2 * tl[n]:2] = flat[starts[n]:starts[n] + tl[n]]
    s = np.arange(states)
    valid = s[None] <= 2 * tl[:, None]  # (N, S)
    # a label may follow the one two states back when it differs from it (and is no blank)
    skip = np.zeros((batch, states), dtype=bool)
    skip[:, 2:] = (ext[:, 2:] != blank) & (ext[:, 2:] != ext[:, :-2])
    picked = log_probs[:, np.arange(batch)[:, None], ext]  # (T, N, S): log_probs[t, n, ext[n, s]]
    neg = np.full((batch, states), -np.inf, dtype=log_probs.dtype)
    alpha = np.empty((steps, batch, states), dtype=log_probs.dtype)
    first = neg.copy()
    first[:, 0] = picked[0, :, 0]
    if states > 1:
        first[:, 1] = np.where(tl > 0, picked[0, :, 1], -np.inf)
    alpha[0] = first
    for t in range(1, steps):
        prev = alpha[t - 1]
        one = np.concatenate([neg[:, :1], prev[:, :-1]], axis=1)
        two = np.where(skip, np.concatenate([neg[:, :2], prev[:, :-2]], axis=1), -np.inf)
        alpha[t] = np.where(valid, _log_sum(prev, one, two) + picked[t], -np.inf)
    # beta: from each example's last step backwards, log_probs[t] included (as torch's)
    last = il - 1
    beta = np.empty_like(alpha)
    skip_next = np.zeros_like(skip)
    skip_next[:, :-2] = skip[:, 2:]
    end = np.where(valid & (s[None] >= 2 * tl[:, None] - 1), 0.0, -np.inf).astype(log_probs.dtype)
    for t in range(steps - 1, -1, -1):
        if t == steps - 1:
            later = neg
        else:
            nxt = beta[t + 1]
            one = np.concatenate([nxt[:, 1:], neg[:, :1]], axis=1)
            two = np.where(skip_next, np.concatenate([nxt[:, 2:], neg[:, :2]], axis=1), -np.inf)
            later = np.where(valid, _log_sum(nxt, one, two), -np.inf)
        here = np.where((t == last)[:, None], end, later)
        beta[t] = np.where((t > last)[:, None], -np.inf, here + picked[t])
    at_end = alpha[last, np.arange(batch)]  # (N, S) at each example's last step
    final = np.take_along_axis(at_end, np.stack([2 * tl, np.maximum(2 * tl - 1, 0)], axis=1), axis=1)
    final[:, 1] = np.where(tl > 0, final[:, 1], -np.inf)
    nll = -_log_sum(final[:, 0], final[:, 1])  # (N,)
    infinite = np.isposinf(nll)
    if attrs.get("zero_infinity"):
        nll = np.where(infinite, log_probs.dtype.type(0), nll)
    reduction = attrs.get("reduction", "mean")
    if reduction == "none":
        loss = nll.astype(log_probs.dtype, copy=False)
    elif reduction == "sum":
        loss = np.asarray(nll.sum(), dtype=log_probs.dtype)
    else:  # torch's mean: each loss over its target length (at least 1), then over the batch
        loss = np.asarray((nll / np.maximum(tl, 1).astype(log_probs.dtype)).mean(), dtype=log_probs.dtype)
    return [loss], (log_probs, ext, alpha, beta, -nll, il, tl, infinite)


def _ctc_backward(saved, grads, attrs, needs):
    log_probs, ext, alpha, beta, log_likelihood, il, tl, infinite = saved
    steps, batch, classes = log_probs.shape
    dtype = log_probs.dtype
    reduction = attrs.get("reduction", "mean")
    g = np.broadcast_to(np.asarray(grads[0], dtype=dtype), (batch,) if reduction == "none" else ())
    if reduction == "none":
        per_example = g
    elif reduction == "sum":
        per_example = np.broadcast_to(g, (batch,))
    else:
        per_example = g / np.maximum(tl, 1).astype(dtype) / dtype.type(batch)
    # log of sum over the states s labelled c of alpha[t, s] beta[t, s], per step, example and class
    both = alpha + beta  # (T, N, S)
    top = both.max(axis=2, keepdims=True)
    top = np.where(np.isneginf(top), dtype.type(0), top)
    shares = np.exp(both - top)
    total = np.zeros((steps, batch, classes), dtype=dtype)
    rows = np.arange(batch)
    for s in range(ext.shape[1]):  # within one state the examples' classes are distinct rows
        total[:, rows, ext[:, s]] += shares[:, :, s]
    with np.errstate(divide="ignore"):
        log_both = np.log(total) + top
    # torch's gradient (LossCTC.cpp): exp(log_probs) - exp(log_both - log_likelihood - log_probs), the
    # gradient of the loss through a log_softmax that made log_probs, as its kernel gives it
    grad = np.exp(log_probs) - np.exp(log_both - log_likelihood[None, :, None] - log_probs)
    grad = grad * per_example[None, :, None]
    beyond = np.arange(steps)[:, None] >= il[None, :]  # (T, N): steps past each example's input
    if attrs.get("zero_infinity"):
        beyond = beyond | infinite[None, :]
    grad = np.where(beyond[:, :, None], dtype.type(0), grad).astype(dtype, copy=False)
    return [grad, None, None, None, None]


def _ctc_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    log_probs, targets, input_lengths, target_lengths, mask = (tuple(s) for s in shapes)
    if attrs.get("reduction", "mean") not in REDUCTIONS:
        raise ValueError(f"reduction {attrs.get('reduction')!r} is not one of {', '.join(REDUCTIONS)}")
    if len(log_probs) != 3:
        raise ValueError(f"log_probs of shape {log_probs} are not (steps, batch, classes)")
    if tuple(mask) != tuple(targets):
        raise ValueError(f"targets_mask of shape {mask} is not the targets' {targets}")
    for name, lengths in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if lengths != (log_probs[1],):
            raise ValueError(f"{name} of shape {lengths} do not give one length per example of {log_probs}")
    return [(log_probs[1],) if attrs.get("reduction", "mean") == "none" else ()]


def _ctc_cost(work) -> tuple[float, float]:
    """Per step, example and state of the alpha recursion: 3 exps, 3 subtractions, 2 adds, a log and a
    max (10 flops; the backward's beta recursion the same again, see backward_ratio); the states from the
    targets' shape: 2 labels + 1 per target slot of an example."""
    steps, batch, _ = (d or 0 for d in work.inputs[0])
    targets = work.numel(work.inputs[1])
    states = 2 * targets / max(batch, 1) + 1
    return 10.0 * steps * batch * states, work.moved


RECORDS += (
    # torch's F.ctc_loss / nn.CTCLoss: blank, reduction, zero_infinity; targets padded (N, S) or concatenated,
    # both read through targets_mask (the frontend's: positions below each target length, or a
    # masked_select's mask); forward-backward in log space in the log_probs' dtype, as torch's CPU kernel
    OpRecord("ctc_loss", "connectionist temporal classification: -log of the probability of the targets "
             "(targets[targets_mask], the next target_lengths[n] for example n) summed over their alignments to "
             "log_probs (T, N, C) up to input_lengths[n], blank between labels; reduction none, sum, or mean of "
             "the losses over their target lengths; zero_infinity: an impossible alignment counts 0",
             ("log_probs", "targets", "input_lengths", "target_lengths", "targets_mask"),
             ("blank", "reduction", "zero_infinity?"), "loss", (FLOAT, INTEGER, INTEGER, INTEGER, ("bool",)),
             _ctc_shape, _ctc_forward, _ctc_backward, cost=_ctc_cost, backward_ratio=2.0, loss=True),
)
