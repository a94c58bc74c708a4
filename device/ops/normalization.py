"""Softmax and the normalisations: layer norm, and batch norm with its running statistics."""

from __future__ import annotations

import numpy as np

from device.ops.arrays import param_shape, reduce_rows
from device.ops.record import FLOAT, OpRecord, Shape, per_element, reduction_axes, same_shape
from zoo_base.errors import UserError


def _softmax_forward(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs["axis"]
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    return [y], y


def _softmax_backward(saved, grads, attrs, needs):
    y, g = saved, grads[0]
    return [y * (g - (g * y).sum(axis=attrs["axis"], keepdims=True))]


def _log_softmax_forward(inputs, attrs, ctx):
    x = inputs[0]
    axis = attrs["axis"]
    shifted = x - x.max(axis=axis, keepdims=True)
    y = shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))
    return [y], y


def _log_softmax_backward(saved, grads, attrs, needs):
    y, g = saved, grads[0]
    return [g - np.exp(y) * g.sum(axis=attrs["axis"], keepdims=True)]


def _sum_over(x, axes: tuple[int, ...], keepdims: bool = False):
    """x summed over ``axes`` pairwise whatever the layout (arrays.reduce_rows; tests/gallery/forward_error.py
    measured the layer-by-layer error it removes)."""
    return reduce_rows(np.sum, x, axes, keepdims)


def _mean_over(x, axes: tuple[int, ...], keepdims: bool = False):
    count = x.size // max(1, int(np.prod([x.shape[i] for i in range(x.ndim) if i not in axes])))
    return _sum_over(x, axes, keepdims) / x.dtype.type(count)


def _normalize_backward(g, xhat, rstd, gamma_b, axes):
    """dL/dx of y = xhat * gamma + beta where xhat = (x - mean(x)) * rstd over ``axes``."""
    dxhat = g * gamma_b
    return rstd * (dxhat - _mean_over(dxhat, axes, keepdims=True)
                   - xhat * _mean_over(dxhat * xhat, axes, keepdims=True))


def _layer_norm_forward(inputs, attrs, ctx):
    x, gamma, beta = inputs  # gamma, beta: the shape of x's dims at ``axes``
    axes = reduction_axes(attrs["axes"], x.ndim)
    pshape = param_shape(x.ndim, axes, x.shape)
    mean = x.mean(axis=axes, keepdims=True)
    xc = x - mean
    rstd = 1 / np.sqrt((xc * xc).mean(axis=axes, keepdims=True) + float(attrs["eps"]))  # biased variance
    xhat = xc * rstd
    return [xhat * gamma.reshape(pshape) + beta.reshape(pshape)], (xhat, rstd, gamma, pshape, axes)


def _layer_norm_backward(saved, grads, attrs, needs):
    xhat, rstd, gamma, pshape, axes = saved
    g = grads[0]
    others = tuple(i for i in range(g.ndim) if i not in axes)
    dgamma = (g * xhat).sum(axis=others).reshape(gamma.shape)
    dbeta = g.sum(axis=others).reshape(gamma.shape)
    return [_normalize_backward(g, xhat, rstd, gamma.reshape(pshape), axes), dgamma, dbeta]


def _batch_norm_forward(inputs, attrs, ctx):
    x, gamma, beta, running_mean, running_var = inputs  # x: channels at ``axis``; the rest (C,)
    axis = attrs["axis"] % x.ndim
    others = tuple(i for i in range(x.ndim) if i != axis)
    pshape = param_shape(x.ndim, (axis,), x.shape)  # [1, C, 1, 1] for NCHW
    momentum = float(attrs["momentum"])
    if ctx.training:
        n = x.size // x.shape[axis]
        if n < 2:
            raise UserError(f"batch_norm in training needs more than one value per channel, got input {x.shape}")
        mean = _mean_over(x, others)
        xc = x - mean.reshape(pshape)
        var = _mean_over(xc * xc, others)  # biased: normalises the batch
        # torch's convention: new = (1 - m) * old + m * batch
        new_mean = (1 - momentum) * running_mean + momentum * mean
        # torch averages the unbiased batch variance, Keras the biased one (attr unbiased_var=False)
        correction = n / (n - 1) if attrs.get("unbiased_var", True) else 1.0
        new_var = (1 - momentum) * running_var + momentum * correction * var
    else:
        var = running_var
        xc = x - running_mean.reshape(pshape)
        new_mean, new_var = running_mean, running_var
    rstd = (1 / np.sqrt(var + float(attrs["eps"]))).reshape(pshape)
    xhat = xc * rstd
    y = xhat * gamma.reshape(pshape) + beta.reshape(pshape)
    return [y, new_mean, new_var], (xhat, rstd, gamma, pshape, others, ctx.training)


def _batch_norm_backward(saved, grads, attrs, needs):
    xhat, rstd, gamma, pshape, others, training = saved
    g = grads[0]
    dgamma = _sum_over(g * xhat, others)
    dbeta = _sum_over(g, others)
    if training:
        dx = _normalize_backward(g, xhat, rstd, gamma.reshape(pshape), others)
    else:  # fixed statistics: an affine map
        dx = g * (gamma.reshape(pshape) * rstd)
    return [dx, dgamma, dbeta, None, None]


def _batch_norm_shape(shapes: list[Shape], attrs: dict) -> list[Shape]:
    """y like x, and the new running mean and variance like the old."""
    return [tuple(shapes[0]), tuple(shapes[3]), tuple(shapes[4])]


RECORDS = (
    # flops per element: max, subtract, exp, sum, divide (or log)
    OpRecord("softmax", "exp(x) / sum(exp(x)) along axis", ("x",), ("axis",), "softmax", (FLOAT,), same_shape,
             _softmax_forward, _softmax_backward, cost=per_element(5)),
    OpRecord("log_softmax", "x - log(sum(exp(x))) along axis", ("x",), ("axis",), "softmax", (FLOAT,), same_shape,
             _log_softmax_forward, _log_softmax_backward, cost=per_element(5)),
    # flops per element: mean, subtract, square, mean, rsqrt, scale, gamma, beta
    OpRecord("layer_norm", "(x - mean) / sqrt(var + eps) * gamma + beta over axes (biased variance)",
             ("x", "gamma", "beta"), ("axes", "eps"), "layer_norm", (FLOAT, FLOAT, FLOAT), same_shape,
             _layer_norm_forward, _layer_norm_backward, cost=per_element(8)),
    # training normalises by the batch statistics and updates the running ones (state):
    # new = (1 - momentum) * old + momentum * batch, torch's convention; unbiased_var (default
    # true, as torch): the running variance averages the unbiased batch variance (Keras: the
    # biased one). Outputs: y, or (y, new running mean, new running var).
    OpRecord("batch_norm", "normalise x over every axis but axis; training updates the running statistics",
             ("x", "gamma", "beta", "running_mean", "running_var"),
             ("axis", "eps", "momentum", "unbiased_var?"),
             "batch_norm", (FLOAT,) * 5, _batch_norm_shape, _batch_norm_forward, _batch_norm_backward,
             dtype=lambda dtypes, attrs: [dtypes[0], dtypes[3], dtypes[4]], cost=per_element(8),
             state_updates=((1, 3), (2, 4)),
             fresh_state={3: 0.0, 4: 1.0}),  # running mean 0, variance 1: what the frameworks start from
)
