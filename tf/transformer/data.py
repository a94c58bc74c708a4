"""Transformer input_fns: encoder-decoder examples from TFRecord shards.

Reads ``data_dir/train-*.tfrecord`` and ``data_dir/eval-*.tfrecord`` with ``meta.json`` and
``tokenizer.json``, the folder ``datasets/prepare_seq2seq.py`` writes (datasets/README.md,
"Encoder-decoder examples"; common/data/text/seq2seq.py). When data_dir holds no TFRecord
shard, it is prepared there first: the word-reversal task of the default corpus (each
sentence of the Python documentation's prose to its words in reverse order; 1,911 pairs,
one right answer each) at this input's source_length and target_length, a shared
byte-level BPE of 4,096 tokens, in this framework's format only: a second or two, so a
fresh clone trains with no separate command. Translation data as WMT ships it:
``datasets/prepare_seq2seq.py --task parallel --input_files train.en train.de --format tfrecord``.

A batch is (features, labels), each tensor int32: features ``input_ids`` and
``attention_mask`` (B, source_length), ``decoder_input_ids`` (the target shifted right
behind <s>) and ``decoder_attention_mask`` (B, target_length); labels (B, target_length).
In PREDICT mode the labels ride in the features (``features["labels"]``), since the
Estimator hands predict no labels and greedy decoding's exact match needs them.

The data's lengths must be this input's (meta.json). Its vocab must fit the model's
embedding table: a vocab with more tokens than model.vocab_size stops the run (its ids
would fall outside the table); a smaller one is accepted and logged, which is how the
published sizes (vocab 37,000) compile on the default corpus's 4,096 tokens. A split with
fewer examples than one batch is repeated until it fills one, and the log says so
(as pytorch/transformer/data.py).
"""

import glob
import logging
import math
import os
from typing import Mapping

import tensorflow as tf

from common.data.text.seq2seq import check_seq2seq_meta, prepare_seq2seq, read_seq2seq_meta, seq2seq_dataset
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")

FEATURES = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask")


def shard_files(data_dir: str, split: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(data_dir), f"{split}-*.tfrecord")))


def ensure_prepared(input_params: Mapping) -> None:
    """Prepare the reversal task of the default corpus in data_dir unless it holds TFRecord shards already."""
    data_dir = input_params["data_dir"]
    if shard_files(data_dir, "train"):
        return
    source_length, target_length = input_params["source_length"], input_params["target_length"]
    results = prepare_seq2seq(data_dir, task="reversal", source_length=source_length, target_length=target_length,
                              formats=("tfrecord",), log=lambda line: None)
    logger.info("data: %s had no TFRecord shards: prepared %s examples of the reversal task there from the "
                "default corpus (%d -> %d tokens; datasets/prepare_seq2seq.py for other data)", data_dir,
                f"{sum(r.examples for r in results):,}", source_length, target_length)


def check_meta(input_params: Mapping, model: Mapping) -> dict:
    """data_dir's meta.json, after checking its vocab fits the model and its lengths are this input's."""
    data_dir = input_params["data_dir"]
    meta = read_seq2seq_meta(data_dir)
    if meta["vocab_size"] > model["vocab_size"]:
        # check_seq2seq_meta's one line: the data's vocab against the model's
        check_seq2seq_meta(data_dir, model["vocab_size"], input_params["source_length"], input_params["target_length"])
    # the lengths (the vocab, equal or smaller, passes)
    check_seq2seq_meta(data_dir, meta["vocab_size"], input_params["source_length"], input_params["target_length"])
    if meta["vocab_size"] < model["vocab_size"]:
        logger.info("vocab of %s: %d tokens in the model's table of %d (rows %d.. unused)", data_dir,
                    meta["vocab_size"], model["vocab_size"], meta["vocab_size"])
    return meta


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    input_params, model = params["train_input" if train else "eval_input"], params["model"]
    ensure_prepared(input_params)
    meta = check_meta(input_params, model)
    split, data_dir = ("train" if train else "eval"), input_params["data_dir"]
    files = shard_files(data_dir, split)
    if not files:
        raise UserError(f"{data_dir}: no {split} shard ({split}-*.tfrecord); prepare the folder with "
                        f"datasets/prepare_seq2seq.py --format tfrecord")
    source_length, target_length = input_params["source_length"], input_params["target_length"]
    data = seq2seq_dataset(files, source_length, target_length)  # checks each file's schema first
    count, batch_size = int(meta["counts"].get(split, 0)), input_params["batch_size"]
    logger.info("data (%s): %s examples of %d -> %d tokens from %d TFRecord shard(s) in %s", split, f"{count:,}",
                source_length, target_length, len(files), data_dir)
    if input_params["shuffle"]:
        # examples shuffled within a 10,000-example window (all of a default-corpus shard); seeded by runconfig.seed
        data = data.shuffle(10_000, seed=params["runconfig"]["seed"], reshuffle_each_iteration=True)
    if train:
        data = data.repeat()
    elif 0 < count < batch_size and input_params["drop_last"]:
        copies = math.ceil(batch_size / count)
        logger.info("data (%s): %d examples are fewer than one batch of %d: repeated %d times", split, count,
                    batch_size, copies)
        data = data.repeat(copies)
    data = data.batch(batch_size, drop_remainder=input_params["drop_last"])

    def split_features(batch):
        if mode == ModeKeys.PREDICT:  # no labels reach predict's model_fn: they ride in the features
            return {k: batch[k] for k in (*FEATURES, "labels")}
        return {k: batch[k] for k in FEATURES}, batch["labels"]

    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE
    return data.map(split_features, num_parallel_calls=parallel).prefetch(tf.data.AUTOTUNE)


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
