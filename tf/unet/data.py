"""UNet input_fns over common/data/segmentation.py: digit canvases, image + mask folders, Severstal.

The arrays are read once into memory; one pipeline serves every source, in the order the
device needs: shuffle, repeat (training), batch with ``drop_remainder`` (static shapes),
map, prefetch. What is shuffled and batched is the example indices; the map gathers a
whole batch and scales it to [0, 1]. Images are (B, H, W, C) float32, masks (B, H, W) int32.
"""

import logging
from typing import Mapping

import tensorflow as tf

from common.data.segmentation import load_segmentation
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    section = "train_input" if train else "eval_input"
    input_params = params[section]
    images, masks, description = load_segmentation(input_params, params["model"], "train" if train else "test")
    logger.info("data (%s): %s", "train" if train else "eval", description)
    batch_size, count = input_params["batch_size"], len(masks)
    if input_params["drop_last"] and batch_size > count:
        raise UserError(f"{section}.batch_size {batch_size} is larger than the {count:,} examples, and drop_last "
                        f"drops the only, partial, batch")

    images_t = tf.constant(images)  # (N, H, W, C) uint8
    masks_t = tf.constant(masks)  # (N, H, W) uint8

    def gather(indices):  # (B,) int64
        x = tf.cast(tf.gather(images_t, indices), tf.float32) / 255.0  # (B, H, W, C) in [0, 1]
        return x, tf.cast(tf.gather(masks_t, indices), tf.int32)  # (B, H, W, C), (B, H, W)

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
