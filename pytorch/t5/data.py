"""T5 DataLoaders: span-corruption examples from HDF5 shards.

Reads ``data_dir/train-*.h5`` and ``data_dir/eval-*.h5`` with ``meta.json`` and
``tokenizer.json``, the folder ``datasets/prepare_seq2seq.py --task span_corruption``
writes (common/data/text/seq2seq.py: the corpus cut into chunks, about 15 % of each chunk's
tokens dropped in spans of mean length 3, each span one sentinel in the input, the target
listing the dropped spans behind their sentinels; a unigram vocabulary of 4,096 pieces
whose last 100 ids are the sentinels, <pad> = 0 = the decoder's start, </s> = 1). When
data_dir holds no HDF5 shard, it is prepared there first from the default corpus (the
Python documentation's prose, shipped with CPython) at this input's source_length and
target_length, in this framework's format only: a second or two, so a fresh clone trains
with no separate command. Any other encoder-decoder folder of prepare_seq2seq.py (the
reversal or a parallel task) is read the same way.

A batch is a tuple of int64 tensors in model.FIELDS order (the device takes tuples):
input_ids and attention_mask (B, source_length); decoder_input_ids (the target shifted
right behind the start id), decoder_attention_mask and labels (B, target_length).

The data's lengths must be this input's (meta.json). Its vocab must fit the model's
embedding table: a vocab with more tokens than model.vocab_size stops the run (its ids
would fall outside the table); a smaller one is accepted and logged, which is how the
published sizes (vocab 32,128) compile on the default corpus's 4,096 pieces. A split with
fewer examples than one batch is repeated until it fills one, and the log says so.
"""

import glob
import logging
import math
import os
from typing import Mapping

import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from torch.utils.data.dataloader import default_collate

from common.data.text.seq2seq import Seq2SeqHDF5Dataset, check_seq2seq_meta, prepare_seq2seq, read_seq2seq_meta
from common.errors import UserError

logger = logging.getLogger("zoo")

# model.FIELDS (the folder's files do not import each other)
FIELDS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


def ensure_prepared(input_params: Mapping) -> None:
    """Prepare span corruption of the default corpus in data_dir unless it holds HDF5 shards already."""
    data_dir = input_params["data_dir"]
    if glob.glob(os.path.join(data_dir, "*.h5")):
        return
    source_length, target_length = input_params["source_length"], input_params["target_length"]
    results = prepare_seq2seq(data_dir, task="span_corruption", source_length=source_length,
                              target_length=target_length, formats=("hdf5",), log=lambda line: None)
    logger.info("data: %s had no HDF5 shards: prepared %s span-corruption examples there from the default "
                "corpus (%d -> %d tokens; datasets/prepare_seq2seq.py for other data)", data_dir,
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


def collate(items: list[dict]) -> tuple[torch.Tensor, ...]:
    batch = default_collate(items)
    return tuple(batch[name] for name in FIELDS)


def seq2seq_dataset(input_params: Mapping, model: Mapping, train: bool) -> Dataset:
    ensure_prepared(input_params)
    check_meta(input_params, model)
    split = "train" if train else "eval"
    paths = sorted(glob.glob(os.path.join(input_params["data_dir"], f"{split}-*.h5")))
    if not paths:
        raise UserError(f"{input_params['data_dir']}: no {split} shard ({split}-*.h5); prepare the folder with "
                        f"datasets/prepare_seq2seq.py --format hdf5")
    dataset = Seq2SeqHDF5Dataset(paths, input_params["source_length"], input_params["target_length"])
    logger.info("data (%s): %s examples of %d -> %d tokens from %d HDF5 shard(s) in %s", split, f"{len(dataset):,}",
                input_params["source_length"], input_params["target_length"], len(paths), input_params["data_dir"])
    batch_size = input_params["batch_size"]
    if len(dataset) < batch_size and input_params["drop_last"]:
        copies = math.ceil(batch_size / len(dataset))
        logger.info("data (%s): %d examples are fewer than one batch of %d: repeated %d times", split,
                    len(dataset), batch_size, copies)
        return ConcatDataset([dataset] * copies)
    return dataset


def _dataloader(params: Mapping, train: bool) -> DataLoader:
    input_params = params["train_input" if train else "eval_input"]
    return DataLoader(seq2seq_dataset(input_params, params["model"], train), batch_size=input_params["batch_size"],
                      shuffle=input_params["shuffle"], drop_last=input_params["drop_last"],
                      num_workers=input_params["num_workers"], collate_fn=collate)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=False)
