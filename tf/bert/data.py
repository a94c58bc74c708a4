"""BERT input_fns: prepared pretraining TFRecords, or sequence-classification examples.

model.task pretraining reads ``data_dir/train-*.tfrecord`` (train) and
``data_dir/eval-*.tfrecord`` (eval), the shards ``python datasets/prepare_bert.py`` writes
(Google's create_pretraining_data features; common/data/text/tfrecord.py checks each
file's schema and lengths first). When data_dir holds no TFRecord shard, they are prepared
there first from the default corpus, with this config's max_sequence_length and
max_predictions_per_seq (one log line; seconds), so that a fresh clone trains with no
separate command. Batches: features input_ids, input_mask, segment_ids,
masked_lm_positions; labels masked_lm_ids, masked_lm_weights, next_sentence_labels.

model.task classifier reads ``classifier_task`` (common/data/text/classification.py:
corpus_topics from the default corpus, or GLUE's SST-2 / MNLI TSVs in data_dir), tokenised
with the vocab of the pretraining data (``vocab_file``, else data_dir/vocab.txt, prepared
as above when missing): features input_ids, input_mask, segment_ids; labels (B,) int32.

The vocab must fit the model: more tokens than model.vocab_size would index past the
embedding table. Fewer are allowed (as BERT checkpoints pad their vocab to a round size),
which is how base and large configs compile on the default corpus's vocab.
"""

import glob
import logging
import os
from typing import Mapping

import tensorflow as tf

from common.data.text.pretraining import MaskingConfig
from common.data.text.tfrecord import pretraining_dataset
from common.errors import UserError
from common.tf.estimator import ModeKeys

logger = logging.getLogger("zoo")

FEATURES = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions")
LABELS = ("masked_lm_ids", "masked_lm_weights", "next_sentence_labels")


def shard_files(data_dir: str, split: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(data_dir), f"{split}-*.tfrecord")))


def prepare_if_missing(input_params: Mapping) -> None:
    """Prepare data_dir from the default corpus when it holds no TFRecord shard (and no vocab_file is given)."""
    data_dir = input_params["data_dir"]
    if shard_files(data_dir, "train") and os.path.isfile(os.path.join(data_dir, "vocab.txt")):
        return
    from common.data.text.prepare import prepare_bert

    masking = MaskingConfig(input_params["max_sequence_length"], input_params["max_predictions_per_seq"])
    results = prepare_bert(data_dir, masking=masking, formats=("tfrecord",), log=lambda line: None)
    logger.info("%s held no pretraining TFRecords: prepared %d examples from the default corpus there "
                "(python datasets/prepare_bert.py --output_dir %s for other text)", data_dir,
                sum(r.examples for r in results), data_dir)


def vocab_path(input_params: Mapping) -> str:
    return input_params["vocab_file"] or os.path.join(input_params["data_dir"], "vocab.txt")


def check_vocab(input_params: Mapping, model: Mapping) -> str:
    """The vocab file's path, refused when it has more tokens than the model's embedding has rows."""
    path = vocab_path(input_params)
    if not os.path.isfile(path):
        raise UserError(f"{path}: no such vocab file (write one with python datasets/prepare_bert.py "
                        f"--output_dir {input_params['data_dir']})")
    with open(path, encoding="utf-8") as f:
        size = sum(1 for line in f if line.rstrip("\n"))
    if size > model["vocab_size"]:
        raise UserError(f"{path}: {size:,} tokens, more than model.vocab_size {model['vocab_size']:,} "
                        f"(ids past the embedding table); set model.vocab_size: {size}")
    return path


def check_lengths(input_params: Mapping, model: Mapping, section: str) -> None:
    if input_params["max_sequence_length"] > model["max_position_embeddings"]:
        raise UserError(f"{section}.max_sequence_length {input_params['max_sequence_length']} is more than "
                        f"model.max_position_embeddings {model['max_position_embeddings']}")


def pretraining_input(input_params: Mapping, model: Mapping, train: bool, seed: int) -> tf.data.Dataset:
    split = "train" if train else "eval"
    data_dir = input_params["data_dir"]
    prepare_if_missing(input_params)
    check_vocab(input_params, model)
    files = shard_files(data_dir, split)
    if not files:
        raise UserError(f"{data_dir}: holds no {split}-*.tfrecord shard; write them with: python "
                        f"datasets/prepare_bert.py --output_dir {data_dir}")
    data = pretraining_dataset(files, input_params["max_sequence_length"], input_params["max_predictions_per_seq"])
    if input_params["shuffle"]:
        # examples shuffled within a 10,000-example window (all of a default-corpus shard); seeded by runconfig.seed
        data = data.shuffle(10_000, seed=seed, reshuffle_each_iteration=True)
    if train:
        data = data.repeat()
    data = data.batch(input_params["batch_size"], drop_remainder=input_params["drop_last"])
    parallel = input_params["num_parallel_calls"] or tf.data.AUTOTUNE

    def split_features(batch):
        return {k: batch[k] for k in FEATURES}, {k: batch[k] for k in LABELS}

    logger.info("data (%s): TFRecords %s%s", split, ", ".join(files[:2]), " ..." if len(files) > 2 else "")
    return data.map(split_features, num_parallel_calls=parallel).prefetch(tf.data.AUTOTUNE)


def classifier_input(input_params: Mapping, model: Mapping, train: bool, seed: int) -> tf.data.Dataset:
    from common.data.text.classification import encode_pairs, load_task
    from common.data.text.tokenizer import read_bert_tokenizer

    if input_params["classifier_task"] == "corpus_topics" and not input_params["vocab_file"]:
        prepare_if_missing(input_params)  # data_dir is the pretraining data's, for its vocab.txt
    path = check_vocab(input_params, model)
    task = load_task(input_params["classifier_task"], input_params["data_dir"])
    if task.num_classes != model["num_classes"]:
        raise UserError(f"{input_params['classifier_task']}: {task.num_classes} classes, but model.num_classes "
                        f"is {model['num_classes']}")
    examples = task.train if train else task.eval
    arrays = encode_pairs(examples, read_bert_tokenizer(path), input_params["max_sequence_length"])
    count = len(arrays["labels"])
    if input_params["drop_last"] and input_params["batch_size"] > count:
        raise UserError(f"{'train' if train else 'eval'}_input.batch_size {input_params['batch_size']} is larger "
                        f"than the {count:,} examples of {task.name}, and drop_last drops the only, partial, batch")
    features = {k: arrays[k] for k in ("input_ids", "input_mask", "segment_ids")}
    data = tf.data.Dataset.from_tensor_slices((features, arrays["labels"]))
    if input_params["shuffle"]:
        data = data.shuffle(count, seed=seed, reshuffle_each_iteration=True)
    if train:
        data = data.repeat()
    data = data.batch(input_params["batch_size"], drop_remainder=input_params["drop_last"])
    logger.info("data (%s): %s, %d examples, %d classes", "train" if train else "eval", task.name, count,
                task.num_classes)
    return data.prefetch(tf.data.AUTOTUNE)


def input_fn(params: Mapping, mode: str) -> tf.data.Dataset:
    train = mode == ModeKeys.TRAIN
    section = "train_input" if train else "eval_input"
    input_params, model = params[section], params["model"]
    check_lengths(input_params, model, section)
    make = pretraining_input if model["task"] == "pretraining" else classifier_input
    return make(input_params, model, train, params["runconfig"]["seed"])


def train_input_fn(params: Mapping, mode: str = ModeKeys.TRAIN) -> tf.data.Dataset:
    return input_fn(params, mode)


def eval_input_fn(params: Mapping, mode: str = ModeKeys.EVAL) -> tf.data.Dataset:
    return input_fn(params, mode)
