"""Kernels and update rules whose semantics are TensorFlow's, against TensorFlow itself.

TF's "SAME" padding, its pooling (SAME average pooling divides by the unpadded count),
its activations and losses, and the "tf" semantics of device/runtime/optimizers.py
against tf.compat.v1.train (and keras AdamW). torch-free: skipped where TF is missing.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from device.ops import OPS, KernelContext  # noqa: E402
from device.optimizer import OptimizerSpec  # noqa: E402
from device.runtime.optimizers import Optimizer, clip_by_global_norm  # noqa: E402

RNG = np.random.default_rng(99)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _check(op, inputs, attrs, tf_fn, rtol=1e-5, atol=1e-5, training=True, state_inputs=()):
    """Forward and gradient of OPS[op] against tf_fn under a GradientTape, in float32.

    state_inputs: positions of non-trainable inputs (running statistics), which get no
    gradient from the kernel though TF would differentiate them.
    """
    kernel = OPS[op]
    outputs, saved = kernel.forward(inputs, attrs, KernelContext(training=training))
    tensors = [tf.constant(x) for x in inputs]
    floating = [t for t in tensors if t.dtype.is_floating]
    with tf.GradientTape() as tape:
        tape.watch(floating)
        expected = tf_fn(*tensors)
    np.testing.assert_allclose(outputs[0], expected.numpy(), rtol=rtol, atol=atol)
    g = RNG.standard_normal(expected.shape).astype(np.float32)
    expected_grads = iter(tape.gradient(expected, floating, output_gradients=tf.constant(g)))
    grads = kernel.backward(saved, [g], attrs, tuple(True for _ in inputs))
    for i, (x, got) in enumerate(zip(inputs, grads)):
        if not np.issubdtype(x.dtype, np.floating):
            assert got is None
            continue
        expected_grad = next(expected_grads)
        if i in state_inputs:
            assert got is None
        else:
            np.testing.assert_allclose(got, expected_grad.numpy(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("x_shape, w_shape, strides, padding", [
    ((2, 8, 8, 3), (3, 3, 3, 4), [2, 2], "SAME"),  # pads 0 before, 1 after
    ((2, 7, 6, 3), (3, 2, 3, 4), [1, 2], "SAME"),
    ((2, 7, 7, 3), (3, 3, 3, 2), [2, 2], "VALID"),
])
def test_conv2d_matches_tf(x_shape, w_shape, strides, padding):
    attrs = {"strides": strides, "padding": padding, "dilations": [1, 1], "layout": "NHWC", "weight_layout": "HWIO"}
    _check("conv2d", [randn(*x_shape), randn(*w_shape)], attrs,
           lambda x, w: tf.nn.conv2d(x, w, strides=[1, *strides, 1], padding=padding))


# Dilated convolutions. TF's CPU build has no gradient kernel for dilation > 1 on many x86-64
# CPUs (Conv2DBackpropInput: "Current CPU implementations do not yet support dilation rates
# larger than 1"; seen on AVX2+FMA without AVX-512), so dilation is checked against TF through
# the equivalent undilated convolution with a kernel spread out by zeros, which every TF build
# can differentiate, and against TF's own dilated kernel only where the build has it.
# tests/device/test_kernels_numpy.py checks the same cases against a direct loop convolution.
DILATED = pytest.mark.parametrize("x_shape, w_shape, strides, dilations, padding", [
    ((2, 9, 9, 2), (3, 3, 2, 3), [1, 1], [2, 2], "SAME"),
    ((2, 8, 7, 3), (2, 3, 3, 2), [1, 1], [3, 2], "SAME"),  # odd total padding: the extra pixel at the end
    ((2, 9, 8, 2), (3, 2, 2, 3), [1, 1], [2, 3], "VALID"),
])


def _spread(w, dilations):
    """HWIO kernel (kh, kw, C, O) -> ((kh-1)*dh+1, (kw-1)*dw+1, C, O) with d-1 zeros between taps.

    A convolution with it at dilation 1 is the dilated convolution, SAME padding included
    (TF pads for the dilated extent). Built with matmuls so that TF differentiates it.
    """
    (kh, kw), (dh, dw) = w.shape[:2], dilations
    rows = np.zeros(((kh - 1) * dh + 1, kh), np.float32)
    rows[np.arange(kh) * dh, np.arange(kh)] = 1
    cols = np.zeros(((kw - 1) * dw + 1, kw), np.float32)
    cols[np.arange(kw) * dw, np.arange(kw)] = 1
    return tf.einsum("ai,bj,ijco->abco", rows, cols, w)


@functools.cache
def _tf_lacks_dilated_conv_gradient() -> str:
    """The error of TF's dilated Conv2D gradient on this machine's CPU build, or "" where it has one."""
    x, w = tf.ones((1, 5, 5, 1)), tf.ones((2, 2, 1, 1))
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = tf.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2)
    try:
        tape.gradient(y, [x, w])
    except tf.errors.InvalidArgumentError as e:
        if "dilation" not in e.message:
            raise
        return re.sub(r"^\{\{.*?\}\}\s*|\s*name:\s*$", "", e.message)  # TF's function-node prefix, empty name
    return ""


@DILATED
def test_dilated_conv2d_matches_tf_through_a_spread_kernel(x_shape, w_shape, strides, dilations, padding):
    attrs = {"strides": strides, "padding": padding, "dilations": dilations, "layout": "NHWC", "weight_layout": "HWIO"}
    _check("conv2d", [randn(*x_shape), randn(*w_shape)], attrs,
           lambda x, w: tf.nn.conv2d(x, _spread(w, dilations), strides=[1, *strides, 1], padding=padding))


@DILATED
def test_dilated_conv2d_matches_tf_dilated_kernel(x_shape, w_shape, strides, dilations, padding):
    gap = _tf_lacks_dilated_conv_gradient()
    if gap:
        pytest.skip(f"this CPU's TensorFlow build has no gradient of a dilated Conv2D ({gap}); "
                    "dilation is checked through a spread kernel and a loop reference instead")
    attrs = {"strides": strides, "padding": padding, "dilations": dilations, "layout": "NHWC", "weight_layout": "HWIO"}
    _check("conv2d", [randn(*x_shape), randn(*w_shape)], attrs,
           lambda x, w: tf.nn.conv2d(x, w, strides=[1, *strides, 1], padding=padding, dilations=[1, *dilations, 1]))


@pytest.mark.parametrize("op, tf_pool", [("max_pool2d", tf.nn.max_pool2d), ("avg_pool2d", tf.nn.avg_pool2d)])
@pytest.mark.parametrize("shape, kernel, strides, padding", [
    ((2, 6, 6, 3), 3, 2, "SAME"),  # asymmetric padding; SAME averages exclude it
    ((2, 5, 7, 2), 2, 1, "SAME"),
    ((2, 7, 7, 3), 3, 2, "VALID"),
])
def test_pooling_matches_tf(op, tf_pool, shape, kernel, strides, padding):
    attrs = {"kernel": kernel, "strides": strides, "padding": padding, "layout": "NHWC"}
    _check(op, [randn(*shape)], attrs, lambda x: tf_pool(x, kernel, strides, padding))


def test_sparse_softmax_cross_entropy_matches_tf():
    logits, labels = randn(6, 5) * 3, RNG.integers(0, 5, 6)
    _check("sparse_softmax_cross_entropy", [logits, labels], {},
           lambda z, y: tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=z))


@pytest.mark.parametrize("op, attrs, tf_fn", [
    ("gelu", {"approximate": "none"}, lambda x: tf.nn.gelu(x, approximate=False)),
    ("gelu", {"approximate": "tanh"}, lambda x: tf.nn.gelu(x, approximate=True)),
    ("elu", {"alpha": 1.0}, tf.nn.elu),
    ("selu", {}, tf.nn.selu),
    ("softplus", {}, tf.nn.softplus),
    ("sigmoid", {}, tf.sigmoid),
    ("softmax", {"axis": -1}, lambda x: tf.nn.softmax(x, axis=-1)),
    ("log_softmax", {"axis": 1}, lambda x: tf.nn.log_softmax(x, axis=1)),
    ("rsqrt", {}, lambda x: tf.math.rsqrt(tf.abs(x) + 0.5)),
])
def test_activations_match_tf(op, attrs, tf_fn):
    x = randn(4, 6) * 2
    if op == "rsqrt":  # same positive input on both sides
        x = np.abs(x) + np.float32(0.5)
        _check(op, [x], attrs, tf.math.rsqrt)
        return
    _check(op, [x], attrs, tf_fn)


def test_maximum_matches_tf_without_ties():
    _check("maximum", [randn(3, 4), randn(4)], {}, tf.maximum)


def test_einsum_matches_tf():
    _check("einsum", [randn(2, 5, 3, 4), randn(2, 6, 3, 4)], {"equation": "bqhd,bkhd->bhqk"},
           lambda a, b: tf.einsum("bqhd,bkhd->bhqk", a, b))


def test_batch_norm_in_eval_matches_tf():
    x, gamma, beta, mean, var = randn(4, 3, 3, 5), randn(5), randn(5), randn(5), np.abs(randn(5)) + 0.5
    attrs = {"axis": -1, "eps": 1e-3, "momentum": 0.01}
    _check("batch_norm", [x, gamma, beta, mean, var], attrs,
           lambda x, g, b, m, v: tf.nn.batch_normalization(x, m, v, b, g, 1e-3), training=False, state_inputs=(3, 4))


# --------------------------------------------------------------------- optimizers

SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,)}


def _lr(step):
    return 0.01 * (1.0 + 0.5 * (step % 3))


def _compare_with_tf(spec, make_tf, steps=20, schedule=True, atol=1e-7):
    rng = np.random.default_rng(0)
    params = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    variables = {name: tf.Variable(p.copy()) for name, p in params.items()}
    lr = [_lr(0)]
    tf_opt = make_tf(lambda: lr[0])
    ours = Optimizer(spec, params)
    for step in range(steps):
        lr[0] = _lr(step) if schedule else _lr(0)
        grads = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
        ours.apply_gradients(params, grads, lr[0])
        tf_opt.apply_gradients([(tf.constant(grads[name]), variables[name]) for name in SHAPES])
        for name, v in variables.items():
            np.testing.assert_allclose(params[name], v.numpy(), rtol=1e-6, atol=atol,
                                       err_msg=f"{name}, step {step + 1}")


@pytest.mark.parametrize("kind, hyper, make_tf", [
    ("sgd", {}, lambda lr: tf.compat.v1.train.GradientDescentOptimizer(lr)),
    ("momentum", {"momentum": 0.9}, lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9)),
    ("momentum", {"momentum": 0.9, "nesterov": True},
     lambda lr: tf.compat.v1.train.MomentumOptimizer(lr, 0.9, use_nesterov=True)),
    ("adam", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
     lambda lr: tf.compat.v1.train.AdamOptimizer(lr, beta1=0.9, beta2=0.999, epsilon=1e-8)),
    ("adam", {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6},
     lambda lr: tf.compat.v1.train.AdamOptimizer(lr, beta1=0.8, beta2=0.99, epsilon=1e-6)),
])
def test_tf_semantics_match_tf_compat_v1_over_20_steps(kind, hyper, make_tf):
    _compare_with_tf(OptimizerSpec(kind, "tf", hyper), make_tf)


def test_tf_adamw_matches_keras_adamw():
    spec = OptimizerSpec("adamw", "tf", {"beta1": 0.9, "beta2": 0.999, "eps": 1e-7, "weight_decay": 0.1})
    _compare_with_tf(spec, lambda lr: tf.keras.optimizers.AdamW(
        learning_rate=_lr(0), weight_decay=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7), schedule=False,
        # keras computes b^t with pow, tf.compat.v1 (which the runtime follows) as a running
        # float32 product: 1 - b2^t then differs by ~1e-5 relative in early steps
        atol=1e-6)


def test_tf_rounding_of_adamw_decay_and_nesterov_is_tfs_bit_for_bit():
    """keras AdamW decays as p -= p * wd * lr, ApplyMomentum(use_nesterov) steps by
    g * lr + buf * m * lr: with zero gradients (decay alone) and over 3 momentum steps, the
    same float32 results as TensorFlow's, not torch's order of the same arithmetic."""
    rng = np.random.default_rng(3)
    start = rng.standard_normal(1000).astype(np.float32)
    for spec, make_tf, scale in [
        (OptimizerSpec("adamw", "tf", {"weight_decay": 0.3, "eps": 1e-7}),
         lambda: tf.keras.optimizers.AdamW(learning_rate=0.1, weight_decay=0.3, epsilon=1e-7), 0.0),
        (OptimizerSpec("momentum", "tf", {"momentum": 0.9, "nesterov": True}),
         lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True), 1.0),
    ]:
        params, variable, tf_opt = {"w": start.copy()}, tf.Variable(start.copy()), make_tf()
        ours = Optimizer(spec, params)
        for _ in range(3):
            g = (scale * rng.standard_normal(1000)).astype(np.float32)
            ours.apply_gradients(params, {"w": g}, 0.1)
            tf_opt.apply_gradients([(tf.constant(g), variable)])
        np.testing.assert_array_equal(params["w"], variable.numpy(), err_msg=spec.kind)


def test_tf_global_norm_clipping_of_small_gradients_matches_tf():
    """Gradients of norm 1e-3 (where torch's 1e-6 added to the norm would show), through the
    optimizer's own clipping and update."""
    rng = np.random.default_rng(2)
    params = {name: np.zeros(shape, np.float32) for name, shape in SHAPES.items()}  # the update alone, exactly
    variables = {name: tf.Variable(p.copy()) for name, p in params.items()}
    grads = {name: (3e-4 * rng.standard_normal(shape)).astype(np.float32) for name, shape in SHAPES.items()}
    Optimizer(OptimizerSpec("sgd", "tf", max_gradient_norm=1e-4), params).apply_gradients(params, grads, 100.0)
    clipped, _ = tf.clip_by_global_norm([tf.constant(g) for g in grads.values()], 1e-4)
    tf.compat.v1.train.GradientDescentOptimizer(100.0).apply_gradients(list(zip(clipped, variables.values())))
    for name, v in variables.items():
        np.testing.assert_allclose(params[name], v.numpy(), rtol=1e-6, err_msg=name)


def test_tf_global_norm_clipping_matches_tf():
    rng = np.random.default_rng(1)
    grads = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in SHAPES.items()}
    for max_norm in (0.5, 100.0):
        clipped = clip_by_global_norm(grads, max_norm, "tf")
        expected, _ = tf.clip_by_global_norm([tf.constant(g) for g in grads.values()], max_norm)
        for got, want in zip(clipped.values(), expected):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)
