"""ResNet (He et al. 2015, "Deep Residual Learning for Image Recognition"), v1.5, NHWC.

The same network, keys and defaults as pytorch/resnet (its model.py describes the blocks
and stems). ``model_fn`` follows the Estimator contract (common/tf/estimator): TRAIN returns
the loss and train_op, EVAL the loss and top-1 (and top-5 where classes > 5) through
``host_call`` (how metrics leave the device), PREDICT the classes and probabilities.

Padding is torch's, so that both frameworks compute the same network: a stride-1 conv pads
"same" (odd kernels: (k - 1) / 2 on every side, as torch's ``padding``), a strided conv pads
explicitly first and then runs "valid" (the TF Model Garden's ``fixed_padding``). A strided
"same" would pad an even input only at the bottom and right and shift every window by a
pixel. The max pool takes torch's ``padding=1`` as explicit paddings, where padding never
wins the maximum.
"""

from typing import Mapping

import keras
import tensorflow as tf

from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op


def fixed_padding(x: tf.Tensor, kernel: int) -> tf.Tensor:
    """(B, H, W, C) -> (B, H + k - 1, W + k - 1, C): zeros around H and W, independent of the input
    size (the TF Model Garden's ``fixed_padding``), k // 2 on each side for odd k, as torch's
    ``padding=k // 2``. A 1x1 kernel pads nothing."""
    begin = (kernel - 1) // 2
    end = kernel - 1 - begin
    if begin == end == 0:
        return x
    return tf.pad(x, [[0, 0], [begin, end], [begin, end], [0, 0]])


class Layers:
    """Keras layers named in order (conv_0, bn_0, ...), so that checkpoints read the same each build."""

    def __init__(self, p: Mapping, training: bool):
        self.p, self.training, self.count = p, training, 0

    def conv(self, x: tf.Tensor, filters: int, kernel: int, stride: int = 1) -> tf.Tensor:
        self.count += 1
        if stride > 1:
            x = fixed_padding(x, kernel)
        return keras.layers.Conv2D(filters, kernel, stride, padding="same" if stride == 1 else "valid",
                                   use_bias=False, name=f"conv_{self.count}")(x)

    def bn(self, x: tf.Tensor) -> tf.Tensor:
        return keras.layers.BatchNormalization(momentum=self.p["batch_norm_decay"], epsilon=self.p["batch_norm_epsilon"],
                                               name=f"bn_{self.count}")(x, training=self.training)


def shortcut(layers: Layers, x: tf.Tensor, out_channels: int, stride: int) -> tf.Tensor:
    if stride == 1 and x.shape[-1] == out_channels:
        return x
    return layers.bn(layers.conv(x, out_channels, 1, stride))


def basic_block(layers: Layers, x: tf.Tensor, width: int, stride: int) -> tf.Tensor:
    """(B, H, W, C) -> (B, H/s, W/s, width)"""
    y = tf.nn.relu(layers.bn(layers.conv(x, width, 3, stride)))
    y = layers.bn(layers.conv(y, width, 3))
    return tf.nn.relu(y + shortcut(layers, x, width, stride))


def bottleneck_block(layers: Layers, x: tf.Tensor, width: int, stride: int) -> tf.Tensor:
    """(B, H, W, C) -> (B, H/s, W/s, 4 width); the stride in the 3x3 conv (v1.5)"""
    y = tf.nn.relu(layers.bn(layers.conv(x, width, 1)))
    y = tf.nn.relu(layers.bn(layers.conv(y, width, 3, stride)))
    y = layers.bn(layers.conv(y, 4 * width, 1))
    return tf.nn.relu(y + shortcut(layers, x, 4 * width, stride))


def resnet(images: tf.Tensor, params: Mapping, training: bool) -> tf.Tensor:
    """(B, H, W, C) normalised images -> (B, num_classes) float32 logits."""
    p = params["model"]  # sizes and rates are checked by params (utils.py's ranges, common/params.py)
    if len(p["stage_blocks"]) != len(p["stage_widths"]):
        raise UserError(f"model.stage_blocks {list(p['stage_blocks'])} and model.stage_widths "
                        f"{list(p['stage_widths'])} must have one entry per stage each")
    layers = Layers(p, training)
    if p["stem"] == "cifar":
        x = tf.nn.relu(layers.bn(layers.conv(images, p["stem_width"], 3)))  # (B, H, W, stem)
    else:
        x = tf.nn.relu(layers.bn(layers.conv(images, p["stem_width"], 7, 2)))  # (B, H/2, W/2, stem)
        x = tf.nn.max_pool2d(x, 3, 2, [[0, 0], [1, 1], [1, 1], [0, 0]], name="pool")  # (B, H/4, W/4, stem)
    block = basic_block if p["block"] == "basic" else bottleneck_block
    for stage, (count, width) in enumerate(zip(p["stage_blocks"], p["stage_widths"])):
        for i in range(count):
            x = block(layers, x, width, 2 if stage > 0 and i == 0 else 1)
    # global average pooling as a mean over H and W (the emulator's reduce_mean)
    x = tf.reduce_mean(x, [1, 2])  # (B, C)
    logits = keras.layers.Dense(p["num_classes"], name="logits")(x)  # (B, num_classes)
    # under a mixed-precision policy the layers compute in 16 bits; the loss is taken in fp32
    return tf.cast(logits, tf.float32)


def eval_metrics(labels: tf.Tensor, logits: tf.Tensor) -> dict:
    """host_call's fn: runs on the host over what the device computed."""
    metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=-1))}
    if logits.shape[-1] > 5:
        in_top5 = tf.nn.in_top_k(targets=tf.cast(labels, tf.int32), predictions=logits, k=5)
        metrics["top5_accuracy"] = tf.compat.v1.metrics.mean(tf.cast(in_top5, tf.float32))
    return metrics


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    logits = resnet(features, params, training=mode == ModeKeys.TRAIN)  # (B, num_classes)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1),
                                                "probabilities": tf.nn.softmax(logits)})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(eval_metrics, [labels, logits]))
