"""The NER stand-in as TFRecords for the vendor's TF token classifier (common/data/vendor/ner.py, ``zoo prepare
vendor_bert_ner --format tfrecords``): read back as its NerDataProcessor parses them, they are the CSV
layout's rows, ids looked up in vocab.txt and label2id.json, padded as the vendor's writer pads."""

import csv
import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.data.vendor.ner import prepare_vendor_bert_ner  # noqa: E402
from common.errors import UserError  # noqa: E402

MSL = 24
SMALL = {"max_sequence_length": MSL, "vocab_size": 300, "max_documents": 20, "num_files": 2, "log": lambda *_: None}


def _as_the_vendor_parses(folder):
    spec = {k: tf.io.FixedLenFeature([MSL], tf.int64) for k in ("input_ids", "input_mask", "segment_ids", "label_ids")}
    files = sorted(str(p) for p in folder.glob("*.tfrecord*"))
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
            for r in tf.data.TFRecordDataset(files)]


def test_the_tfrecords_hold_the_csv_rows_as_ids_padded_as_the_vendor_pads(tmp_path):
    made_csv = prepare_vendor_bert_ner(tmp_path / "csv", **SMALL)
    made_tf = prepare_vendor_bert_ner(tmp_path / "tf", format="tfrecords", **SMALL)
    assert made_csv == made_tf
    vocab = {t: i for i, t in enumerate((tmp_path / "tf" / "vocab.txt").read_text(encoding="utf-8").splitlines())}
    label2id = json.loads((tmp_path / "tf" / "train" / "label2id.json").read_text())
    for split in ("train", "dev"):
        assert not list((tmp_path / "tf" / split).glob("*.csv"))
        rows = []
        for path in sorted((tmp_path / "csv" / split).glob("ner-*.csv")):
            with open(path, newline="", encoding="utf-8") as f:
                rows += list(csv.DictReader(f))
        examples = _as_the_vendor_parses(tmp_path / "tf" / split)
        assert len(examples) == len(rows) == made_tf[split]
        for row, e in zip(rows, examples, strict=True):
            pieces, labels = row["tokens"].split(" "), row["labels"].split(" ")
            n = len(pieces)
            assert (e["input_mask"] == (np.arange(MSL) < n)).all()  # 1 on a piece (the reader inverts it)
            assert e["input_ids"].tolist() == [vocab[p] for p in pieces] + [vocab["[PAD]"]] * (MSL - n)
            assert e["label_ids"].tolist() == [label2id[x] for x in labels] + [label2id["[PAD]"]] * (MSL - n)
            assert (e["segment_ids"] == 0).all()


def test_an_unknown_format_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"^--format 'hdf5': choose from csv, tfrecords$"):
        prepare_vendor_bert_ner(tmp_path / "d", format="hdf5", **SMALL)
    assert not (tmp_path / "d").exists()
