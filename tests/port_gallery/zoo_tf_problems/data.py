"""Tabular features from an .npz file."""
import numpy as np
import tensorflow as tf

from common.tf.estimator import ModeKeys


def input_fn(params, mode):
    p = params["train_input"] if mode == ModeKeys.TRAIN else params["eval_input"]
    arrays = np.load(p["data_file"])
    ds = tf.data.Dataset.from_tensor_slices((arrays["features"].astype(np.float32), arrays["labels"]))
    if mode == ModeKeys.TRAIN:
        ds = ds.shuffle(10_000)
    return ds.batch(p["batch_size"])


def train_input_fn(params, mode=ModeKeys.TRAIN):
    return input_fn(params, mode)


def eval_input_fn(params, mode=ModeKeys.EVAL):
    return input_fn(params, mode)
