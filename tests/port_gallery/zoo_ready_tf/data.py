"""The embedded digits as a tf.data pipeline: shuffle, repeat (training), batch with drop_remainder, map."""
from typing import Mapping

import tensorflow as tf

from common.data import embedded_digits, load_mnist_arrays
from common.tf.estimator import ModeKeys


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    p = params["train_input"] if train else params["eval_input"]
    images, labels = load_mnist_arrays(embedded_digits(), "train" if train else "test")
    ds = tf.data.Dataset.from_tensor_slices((images, labels.astype("int64")))
    if train:
        ds = ds.shuffle(len(labels)).repeat()
    ds = ds.batch(p["batch_size"], drop_remainder=True)
    return ds.map(lambda x, y: (tf.cast(x, tf.float32)[..., None] / 255.0, y))  # (B, 28, 28, 1), (B,)


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
