"""UNet (Ronneberger et al., 2015): an encoder-decoder with skip connections, for per-pixel classes.

The same network as pytorch/unet, in Keras layers on NHWC maps. Encoder: per level, two
3x3 convs (same padding, relu), then a 2x2 max pool. Bottleneck: two 3x3 convs at the
last of ``filters``. Decoder: per level, up by 2 (a 2x2 transposed conv, or a bilinear /
nearest upsample then a 3x3 conv: ``model.upsampling``), the encoder's map of that level
concatenated (the skip), two 3x3 convs. A 1x1 conv gives the logits.

``num_classes`` 2 is binary: one logit per pixel and BCE-with-logits; more is one logit per
class and cross-entropy. ``model_fn`` follows the Estimator contract (common/tf/estimator):
EVAL gives Dice and mean IoU through ``host_call`` (how metrics leave the device), both
over the whole eval set from streaming sums.
"""

from typing import Mapping

import keras
import tensorflow as tf

from common.errors import UserError
from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op


def double_conv(x: tf.Tensor, filters: int, name: str) -> tf.Tensor:
    x = keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"{name}_conv1")(x)
    return keras.layers.Conv2D(filters, 3, padding="same", activation="relu", name=f"{name}_conv2")(x)


def up(x: tf.Tensor, filters: int, upsampling: str, name: str) -> tf.Tensor:
    """(B, h, w, in) -> (B, 2h, 2w, filters)."""
    if upsampling == "transposed":
        return keras.layers.Conv2DTranspose(filters, 2, strides=2, name=f"{name}_transposed")(x)
    x = keras.layers.UpSampling2D(2, interpolation=upsampling, name=f"{name}_upsample")(x)
    return keras.layers.Conv2D(filters, 3, padding="same", name=f"{name}_conv")(x)


def unet(images: tf.Tensor, params: Mapping) -> tf.Tensor:
    """(B, H, W, C) in [0, 1] -> (B, H, W, 1 or num_classes) float32 logits."""
    p = params["model"]
    *levels, bottom = p["filters"]
    x = images
    skips = []
    for i, f in enumerate(levels):
        x = double_conv(x, f, f"down{i}")  # (B, h, w, f)
        skips.append(x)
        x = keras.layers.MaxPooling2D(2, name=f"pool{i}")(x)  # (B, h/2, w/2, f)
    x = double_conv(x, bottom, "bottleneck")
    for i, (f, skip) in enumerate(zip(reversed(levels), reversed(skips))):
        x = keras.layers.Concatenate(name=f"skip{i}")([up(x, f, p["upsampling"], f"up{i}"), skip])  # (B, h, w, 2f)
        x = double_conv(x, f, f"fuse{i}")  # (B, h, w, f)
    logits = keras.layers.Conv2D(1 if p["num_classes"] == 2 else p["num_classes"], 1, name="head")(x)
    return tf.cast(logits, tf.float32)  # under a mixed-precision policy the loss is taken in fp32


def _mean_over_present(numerator: tf.Tensor, denominator: tf.Tensor) -> tf.Tensor:
    """The mean of numerator / denominator over the classes whose denominator is nonzero; 0 if none."""
    present = tf.cast(denominator > 0, denominator.dtype)
    ratios = tf.math.divide_no_nan(numerator, denominator)
    return tf.math.divide_no_nan(tf.reduce_sum(ratios * present), tf.reduce_sum(present))


def eval_metrics(labels: tf.Tensor, predictions: tf.Tensor, num_classes: int) -> dict:
    """host_call's fn: runs on the host over what the device computed.

    Both metrics read one confusion matrix averaged over the batches
    (``metrics.mean_tensor``): Dice and IoU are ratios, so its scale does not matter.
    Classes that appear in neither labels nor predictions do not count, as in the vendor's
    MeanIOUMetric and DiceCoefficientMetric (and tf.compat.v1.metrics.mean_iou).
    """
    labels, predictions = tf.reshape(labels, [-1]), tf.reshape(predictions, [-1])
    matrix = tf.math.confusion_matrix(labels, predictions, num_classes=num_classes, dtype=tf.float32)
    mean_matrix, update = tf.compat.v1.metrics.mean_tensor(matrix)  # rows: labels, columns: predictions
    true_positives = tf.linalg.diag_part(mean_matrix)
    sums = tf.reduce_sum(mean_matrix, 0) + tf.reduce_sum(mean_matrix, 1)
    return {"dice_coefficient": (_mean_over_present(2 * true_positives, sums), update),
            "mean_iou": tf.compat.v1.metrics.mean_iou(labels, predictions, num_classes)}


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    p = params["model"]
    levels = len(p["filters"]) - 1
    if any(size % 2 ** levels for size in p["image_size"]):
        raise UserError(f"model.image_size {list(p['image_size'])}: each side must divide by 2^{levels} (the max "
                        f"pools of {levels} levels, len(model.filters) - 1)")
    logits = unet(features, params)  # (B, H, W, 1 or K)
    num_classes = p["num_classes"]
    if num_classes == 2:
        logits = logits[..., 0]  # (B, H, W)
        predictions = tf.cast(logits > 0, tf.int32)
    else:
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (B, H, W)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": predictions, "logits": logits})
    if num_classes == 2:
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32),
                                                                      logits=logits))
    else:
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss,
                           host_call=(lambda y, p: eval_metrics(y, p, num_classes), [labels, predictions]))
