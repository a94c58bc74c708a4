"""train.py's mnist.load_data(), ported: MNIST from data_dir (never downloaded) as a tf.data pipeline:
shuffle, repeat (training), batch with drop_remainder, scale to [0, 1]."""
from typing import Mapping

import tensorflow as tf

from common.data import load_mnist_arrays, resolve_mnist
from common.tf.estimator import ModeKeys


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    p = params["train_input"] if train else params["eval_input"]
    # MNIST where `zoo prepare mnist` put it; with dataset auto and none there, the embedded digits
    images, labels = load_mnist_arrays(resolve_mnist(p["data_dir"], p["dataset"]), "train" if train else "test")
    ds = tf.data.Dataset.from_tensor_slices((images, labels.astype("int64")))
    if train:
        ds = ds.shuffle(len(labels)).repeat()
    ds = ds.batch(p["batch_size"], drop_remainder=True)
    return ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y))  # (B, 28, 28), (B,)


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
