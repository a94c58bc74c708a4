"""Llama input_fns: packed next-token windows from TFRecord shards (tf/gpt2's, deliberately
copied, with the tokenizer also written as tokenizer.json).

Reads ``data_dir/train-*.tfrecord`` and ``data_dir/eval-*.tfrecord`` with its
``meta.json``, the folder ``datasets/prepare_gpt2.py --tokenizer_json`` writes (common/data/text/lm.py: the
documents concatenated, each followed by <|endoftext|>, cut into windows of
max_sequence_length tokens; the labels are the inputs shifted by one). When data_dir holds
no TFRecord shard, it is prepared there first from the default corpus (the Python
documentation's prose, shipped with CPython) with this config's max_sequence_length, in
this framework's format only: a second or two, so a fresh clone trains with no separate
command; the tokenizer lands beside the shards as ``tokenizer.json``
(``tokenizers.Tokenizer.from_file`` and transformers' PreTrainedTokenizerFast load it;
prompts are tokenized with it).

A batch is (features, labels): features ``input_ids`` and ``attention_mask`` (1 where the
label is a real token, 0 on the padding of the corpus's last window), labels the next
tokens; each (B, T) int32.

The data's vocab (meta.json) must fit the model's embedding table: a vocab with more
tokens than model.vocab_size stops the run (its ids would fall outside the table). A
smaller one is accepted and logged: the ids fit, which is how the published sizes
(vocab 32,000 and 128,256) compile on the default corpus's 4,096 pieces. A split with fewer
examples than one batch (the default corpus at MSL 4096 and 8192 holds a few windows, the
published batches are hundreds) is repeated until it fills a batch, and the log says so.
"""

import glob
import logging
import math
import os
from typing import Mapping

import tensorflow as tf

from common.data.text.lm import lm_dataset, prepare_lm, read_lm_meta
from common.data.text.prompts import encode_prompts, prompt_dataset
from common.data.text.tokenizer import read_tokenizer_json
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")


def shard_files(data_dir: str, split: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(data_dir), f"{split}-*.tfrecord")))


def check_lengths(input_params: Mapping, model: Mapping) -> None:
    if input_params["max_sequence_length"] > model["max_position_embeddings"]:
        raise UserError(f"max_sequence_length {input_params['max_sequence_length']} is longer than "
                        f"model.max_position_embeddings {model['max_position_embeddings']} (the positions the "
                        f"model has embeddings for)")


def ensure_prepared(input_params: Mapping) -> None:
    """Prepare the default corpus's shards in data_dir unless it holds TFRecord shards already."""
    data_dir = input_params["data_dir"]
    if shard_files(data_dir, "train"):
        return
    msl = input_params["max_sequence_length"]
    # prepare_lm's own lines are summed up in the one below (its progress bar stays)
    results = prepare_lm(data_dir, max_seq_length=msl, formats=("tfrecord",), tokenizer_json=True,
                         log=lambda line: None)
    logger.info("data: %s had no TFRecord shards: prepared %s examples there from the default corpus "
                "(max_seq_length %d; datasets/prepare_gpt2.py --tokenizer_json for other text)", data_dir,
                f"{sum(r.examples for r in results):,}", msl)


def check_meta(input_params: Mapping, model: Mapping) -> dict:
    """data_dir's meta.json, after checking its vocab fits the model and its windows are this input's length."""
    data_dir = input_params["data_dir"]
    meta = read_lm_meta(data_dir)
    where = os.path.join(data_dir, "meta.json")
    if meta["vocab_size"] > model["vocab_size"]:
        raise UserError(f"{where}: the data's vocab has {meta['vocab_size']:,} tokens, but model.vocab_size is "
                        f"{model['vocab_size']:,}; set model.vocab_size: {meta['vocab_size']} (or use data "
                        f"tokenized with the model's vocab)")
    if meta["max_seq_length"] != input_params["max_sequence_length"]:
        raise UserError(f"{where}: the data's examples have {meta['max_seq_length']} tokens, but "
                        f"max_sequence_length is {input_params['max_sequence_length']}; use a data_dir prepared "
                        f"with --max_seq_length {input_params['max_sequence_length']}")
    if meta["vocab_size"] < model["vocab_size"]:
        logger.info("vocab of %s: %d tokens in the model's table of %d (rows %d.. unused)", data_dir,
                    meta["vocab_size"], model["vocab_size"], meta["vocab_size"])
    return meta


def prompts_input_fn(params: Mapping) -> tf.data.Dataset:
    """predict from predict_input.prompt_file: (tokens (B, L), prompt_length (B,)) batches, the
    prompts tokenized with eval_input.data_dir's tokenizer.json (common/data/text/prompts.py);
    the last batch may be short."""
    predict_input, data_dir = params["predict_input"], params["eval_input"]["data_dir"]
    tokenizer = read_tokenizer_json(os.path.join(data_dir, "tokenizer.json"))
    arrays = encode_prompts(predict_input["prompt_file"], tokenizer, predict_input["max_new_tokens"],
                            params["model"]["max_position_embeddings"])
    logger.info("predict: %d prompts from %s, %d new tokens each", len(arrays["tokens"]),
                predict_input["prompt_file"], predict_input["max_new_tokens"])
    return prompt_dataset(arrays, predict_input["batch_size"])


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    input_params, model = params["train_input" if train else "eval_input"], params["model"]
    check_lengths(input_params, model)
    ensure_prepared(input_params)
    meta = check_meta(input_params, model)
    if mode == ModeKeys.PREDICT and params["predict_input"]["prompt_file"] is not None:
        return prompts_input_fn(params)
    split, data_dir = ("train" if train else "eval"), input_params["data_dir"]
    files = shard_files(data_dir, split)
    if not files:
        raise UserError(f"{data_dir}: no {split} shard ({split}-*.tfrecord); prepare the folder with "
                        f"datasets/prepare_gpt2.py --format tfrecord --tokenizer_json")
    data = lm_dataset(files, input_params["max_sequence_length"])  # checks each file's schema first
    count, batch_size = int(meta["counts"].get(split, 0)), input_params["batch_size"]
    logger.info("data (%s): %s examples of %d tokens from %d TFRecord shard(s) in %s", split, f"{count:,}",
                input_params["max_sequence_length"], len(files), data_dir)
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
        return {k: batch[k] for k in ("input_ids", "attention_mask")}, batch["labels"]

    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE
    return data.map(split_features, num_parallel_calls=parallel).prefetch(tf.data.AUTOTUNE)


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
