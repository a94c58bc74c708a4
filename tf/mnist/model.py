"""A multi-layer perceptron on 28x28 digits: Dense -> activation -> dropout per hidden layer.

The same network as pytorch/mnist. ``model_fn`` follows the Estimator contract
(common/tf/estimator): TRAIN returns the loss and train_op, EVAL the loss and accuracy
through ``host_call`` (how metrics leave the device), PREDICT the classes.
"""

from typing import Mapping

import keras
import tensorflow as tf

from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op

NUM_CLASSES = 10


def mlp(images: tf.Tensor, params: Mapping, training: bool) -> tf.Tensor:
    """(B, 784) normalised pixels -> (B, 10) float32 logits."""
    p = params["model"]  # sizes and rates are checked by params (common/params.py NAME_RULES)
    x = images  # (B, 784)
    for i, size in enumerate(p["hidden_sizes"]):
        x = keras.layers.Dense(size, activation=p["activation_fn"], name=f"fc{i}")(x)  # (B, size)
        if p["dropout"] > 0:
            x = keras.layers.Dropout(p["dropout"], name=f"dropout{i}")(x, training=training)
    logits = keras.layers.Dense(NUM_CLASSES, name="logits")(x)  # (B, 10)
    # under a mixed-precision policy the layers compute in 16 bits; the loss is taken in fp32
    return tf.cast(logits, tf.float32)


def eval_metrics(labels: tf.Tensor, logits: tf.Tensor) -> dict:
    """host_call's fn: runs on the host over what the device computed."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=-1))}


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    logits = mlp(features, params, training=mode == ModeKeys.TRAIN)  # (B, 10)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1),
                                                "probabilities": tf.nn.softmax(logits)})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(eval_metrics, [labels, logits]))
