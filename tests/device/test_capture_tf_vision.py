"""The TensorFlow frontend on the vision and loss ops: Keras Conv2DTranspose
(Conv2DBackpropInput), UpSampling2D (nearest: ExpandDims + Tile + Reshape; bilinear:
ResizeBilinear), max pooling with explicit paddings, AveragePooling2D and GlobalAveragePooling2D, tf.tile / unstack / split,
BinaryCrossentropy(from_logits=True) (sigmoid_cross_entropy_with_logits, one node), and
sparse cross-entropy over (N, H, W, C) logits.

Each lowers to its record, and the emulator's loss and gradients agree with
``tf.gradients``; an attribute value the kernels do not implement is a validation error
naming the op, the attribute and the user's line.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from device.capture import tf as capture_tf  # noqa: E402
from device.ops import OPS  # noqa: E402
from device.passes.validate import DEFAULT_SUGGESTION, validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line(tag: str) -> int:
    return next(i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{tag}>"))


def build(model_fn, shapes_dtypes):
    """A TF1 graph of ``model_fn(*placeholders) -> loss``, its gradients and an initialised session."""
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    graph = tf.Graph()
    with graph.as_default():
        inputs = [v1.placeholder(dtype, shape) for shape, dtype in shapes_dtypes]
        loss = model_fn(*inputs)
        variables = v1.trainable_variables()
        grads = tf.gradients(loss, variables)
        session = v1.Session(graph=graph)
        session.run(v1.global_variables_initializer())
    return graph, inputs, loss, variables, grads, session


def vision_fn(x, labels, targets):  # x: (2, 4, 4, 3), labels: (2, 8, 8), targets: (2, 8, 8, 1)
    masks = layers.Conv2DTranspose(1, 3, strides=2, padding="same")(x)  # (2, 8, 8, 1)  # <tf-conv-transpose>
    bce = tf.keras.losses.BinaryCrossentropy(from_logits=True)(targets, masks)  # <tf-bce>
    up = layers.UpSampling2D(2)(x) + layers.UpSampling2D(2, interpolation="bilinear")(x)  # (2, 8, 8, 3)
    up = up + layers.Conv2DTranspose(3, 2, strides=2, padding="valid")(x) + tf.image.resize(x, [8, 8], "nearest")
    logits = layers.Conv2D(3, 1)(up)  # (2, 8, 8, 3)
    ce = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)
    pooled = layers.AveragePooling2D(2)(x) * layers.GlobalAveragePooling2D(keepdims=True)(x)  # (2, 2, 2, 3)
    pooled = layers.MaxPooling2D(2)(layers.ZeroPadding2D(1)(pooled))  # (2, 2, 2, 3)
    pooled += tf.pad(pooled, [[0, 0], [1, 0], [0, 1], [0, 0]], constant_values=0.5)[:, 1:, :2]
    tiled = tf.tile(pooled, [1, 2, 2, 1])  # (2, 4, 4, 3)
    channels = tf.unstack(x, axis=3)
    halves = tf.split(x, 2, axis=1)
    parts = tf.split(x, [1, -1], axis=3)
    extra = tf.reduce_mean(tiled * x) + tf.reduce_mean(channels[0] * channels[2])
    extra += tf.reduce_mean(halves[0] * halves[1]) + tf.reduce_mean(parts[1])
    extra += tf.reduce_mean(tf.nn.max_pool2d(x, 3, 2, [[0, 0], [1, 1], [1, 1], [0, 0]]))  # EXPLICIT: (2, 2, 2, 3)
    return bce + ce + extra


def test_vision_ops_lower_to_their_records_and_match_tf():
    graph_tf, inputs, loss, variables, grads, session = build(
        vision_fn, [((2, 4, 4, 3), tf.float32), ((2, 8, 8), tf.int32), ((2, 8, 8, 1), tf.float32)])
    graph = capture_tf.capture(graph_tf, inputs=inputs, loss=loss)
    ops = [n.op for n in graph.nodes]
    assert set(ops) <= set(OPS) and validate(graph, mode="train", profile=None).ok
    assert ops.count("conv_transpose2d") == 2 and ops.count("resize2d") == 2 and ops.count("tile") == 3
    assert [n.attrs["value"] for n in graph.nodes if n.op == "pad"] == [0.0, 0.5]
    assert [n.attrs["padding"] for n in graph.nodes if n.op == "max_pool2d"] == ["VALID", [[1, 1], [1, 1]]]
    (bce,) = [n for n in graph.nodes if n.op == "sigmoid_cross_entropy"]  # one node, not seven
    assert bce.loc.framework_op == "sigmoid_cross_entropy_with_logits" and bce.loc.line == _line("tf-bce")
    (transposed,) = [n for n in graph.nodes if n.op == "conv_transpose2d" and n.attrs["padding"] == "SAME"]
    assert transposed.loc.line == _line("tf-conv-transpose")
    rng = np.random.default_rng(0)
    batch = [rng.standard_normal((2, 4, 4, 3)).astype(np.float32), rng.integers(0, 3, (2, 8, 8)).astype(np.int32),
             rng.uniform(size=(2, 8, 8, 1)).astype(np.float32)]
    assert_gradients_match_tf(graph, batch, inputs, loss, variables, grads, session)


def refused_fn(x, labels):  # x: (2, 4, 4, 3)
    a = v1.image.resize_bilinear(x, [8, 8], align_corners=True)  # <tf-align-corners>
    b = v1.image.resize_nearest_neighbor(x, [8, 8])  # <tf-half-pixel>
    c = tf.image.resize(x, [6, 6], method="nearest")  # <tf-nearest-factor>
    logits = layers.Dense(3)(tf.reshape(a + b, [2, -1]))
    loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(loss) + tf.reduce_mean(c)


@pytest.mark.parametrize("tag, framework_op, attribute", [
    ("tf-align-corners", "ResizeBilinear", "align_corners=True"),
    ("tf-half-pixel", "ResizeNearestNeighbor", "half_pixel_centers=False"),
    ("tf-nearest-factor", "ResizeNearestNeighbor", "whole-number factors"),
])
def test_unimplemented_attribute_values_are_refused_at_the_users_line(tag, framework_op, attribute):
    graph_tf, inputs, loss, *_, session = build(refused_fn, [((2, 4, 4, 3), tf.float32), ((2,), tf.int32)])
    session.close()
    report = validate(capture_tf.capture(graph_tf, inputs=inputs, loss=loss), mode="train", profile=None)
    found = [f for f in report.errors if f.line == _line(tag)]
    assert len(found) == 1, report.to_text()
    assert found[0].framework_op == framework_op and attribute in found[0].message
    assert found[0].file == __file__
    assert found[0].suggestion not in ("", DEFAULT_SUGGESTION)  # a suggestion for that op


def smoothed_fn(x, labels, onehot):  # x: (2, 4, 4, 2), labels: (2, 4, 4), onehot: (2, 4, 4, 3)
    logits = layers.Conv2D(3, 1)(x)  # (N, H, W, C): classes last
    smoothed = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.1)(onehot, logits)
    return smoothed + tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, logits)


def test_keras_label_smoothing_and_cross_entropy_over_nhwc_logits_match_tf():
    graph_tf, inputs, loss, variables, grads, session = build(
        smoothed_fn, [((2, 4, 4, 2), tf.float32), ((2, 4, 4), tf.int32), ((2, 4, 4, 3), tf.float32)])
    graph = capture_tf.capture(graph_tf, inputs=inputs, loss=loss)
    assert {n.op for n in graph.nodes} <= set(OPS) and validate(graph, mode="train", profile=None).ok
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 3, (2, 4, 4)).astype(np.int32)
    batch = [rng.standard_normal((2, 4, 4, 2)).astype(np.float32), labels, np.eye(3, dtype=np.float32)[labels]]
    got_loss, got_grads = Program(graph, capture_tf.read_weights(session, graph)).gradients(batch)
    tf_loss, tf_grads = session.run([loss, grads], dict(zip(inputs, batch)))
    session.close()
    np.testing.assert_allclose(got_loss, tf_loss, rtol=1e-5)
    for variable, expected in zip(variables, tf_grads):
        np.testing.assert_allclose(got_grads[variable.name.split(":")[0]], expected, rtol=1e-5, atol=1e-7)


# TF op type -> {attribute: how the mapping treats it}; every attribute of the op's OpDef is listed
# ("dtype": checked by validation against the record; "no effect": placement only, not numbers)
TF_ATTRIBUTES = {
    "Conv2DBackpropInput": {"T": "dtype", "strides": "implemented", "padding": "implemented",
                            "explicit_paddings": "implemented", "data_format": "implemented",
                            "dilations": "implemented", "use_cudnn_on_gpu": "no effect"},
    "ResizeBilinear": {"T": "dtype", "align_corners": "refused unless False",
                       "half_pixel_centers": "refused unless True"},
    "ResizeNearestNeighbor": {"T": "dtype", "align_corners": "refused unless False",
                              "half_pixel_centers": "refused unless True"},
    "Tile": {"T": "dtype", "Tmultiples": "dtype"},
    "Pad": {"T": "dtype", "Tpaddings": "dtype"},
    "MirrorPad": {"T": "dtype", "Tpaddings": "dtype", "mode": "implemented"},
    "DepthwiseConv2dNative": {"T": "dtype", "strides": "implemented", "padding": "implemented",
                              "explicit_paddings": "implemented", "data_format": "implemented",
                              "dilations": "implemented"},
    "Relu6": {"T": "dtype"},
    "PadV2": {"T": "dtype", "Tpaddings": "dtype"},
    "Unpack": {"T": "dtype", "num": "implemented", "axis": "implemented"},
    "Split": {"T": "dtype", "num_split": "implemented"},
    "SplitV": {"T": "dtype", "num_split": "implemented", "Tlen": "dtype"},
}


@pytest.mark.parametrize("op_type", list(TF_ATTRIBUTES))
def test_every_attribute_of_the_tf_ops_is_accounted_for(op_type):
    from tensorflow.python.framework import op_def_registry

    assert {a.name for a in op_def_registry.get(op_type).attr} == set(TF_ATTRIBUTES[op_type])


def explicit_fn(x, labels):  # x: (2, 3, 3, 2)
    w = v1.get_variable("w", initializer=np.linspace(-1, 1, 3 * 3 * 4 * 2, dtype=np.float32).reshape(3, 3, 4, 2))
    y = tf.nn.conv2d_transpose(x, w, [2, 5, 5, 4], strides=2, padding=[[0, 0], [1, 1], [1, 1], [0, 0]])  # <tf-explicit>
    logits = tf.reshape(y, [2, -1])[:, :3]
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def test_conv2d_transpose_with_explicit_padding_matches_tf():
    graph_tf, inputs, loss, variables, grads, session = build(explicit_fn, [((2, 3, 3, 2), tf.float32),
                                                                             ((2,), tf.int32)])
    graph = capture_tf.capture(graph_tf, inputs=inputs, loss=loss)
    (node,) = [n for n in graph.nodes if n.op == "conv_transpose2d"]
    assert node.attrs["padding"] == [[1, 1], [1, 1]] and node.loc.line == _line("tf-explicit")
    batch = [np.random.default_rng(2).standard_normal((2, 3, 3, 2)).astype(np.float32), np.array([0, 2], np.int32)]
    got_loss, got_grads = Program(graph, capture_tf.read_weights(session, graph)).gradients(batch)
    tf_loss, tf_grads = session.run([loss, grads], dict(zip(inputs, batch)))
    session.close()
    np.testing.assert_allclose(got_loss, tf_loss, rtol=1e-5)
    np.testing.assert_allclose(got_grads["w"], tf_grads[0], rtol=1e-5, atol=1e-7)


def gallery_fn(x, labels):  # x: (2, 6, 6, 4): the ops keras.applications add
    y = tf.pad(x, [[0, 0], [1, 2], [2, 1], [0, 0]], mode="REFLECT")  # (2, 9, 9, 4)
    y = layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2, padding="same")(y)  # (2, 5, 5, 8)
    y = layers.ReLU(6.0)(layers.Conv2D(6, 3)(y))  # (2, 3, 3, 6)
    y = tf.pad(y, [[0, 0], [2, 1], [0, 3], [0, 0]], mode="SYMMETRIC")  # (2, 6, 6, 6)
    y = layers.SeparableConv2D(4, 3)(y)  # (2, 4, 4, 4)
    logits = layers.Dense(3)(layers.GlobalAveragePooling2D()(y))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def assert_gradients_match_tf(graph, batch, inputs, loss, variables, grads, session):
    """The emulator's loss and every variable's gradient on ``batch`` against TF's (1e-5)."""
    got_loss, got_grads = Program(graph, capture_tf.read_weights(session, graph)).gradients(batch)
    tf_loss, tf_grads = session.run([loss, grads], dict(zip(inputs, batch)))
    session.close()
    np.testing.assert_allclose(got_loss, tf_loss, rtol=1e-5)
    for variable, expected in zip(variables, tf_grads):
        name = variable.name.split(":")[0]
        np.testing.assert_allclose(got_grads[name], expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max(),
                                   err_msg=name)


def test_gallery_ops_lower_to_their_records_and_match_tf():
    graph_tf, inputs, loss, variables, grads, session = build(gallery_fn, [((2, 6, 6, 4), tf.float32),
                                                                           ((2,), tf.int32)])
    graph = capture_tf.capture(graph_tf, inputs=inputs, loss=loss)
    assert validate(graph, mode="train", profile=None).ok
    assert sorted(n.attrs.get("groups", 1) for n in graph.nodes if n.op == "conv2d") == [1, 1, 4, 6]
    assert [n.attrs["mode"] for n in graph.nodes if n.op == "pad"] == ["reflect", "symmetric"]
    assert [n.op for n in graph.nodes].count("clamp") == 1
    batch = [np.random.default_rng(4).standard_normal((2, 6, 6, 4)).astype(np.float32), np.array([0, 2], np.int32)]
    assert_gradients_match_tf(graph, batch, inputs, loss, variables, grads, session)


def grouped_fn(x, labels):  # x: (2, 8, 8, 4)
    # Keras 3 builds Conv2D(groups=g) as an XLA-compiled function call (StatefulPartitionedCall)
    y = layers.ReLU()(layers.Conv2D(6, 3, groups=2, strides=2, padding="same")(x))  # (2, 4, 4, 6)
    y = layers.Conv2D(4, 1, groups=2)(y)  # (2, 4, 4, 4)
    logits = layers.Dense(3)(layers.GlobalAveragePooling2D()(y))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def test_keras_grouped_conv2d_function_call_lowers_to_a_grouped_conv2d_and_matches_tf():
    graph_tf, inputs, loss, variables, grads, session = build(grouped_fn, [((2, 8, 8, 4), tf.float32),
                                                                           ((2,), tf.int32)])
    assert [op.type for op in graph_tf.get_operations()].count("StatefulPartitionedCall") >= 2
    graph = capture_tf.capture(graph_tf, inputs=inputs, loss=loss)
    assert validate(graph, mode="train", profile=None).ok
    assert [n.attrs.get("groups", 1) for n in graph.nodes if n.op == "conv2d"] == [2, 2]
    batch = [np.random.default_rng(5).standard_normal((2, 8, 8, 4)).astype(np.float32), np.array([0, 2], np.int32)]
    assert_gradients_match_tf(graph, batch, inputs, loss, variables, grads, session)


def test_a_function_call_that_is_not_one_conv2d_is_refused_with_the_reason():
    @tf.function
    def scaled(v):
        return tf.nn.relu(v) * 2.0

    def call_fn(x, labels):  # x: (2, 4, 4, 3)
        y = scaled(x)  # <tf-call>
        logits = layers.Dense(3)(layers.GlobalAveragePooling2D()(y))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))

    graph_tf, inputs, loss, *_, session = build(call_fn, [((2, 4, 4, 3), tf.float32), ((2,), tf.int32)])
    session.close()
    report = validate(capture_tf.capture(graph_tf, inputs=inputs, loss=loss), mode="train", profile=None)
    found = [f for f in report.errors if f.line == _line("tf-call")]
    assert len(found) == 1, report.to_text()
    assert found[0].framework_op.endswith("PartitionedCall") and "one Conv2D" in found[0].message
