"""MNIST input_fns: tfds ``mnist`` when data_dir holds a prepared one, else the IDX files.

Both sources end as uint8 arrays in memory (MNIST is small), and one pipeline serves
both, in the order the device needs: shuffle, repeat (training), batch with
``drop_remainder`` (static shapes), map, prefetch. What is shuffled, repeated and batched
is the example indices; the map gathers and normalises a whole batch at once, and a
checkpoint of the input position stays small (indices, not images).

Sources, for ``dataset`` auto or mnist: ``data_dir/mnist/<version>`` prepared by tfds
(read with ``tfds.load(download=False)``), else ``data_dir/MNIST/raw`` (the IDX files of
``datasets/prepare_mnist.py``, shared with pytorch/mnist); with neither, "auto" falls back
to the embedded UCI digits (``common.data.mnist``), which "uci_digits" asks for directly.
"""

import glob
import logging
import os
from typing import Mapping

import numpy as np
import tensorflow as tf

from common.data import MNIST_MEAN, MNIST_STD, load_mnist_arrays, resolve_mnist
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")

IMAGE_PIXELS = 28 * 28


def tfds_prepared(data_dir: str) -> bool:
    """Whether ``data_dir`` holds an mnist that tfds prepared (``mnist/<version>/dataset_info.json``)."""
    return bool(data_dir) and bool(glob.glob(os.path.join(glob.escape(data_dir), "mnist", "*", "dataset_info.json")))


def _tfds_arrays(data_dir: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow_datasets as tfds  # only here: importing it costs a second

    dataset = tfds.load("mnist", split=split, data_dir=data_dir, download=False, as_supervised=True)
    batches = list(tfds.as_numpy(dataset.batch(10_000)))  # [((b, 28, 28, 1) uint8, (b,) int64), ...]
    images = np.concatenate([b[0] for b in batches]).reshape(-1, 28, 28)  # (N, 28, 28)
    labels = np.concatenate([b[1] for b in batches]).astype(np.int64)  # (N,)
    return images, labels


def load_arrays(input_params: Mapping, train: bool) -> tuple[np.ndarray, np.ndarray, str]:
    """uint8 images (N, 28, 28), int64 labels (N,), and what they are (for the log line)."""
    data_dir, dataset = input_params["data_dir"], input_params["dataset"]
    split = "train" if train else "test"
    if dataset != "uci_digits" and tfds_prepared(data_dir):
        images, labels = _tfds_arrays(data_dir, split)
        return images, labels, f"tfds mnist from {data_dir} ({len(labels):,} {split}, 28x28)"
    location = resolve_mnist(data_dir, dataset)
    images, labels = load_mnist_arrays(location, split)
    return images, labels, location.description


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    """Batches of (images (B, 784) float32 normalised, labels (B,) int64)."""
    train = mode == ModeKeys.TRAIN
    input_params = params["train_input"] if train else params["eval_input"]
    images, labels, description = load_arrays(input_params, train)
    logger.info("data (%s): %s", "train" if train else "eval", description)
    batch_size, count = input_params["batch_size"], len(labels)
    if batch_size <= 0:
        raise UserError(f"{'train' if train else 'eval'}_input.batch_size must be positive, got {batch_size}")
    if input_params["drop_last"] and batch_size > count:
        raise UserError(f"{'train' if train else 'eval'}_input.batch_size {batch_size} is larger than the "
                        f"{count:,} examples, and drop_last drops the only, partial, batch")

    images_t = tf.constant(images)  # (N, 28, 28) uint8
    labels_t = tf.constant(labels)  # (N,) int64

    def gather(indices):  # (B,) int64
        x = tf.cast(tf.gather(images_t, indices), tf.float32) / 255.0  # (B, 28, 28) in [0, 1]
        x = (x - MNIST_MEAN) / MNIST_STD
        return tf.reshape(x, [-1, IMAGE_PIXELS]), tf.gather(labels_t, indices)  # (B, 784), (B,)

    dataset = tf.data.Dataset.range(count)
    if input_params["shuffle"]:
        # the whole split, reshuffled each epoch; seeded by the graph seed (runconfig.seed)
        dataset = dataset.shuffle(count, reshuffle_each_iteration=True)
    if train:
        dataset = dataset.repeat()
    dataset = dataset.batch(batch_size, drop_remainder=input_params["drop_last"])
    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE
    return dataset.map(gather, num_parallel_calls=parallel).prefetch(tf.data.AUTOTUNE)


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
