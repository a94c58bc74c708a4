"""keras_fit_mnist/train.py's model, ported: the same layers, built in model_fn; accuracy through host_call."""
from typing import Mapping

import keras
import tensorflow as tf

from common.tf.estimator import CSEstimatorSpec, EstimatorSpec, ModeKeys
from common.tf.optim import build_train_op


def classifier(p: Mapping) -> keras.Sequential:
    return keras.Sequential([
        keras.layers.Flatten(),
        keras.layers.Dense(p["hidden_units"], activation="relu"),
        keras.layers.Dropout(p["dropout"]),
        keras.layers.Dense(10),
    ])


def eval_metrics(labels: tf.Tensor, logits: tf.Tensor) -> dict:
    """host_call's fn: train.py's metrics=["accuracy"], computed on the host in EVAL."""
    return {"accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=-1))}


def model_fn(features: tf.Tensor, labels: tf.Tensor, mode: str, params: Mapping) -> EstimatorSpec:
    logits = classifier(params["model"])(features, training=mode == ModeKeys.TRAIN)  # (B, 10)
    if mode == ModeKeys.PREDICT:
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, axis=-1)})
    # train.py's SparseCategoricalCrossentropy(from_logits=True)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return CSEstimatorSpec(mode, loss=loss, host_call=(eval_metrics, [labels, logits]))
