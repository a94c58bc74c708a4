"""ResNet input_fns: the embedded digits (default), CIFAR-10, or TFRecords of an image folder.

``train_input.dataset`` / ``eval_input.dataset`` pick the source:

- digits: the embedded UCI digits (common/data/images.py), padded to 32x32 and pooled or
  repeated to model.image_size, grey copied to each of model.num_channels; no download.
- cifar10: ``data_dir/cifar-10-batches-py`` (the python pickles) or ``cifar-10-batches-bin``
  (the binary format), both read by common.data.images, as tfds would need a download.
- imagefolder: ``data_dir/train-*.tfrecord`` and ``data_dir/val-*.tfrecord`` with
  ``data_dir/classes.txt``, written from a class-per-folder tree by
  ``python datasets/prepare_imagefolder.py`` (which checks every image decodes).

Digits and CIFAR-10 sit in memory as uint8; what is shuffled, repeated and batched is the
example indices, and the map gathers, augments and normalises a whole batch. TFRecords are
decoded, resized (shorter side to 8/7 of image_size) and cropped per example, then batched.
Augmentation (random crop of the zero-padded image, horizontal flip) is train_input's only.
"""

import glob
import logging
import os
from typing import Mapping

import numpy as np
import tensorflow as tf

from common.data.images import MEAN_STD, digits_arrays, read_cifar10
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")

RECORD_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def augment(images: tf.Tensor, padding: int, flip: bool, seed: tf.Tensor) -> tf.Tensor:
    """(B, H, W, C) -> (B, H, W, C): each image cropped at a random offset from its zero-padded
    self, and mirrored left-right with probability 1/2 when ``flip``. Stateless random ops
    seeded by ``seed`` (2,): the same batch gets the same draw however tf.data schedules the map."""
    b, h, w = tf.shape(images)[0], images.shape[1], images.shape[2]
    if padding:
        padded = tf.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])  # (B, H+2p, W+2p, C)
        offsets = tf.random.stateless_uniform([b, 2], seed, 0, 2 * padding + 1, dtype=tf.int32)
        rows = offsets[:, :1] + tf.range(h)[None]  # (B, H)
        cols = offsets[:, 1:] + tf.range(w)[None]  # (B, W)
        images = tf.gather(tf.gather(padded, rows, axis=1, batch_dims=1), cols, axis=2, batch_dims=1)
    if flip:
        mirrored = tf.random.stateless_uniform([b], seed + [0, 1]) < 0.5
        images = tf.where(mirrored[:, None, None, None], tf.reverse(images, [2]), images)
    return images


def check_batch(input_params: Mapping, count: int, train: bool) -> None:
    if input_params["drop_last"] and input_params["batch_size"] > count:
        raise UserError(f"{'train' if train else 'eval'}_input.batch_size {input_params['batch_size']} is larger "
                        f"than the {count:,} examples, and drop_last drops the only, partial, batch")


def array_input(images: np.ndarray, labels: np.ndarray, input_params: Mapping, dataset: str,
                train: bool, seed: int, upscale: int = 1) -> tf.data.Dataset:
    """Batches of (images (B, H, W, C) float32 normalised, labels (B,) int64) from uint8 arrays,
    each pixel repeated ``upscale`` times along H and W in the map (a small constant in the graph)."""
    count = len(labels)
    check_batch(input_params, count, train)
    images_t, labels_t = tf.constant(images), tf.constant(labels)  # (N, H, W, C) uint8, (N,) int64
    mean, std = (tf.constant(v[:images.shape[-1]], tf.float32) for v in MEAN_STD[dataset])
    padding = input_params["random_crop_padding"] if train else 0
    flip = input_params["random_flip"] if train else False

    def gather(batch, indices):  # the batch's number (counting every epoch's), (B,) int64
        x = tf.cast(tf.gather(images_t, indices), tf.float32) / 255.0  # (B, H, W, C) in [0, 1]
        if upscale > 1:
            x = tf.repeat(tf.repeat(x, upscale, axis=1), upscale, axis=2)  # (B, H*k, W*k, C)
        x = augment(x, padding, flip, tf.stack([tf.constant(seed, tf.int64), 2 * batch]))
        return (x - mean) / std, tf.gather(labels_t, indices)

    data = tf.data.Dataset.range(count)
    if input_params["shuffle"]:
        # the whole split, reshuffled each epoch; seeded by the graph seed (runconfig.seed)
        data = data.shuffle(count, reshuffle_each_iteration=True)
    if train:
        data = data.repeat()
    data = data.batch(input_params["batch_size"], drop_remainder=input_params["drop_last"]).enumerate()
    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE
    return data.map(gather, num_parallel_calls=parallel).prefetch(tf.data.AUTOTUNE)


def record_files(data_dir: str, split: str) -> tuple[list[str], list[str]]:
    """The split's TFRecord files and the class names of data_dir/classes.txt."""
    files = sorted(glob.glob(os.path.join(glob.escape(data_dir), f"{split}-*.tfrecord")))
    classes_path = os.path.join(data_dir, "classes.txt")
    if not files or not os.path.isfile(classes_path):
        raise UserError(f"{data_dir}: holds no {split}-*.tfrecord and classes.txt (dataset: imagefolder); write "
                        f"them from a class-per-folder tree with: python datasets/prepare_imagefolder.py "
                        f"--source <folder with train/ and val/> --data_dir {data_dir}")
    with open(classes_path, encoding="utf-8") as f:
        return files, [line.strip() for line in f if line.strip()]


def record_input(input_params: Mapping, model: Mapping, train: bool) -> tuple[tf.data.Dataset, str]:
    split = "train" if train else "val"
    files, classes = record_files(input_params["data_dir"], split)
    if len(classes) != model["num_classes"]:
        raise UserError(f"{input_params['data_dir']}/classes.txt: {len(classes)} classes, but model.num_classes "
                        f"is {model['num_classes']}")
    size, padding = model["image_size"], input_params["random_crop_padding"] if train else 0
    flip = input_params["random_flip"] if train else False
    mean, std = (tf.constant(v, tf.float32) for v in MEAN_STD["imagefolder"])
    resized = size * 8 // 7  # 256 for 224, as the usual ImageNet evaluation

    def decode(record):
        example = tf.io.parse_single_example(record, RECORD_FEATURES)
        image = tf.io.decode_image(example["image/encoded"], channels=3, expand_animations=False)  # (h, w, 3)
        hw = tf.cast(tf.shape(image)[:2], tf.float32)
        scale = resized / tf.reduce_min(hw)  # the shorter side to `resized`, keeping the aspect ratio
        image = tf.image.resize(tf.cast(image, tf.float32) / 255.0, tf.cast(tf.round(hw * scale), tf.int32))
        if train:
            image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
            image = tf.image.random_crop(image, [size, size, 3])
            if flip:
                image = tf.image.random_flip_left_right(image)
        else:
            image = tf.image.resize_with_crop_or_pad(image, size, size)  # the centre crop
        return (image - mean) / std, example["image/class/label"]

    data = tf.data.TFRecordDataset(files)
    if input_params["shuffle"]:
        data = data.shuffle(10_000, reshuffle_each_iteration=True)
    if train:
        data = data.repeat()
    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE
    data = data.map(decode, num_parallel_calls=parallel)
    data = data.batch(input_params["batch_size"], drop_remainder=input_params["drop_last"])
    return data.prefetch(tf.data.AUTOTUNE), f"TFRecords {', '.join(files[:2])}{' ...' if len(files) > 2 else ''} " \
                                            f"({len(classes)} classes)"


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    input_params, model = params["train_input" if train else "eval_input"], params["model"]
    dataset = input_params["dataset"]
    if dataset == "imagefolder":
        data, description = record_input(input_params, model, train)
    else:
        split, size, upscale = "train" if train else "test", model["image_size"], 1
        if dataset == "digits":
            if size > 32 and size % 32 == 0:  # 224: the 32x32 digits go in the graph, repeated 7x7 in the map
                size, upscale = 32, size // 32
            images, labels, description = digits_arrays(split, size, model["num_channels"])
            description = description.replace(f"{size}x{size}x", f"{size * upscale}x{size * upscale}x")
        else:
            images, labels, description = read_cifar10(input_params["data_dir"], split)
            if model["num_classes"] != 10:
                raise UserError(f"{description}: 10 classes, but model.num_classes is {model['num_classes']}")
        # the digits' labels 0-9 are valid for any larger head, so they stand in for any dataset
        # (a compile needs only a batch's shapes: README.md)
        if model["num_classes"] < 10:
            raise UserError(f"{description}: 10 classes, but model.num_classes is {model['num_classes']}")
        if (images.shape[1] * upscale, images.shape[2] * upscale, images.shape[3]) != \
                (model["image_size"], model["image_size"], model["num_channels"]):
            raise UserError(f"{description}: images are {'x'.join(map(str, images.shape[1:]))}, but the model "
                            f"takes model.image_size {model['image_size']} x model.num_channels "
                            f"{model['num_channels']}")
        data = array_input(images, labels, input_params, dataset, train, params["runconfig"]["seed"], upscale)
    logger.info("data (%s): %s", "train" if train else "eval", description)
    return data


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
