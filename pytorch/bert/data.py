"""BERT DataLoaders: pretraining examples from HDF5 shards; classification examples from a task.

Classification (model.task classifier): ``classifier_task`` of common/data/text/classification.py,
corpus_topics (the default: which pydoc topic a sentence of the default corpus comes from;
tokenized with data_dir's vocab, prepared as above if absent), or GLUE's sst2 / mnli
(data_dir: the GLUE task's folder; vocab_file: the pretraining data's vocab.txt). A batch
is (input_ids, input_mask, segment_ids (B, T), labels (B,)), all int64, as Google's
run_classifier encodes them: [CLS] a [SEP] (b [SEP]).

Pretraining (model.task pretraining) reads ``data_dir/train-*.hdf5`` and
``data_dir/eval-*.hdf5``, the shards ``datasets/prepare_bert.py`` writes (Google's
create_pretraining_data: masked LM + next sentence, common/data/text/). When data_dir
holds no HDF5 shard, they are prepared there first from the default corpus (the Python
documentation's prose, shipped with CPython) with this config's max_sequence_length and
max_predictions_per_seq: a few seconds, so a fresh clone trains with no separate command.

A batch is a tuple of tensors in model.PRETRAINING_FIELDS order (the device takes tuples):
input_ids, input_mask, segment_ids (B, T) int64; masked_lm_positions, masked_lm_ids (B, P)
int64, masked_lm_weights (B, P) float32; next_sentence_labels (B,) int64.

The vocab (``vocab_file``, default data_dir/vocab.txt) must fit the model's embedding
table: a vocab with more tokens than model.vocab_size stops the run (its ids would fall
outside the table). A smaller one is accepted and logged: the ids fit, and BERT tables
are often larger than their vocab (the default corpus's 3,796 pieces standing in for
Google's 30,522 in a compile of the base and large configs).
"""

import glob
import logging
import os
from typing import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import default_collate

from common.data.text.classification import encode_pairs, load_task
from common.data.text.prepare import prepare_bert
from common.data.text.pretraining import MaskingConfig
from common.data.text.tokenizer import read_bert_tokenizer
from common.data.text.torch_dataset import PretrainingHDF5Dataset
from common.errors import UserError

logger = logging.getLogger("zoo")

# model.PRETRAINING_FIELDS and model.CLASSIFIER_FIELDS (the folder's files do not import each other)
PRETRAINING_FIELDS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                      "masked_lm_weights", "next_sentence_labels")
CLASSIFIER_FIELDS = ("input_ids", "input_mask", "segment_ids", "labels")


def check_lengths(input_params: Mapping, model: Mapping) -> None:
    if input_params["max_sequence_length"] > model["max_position_embeddings"]:
        raise UserError(f"max_sequence_length {input_params['max_sequence_length']} is longer than "
                        f"model.max_position_embeddings {model['max_position_embeddings']} (the positions the "
                        f"model has embeddings for)")


def vocab_path(input_params: Mapping) -> str:
    return input_params["vocab_file"] or os.path.join(input_params["data_dir"], "vocab.txt")


def check_vocab(path: str, vocab_size: int) -> int:
    """The number of tokens in the vocab.txt at ``path``; UserError when they overflow the model's table."""
    try:
        with open(path, encoding="utf-8") as f:
            tokens = sum(1 for _ in f)
    except FileNotFoundError:
        raise UserError(f"{path}: no such vocab file (train_input.vocab_file, or vocab.txt in data_dir)") from None
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file (a BERT vocab.txt has one token per line)") from None
    if tokens > vocab_size:
        raise UserError(f"{path}: {tokens:,} tokens, but model.vocab_size is {vocab_size:,}; set "
                        f"model.vocab_size: {tokens} (or use the vocab the model was trained with)")
    if tokens < vocab_size:
        logger.info("vocab %s: %d tokens in the model's table of %d (rows %d.. unused)", path, tokens,
                    vocab_size, tokens)
    return tokens


def ensure_prepared(input_params: Mapping, masking: MaskingConfig | None = None) -> None:
    """Prepare the default corpus's shards in data_dir unless it holds HDF5 shards already
    (with ``masking``; None: this input's max_sequence_length and max_predictions_per_seq)."""
    data_dir = input_params["data_dir"]
    if glob.glob(os.path.join(data_dir, "*.hdf5")):
        return
    masking = masking or MaskingConfig(max_seq_length=input_params["max_sequence_length"],
                                       max_predictions_per_seq=input_params["max_predictions_per_seq"])
    # prepare_bert's own lines are summed up in the one below (its progress bar stays: a few seconds)
    results = prepare_bert(data_dir, masking=masking, formats=("hdf5",), log=lambda line: None)
    examples = sum(r.examples for r in results)
    logger.info("data: %s had no HDF5 shards: prepared %s examples there from the default corpus "
                "(max_seq_length %d, max_predictions_per_seq %d; datasets/prepare_bert.py for other text)",
                data_dir, f"{examples:,}", masking.max_seq_length, masking.max_predictions_per_seq)


def collate_pretraining(items: list[dict]) -> tuple[torch.Tensor, ...]:
    batch = default_collate(items)
    return tuple(batch[name] for name in PRETRAINING_FIELDS)


def pretraining_dataset(input_params: Mapping, model: Mapping, train: bool) -> PretrainingHDF5Dataset:
    check_lengths(input_params, model)
    ensure_prepared(input_params)
    check_vocab(vocab_path(input_params), model["vocab_size"])
    split = "train" if train else "eval"
    pattern = os.path.join(input_params["data_dir"], f"{split}-*.hdf5")
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise UserError(f"{input_params['data_dir']}: no {split} shard ({split}-*.hdf5); prepare the folder with "
                        f"datasets/prepare_bert.py --formats hdf5")
    dataset = PretrainingHDF5Dataset(paths, input_params["max_sequence_length"],
                                     input_params["max_predictions_per_seq"])
    logger.info("data (%s): %s examples from %d HDF5 shard(s) in %s", split, f"{len(dataset):,}", len(paths),
                input_params["data_dir"])
    return dataset


def classifier_dataset(input_params: Mapping, model: Mapping, train: bool) -> TensorDataset:
    check_lengths(input_params, model)
    name = input_params["classifier_task"]
    if name == "corpus_topics" and not input_params["vocab_file"]:
        # the vocab of the pretraining data the model starts from; prepared (at the pretraining
        # configs' MSL 128, not the classifier's) if data_dir holds none yet
        ensure_prepared(input_params, MaskingConfig())
    vocab = vocab_path(input_params)
    check_vocab(vocab, model["vocab_size"])
    task = load_task(name, input_params["data_dir"] if name != "corpus_topics" else None)
    if task.num_classes != model["num_classes"]:
        raise UserError(f"classifier task {name}: {task.num_classes} classes, but model.num_classes is "
                        f"{model['num_classes']}")
    arrays = encode_pairs(task.train if train else task.eval, read_bert_tokenizer(vocab),
                          input_params["max_sequence_length"])
    logger.info("data (%s): %s", "train" if train else "eval", task.summary())
    return TensorDataset(*(torch.from_numpy(arrays[f].astype(np.int64)) for f in CLASSIFIER_FIELDS))


def _dataloader(params: Mapping, train: bool) -> DataLoader:
    input_params, model = params["train_input" if train else "eval_input"], params["model"]
    if model["task"] == "classifier":
        dataset, collate = classifier_dataset(input_params, model, train), None
    else:
        dataset, collate = pretraining_dataset(input_params, model, train), collate_pretraining
    return DataLoader(dataset, batch_size=input_params["batch_size"], shuffle=input_params["shuffle"],
                      drop_last=input_params["drop_last"], num_workers=input_params["num_workers"],
                      collate_fn=collate)


def get_train_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=True)


def get_eval_dataloader(params: Mapping) -> DataLoader:
    return _dataloader(params, train=False)
