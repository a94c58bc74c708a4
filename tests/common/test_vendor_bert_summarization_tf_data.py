"""The summarization stand-in as TFRecords for the vendor's TF extractive summarization
(common/data/vendor/summarization.py, ``zoo prepare vendor_bert_summarization --format tfrecords``): read back
as its BertSumTfRecordsProcessor parses them, they are the CSV layout's rows, padded as the vendor's TF writer
pads them (input_mask 1 on [PAD], cls_weights 0 where cls_indices is [PAD]'s id)."""

import ast
import csv

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.data.vendor.summarization import prepare_vendor_bert_summarization  # noqa: E402
from common.errors import UserError  # noqa: E402

MSL, CLS = 48, 6
SMALL = {"max_sequence_length": MSL, "vocab_size": 300, "max_documents": 20, "sentences_per_article": 6,
         "log": lambda *_: None}


def _as_the_vendor_parses(folder):
    spec = {**{k: tf.io.FixedLenFeature([MSL], tf.int64) for k in ("input_ids", "input_mask", "segment_ids")},
            **{k: tf.io.FixedLenFeature([CLS], tf.int64) for k in ("cls_indices", "labels")},
            "cls_weights": tf.io.FixedLenFeature([CLS], tf.float32)}
    files = sorted(str(p) for p in folder.glob("*.tfrecord*"))
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
            for r in tf.data.TFRecordDataset(files)]


def test_the_tfrecords_hold_the_csv_rows_padded_as_the_vendors_tf_writer_pads(tmp_path):
    made_csv = prepare_vendor_bert_summarization(tmp_path / "csv", **SMALL)
    made_tf = prepare_vendor_bert_summarization(tmp_path / "tf", format="tfrecords", max_cls_tokens=CLS, **SMALL)
    assert made_csv == made_tf
    pad = (tmp_path / "tf" / "vocab.txt").read_text(encoding="utf-8").splitlines().index("[PAD]")
    for split in ("train", "valid"):
        rows = []
        for path in sorted((tmp_path / "csv" / split).glob("bertsum-*.csv")):
            with open(path, newline="", encoding="utf-8") as f:
                rows += [{k: ast.literal_eval(v) for k, v in r.items()} for r in csv.DictReader(f)]
        examples = _as_the_vendor_parses(tmp_path / "tf" / split)
        assert len(examples) == len(rows) == made_tf[split] > 0
        for row, e in zip(rows, examples, strict=True):
            n, k = len(row["input_token_ids"]), len(row["cls_ids"])
            assert e["input_ids"].tolist() == row["input_token_ids"] + [pad] * (MSL - n)
            assert (e["input_mask"] == (e["input_ids"] == pad)).all()  # the writer's sense: 1 on [PAD]
            assert e["segment_ids"].tolist() == row["segment_ids"] + [pad] * (MSL - n)
            assert e["cls_indices"].tolist() == row["cls_ids"] + [pad] * (CLS - k)
            assert e["labels"].tolist() == row["labels"] + [pad] * (CLS - k)
            assert (e["cls_weights"] == (e["cls_indices"] != pad)).all()


def test_an_unknown_format_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^--format 'hdf5': choose from csv, tfrecords$"):
        prepare_vendor_bert_summarization(tmp_path / "d", format="hdf5", **SMALL)
    assert not (tmp_path / "d").exists()
