"""Llama DataLoaders: packed next-token windows from HDF5 shards (pytorch/gpt2's, with the
tokenizer also written as tokenizer.json).

Reads ``data_dir/train-*.h5`` and ``data_dir/eval-*.h5`` with its ``meta.json``, the
folder ``datasets/prepare_gpt2.py --tokenizer_json`` writes (common/data/text/lm.py: the documents
concatenated, each followed by <|endoftext|>, cut into windows of max_sequence_length
tokens; the labels are the inputs shifted by one). When data_dir holds no HDF5 shard, it is
prepared there first from the default corpus (the Python documentation's prose, shipped
with CPython) with this config's max_sequence_length, in this framework's format only: a
second or two, so a fresh clone trains with no separate command; the tokenizer lands beside
the shards as ``tokenizer.json`` (``tokenizers.Tokenizer.from_file`` and transformers'
PreTrainedTokenizerFast load it; prompts are tokenized with it).

A batch is a tuple of int64 tensors (B, T) in model.FIELDS order (the device takes
tuples): input_ids, attention_mask (1 where the label is a real token, 0 on the padding
of the corpus's last window), labels.

The data's vocab (meta.json) must fit the model's embedding table: a vocab with more
tokens than model.vocab_size stops the run (its ids would fall outside the table). A
smaller one is accepted and logged: the ids fit, which is how the published sizes
(vocab 32,000 and 128,256) compile on the default corpus's 4,096 pieces. A split with fewer examples
than one batch (the default corpus at MSL 1024 and 2048 holds tens of windows, the
published batches are hundreds) is repeated until it fills a batch, and the log says so.
"""

import glob
import logging
import math
import os
from typing import Mapping

import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset
from torch.utils.data.dataloader import default_collate

from common.data.text.lm import LMHDF5Dataset, prepare_lm, read_lm_meta
from common.errors import UserError

logger = logging.getLogger("zoo")

FIELDS = ("input_ids", "attention_mask", "labels")  # model.FIELDS (the folder's files do not import each other)


def check_lengths(input_params: Mapping, model: Mapping) -> None:
    if input_params["max_sequence_length"] > model["max_position_embeddings"]:
        raise UserError(f"max_sequence_length {input_params['max_sequence_length']} is longer than "
                        f"model.max_position_embeddings {model['max_position_embeddings']} (the positions the "
                        f"model has embeddings for)")


def ensure_prepared(input_params: Mapping) -> None:
    """Prepare the default corpus's shards in data_dir unless it holds HDF5 shards already."""
    data_dir = input_params["data_dir"]
    if glob.glob(os.path.join(data_dir, "*.h5")):
        return
    msl = input_params["max_sequence_length"]
    # prepare_lm's own lines are summed up in the one below (its progress bar stays)
    results = prepare_lm(data_dir, max_seq_length=msl, formats=("hdf5",), tokenizer_json=True, log=lambda line: None)
    logger.info("data: %s had no HDF5 shards: prepared %s examples there from the default corpus "
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


def collate(items: list[dict]) -> tuple[torch.Tensor, ...]:
    batch = default_collate(items)
    return tuple(batch[name] for name in FIELDS)


def lm_dataset(input_params: Mapping, model: Mapping, train: bool) -> Dataset:
    check_lengths(input_params, model)
    ensure_prepared(input_params)
    check_meta(input_params, model)
    split = "train" if train else "eval"
    paths = sorted(glob.glob(os.path.join(input_params["data_dir"], f"{split}-*.h5")))
    if not paths:
        raise UserError(f"{input_params['data_dir']}: no {split} shard ({split}-*.h5); prepare the folder with "
                        f"datasets/prepare_gpt2.py --format hdf5 --tokenizer_json")
    dataset = LMHDF5Dataset(paths, input_params["max_sequence_length"])
    logger.info("data (%s): %s examples of %d tokens from %d HDF5 shard(s) in %s", split, f"{len(dataset):,}",
                input_params["max_sequence_length"], len(paths), input_params["data_dir"])
    batch_size = input_params["batch_size"]
    if len(dataset) < batch_size and input_params["drop_last"]:
        copies = math.ceil(batch_size / len(dataset))
        logger.info("data (%s): %d examples are fewer than one batch of %d: repeated %d times", split,
                    len(dataset), batch_size, copies)
        return ConcatDataset([dataset] * copies)
    return dataset


def _dataloader(params: Mapping, train: bool) -> DataLoader:
    input_params = params["train_input" if train else "eval_input"]
    return DataLoader(lm_dataset(input_params, params["model"], train), batch_size=input_params["batch_size"],
                      shuffle=input_params["shuffle"], drop_last=input_params["drop_last"],
                      num_workers=input_params["num_workers"], collate_fn=collate)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=False)
