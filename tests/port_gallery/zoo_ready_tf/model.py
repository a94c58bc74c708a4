"""A small CNN on 28x28 digits for the Estimator contract: TRAIN loss and train_op, EVAL accuracy
through host_call."""
from typing import Mapping

import keras
import tensorflow as tf

from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op


def cnn(images: tf.Tensor, p: Mapping) -> tf.Tensor:
    x = keras.layers.Conv2D(p["channels"], 3, padding="same", activation="relu", name="conv1")(images)
    x = keras.layers.MaxPooling2D(2, name="pool1")(x)  # (B, 14, 14, C)
    x = keras.layers.Flatten(name="flatten")(x)
    return keras.layers.Dense(10, name="logits")(x)  # (B, 10)


def eval_metrics(labels: tf.Tensor, logits: tf.Tensor) -> dict:
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=-1))}


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    logits = cnn(features, params["model"])
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1)})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(eval_metrics, [labels, logits]))
