"""BERT pretraining data in the layout the vendor's TF bert folder reads (R1.6): ``zoo prepare vendor_bert
--format tfrecords``.

The vendor's ``BertTfRecordsProcessor`` reads every ``*.tfrecord*`` of a ``data_dir`` (so each
split has a folder of its own) and parses each record as Google BERT's ``run_pretraining``
does (``VENDOR_FEATURES``): fixed-length int64 lists of max_sequence_length (``input_ids``,
``input_mask`` 1 on a real token, ``segment_ids``) and of max_predictions_per_seq
(``masked_lm_positions``, ``masked_lm_ids``), a float list (``masked_lm_weights``) and one
int64 (``next_sentence_labels``). The masking is static, as in Google's files.

Those are the records this zoo's own BERT data already holds (common/data/text/prepare.py:
Google's create_pretraining_data, ported). ``prepare_vendor_bert_tfrecords`` makes them with
``prepare_bert`` in ``output_dir`` itself (vocab.txt, manifest.json, train-*/eval-* shards) and
links each split's shards into the vendor's folders::

    <output_dir>/train/train-0000K-of-0000N.tfrecord    the training shards
    <output_dir>/eval/eval-00000-of-00001.tfrecord      the held-out documents' examples
    <output_dir>/vocab.txt                              the vocab the ids refer to (train_input.vocab_file)
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from common.data.vendor.text import check_output_dir, check_positive
from common.errors import UserError

SPLITS = ("train", "eval")

# name -> (dtype, length): "seq" max_sequence_length, "pred" max_predictions_per_seq; what the vendor's
# tf/bert/input/utils.py parse_raw_tfrecord asks of a record (Google's run_pretraining feature map)
VENDOR_FEATURES = {
    "input_ids": ("int64", "seq"),
    "input_mask": ("int64", "seq"),
    "segment_ids": ("int64", "seq"),
    "masked_lm_positions": ("int64", "pred"),
    "masked_lm_ids": ("int64", "pred"),
    "masked_lm_weights": ("float32", "pred"),
    "next_sentence_labels": ("int64", 1),
}


def _link(src: Path, dst: Path) -> None:
    """``dst`` the same file as ``src`` (a hard link; a copy where the file system has none)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def prepare_vendor_bert_tfrecords(output_dir, max_seq_length: int = 128, max_predictions_per_seq: int = 20,
                                  vocab_size: int = 8192, num_files: int = 8, dupe_factor: int = 2,
                                  short_seq_prob: float = 0.1, eval_fraction: float = 0.1, seed: int = 12345,
                                  input_files=(), log=print) -> dict:
    """The zoo's BERT pretraining TFRecords in ``output_dir`` and its train/ and eval/ folders (the module
    docstring), from ``input_files`` (prepare_bert's --input; none: the default corpus); returns
    {"vocab_size", "train", "eval"} (the splits' example counts)."""
    from common.data.text.prepare import prepare_bert
    from common.data.text.pretraining import MaskingConfig

    check_positive(num_files=num_files, dupe_factor=dupe_factor)
    if not 0.0 < eval_fraction < 1.0:
        raise UserError(f"--eval_fraction {eval_fraction}: must be in (0, 1)")
    masking = MaskingConfig(max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq,
                            short_seq_prob=short_seq_prob, dupe_factor=dupe_factor).validate()
    out = check_output_dir(output_dir)
    shards = prepare_bert(out, inputs=input_files, vocab_size=vocab_size, masking=masking, seed=seed, num_shards=num_files,
                          eval_percent=eval_fraction * 100, formats=("tfrecord",), log=log)
    counts = dict.fromkeys(SPLITS, 0)
    for split in SPLITS:
        (out / split).mkdir()
    for shard in shards:
        split = shard.name.split("-", 1)[0]
        for path in shard.files:
            _link(path, out / split / path.name)
        counts[split] += shard.examples
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    log(f"train: {counts['train']:,} and eval: {counts['eval']:,} examples in the layout of the vendor's TF bert "
        f"-> {out / 'train'}, {out / 'eval'}")
    return {"vocab_size": len(vocab), **counts}
