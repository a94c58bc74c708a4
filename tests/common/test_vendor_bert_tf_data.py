"""BERT pretraining TFRecords for the vendor's TF bert (common/data/vendor/bert_tf.py, ``zoo prepare vendor_bert
--format tfrecords``): each split's folder read back as the vendor's BertTfRecordsProcessor reads it (every
*.tfrecord* of a data_dir, parsed with Google's fixed-length feature map) and checked example by example."""

import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.data.vendor.bert_tf import prepare_vendor_bert_tfrecords  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEQ, PRED = 64, 10


def _as_the_vendor_parses(folder):
    """Every record of folder/*.tfrecord*, parsed by the feature map of the vendor's tf/bert/input/utils.py."""
    spec = {
        "input_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([PRED], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([PRED], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([PRED], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    files = sorted(str(p) for p in folder.glob("*.tfrecord*"))
    return files, [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
                   for r in tf.data.TFRecordDataset(files)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vendor_bert_tf")
    corpus = folder / "corpus.txt"  # 12 documents of 8 sentences (a blank line between documents)
    rng = np.random.default_rng(0)
    corpus.write_text("\n\n".join("\n".join(" ".join(f"w{w}" for w in rng.integers(0, 60, rng.integers(4, 12)))
                                            for _ in range(8)) for _ in range(12)) + "\n")
    out, lines = folder / "data", []
    made = prepare_vendor_bert_tfrecords(out, max_seq_length=SEQ, max_predictions_per_seq=PRED, vocab_size=200,
                                         num_files=2, dupe_factor=3, input_files=[str(corpus)], log=lines.append)
    return out, made, lines


def test_each_split_is_a_folder_of_records_the_vendors_reader_parses(prepared):
    out, made, _ = prepared
    vocab = (out / "vocab.txt").read_text(encoding="utf-8").splitlines()
    cls, sep, mask = vocab.index("[CLS]"), vocab.index("[SEP]"), vocab.index("[MASK]")
    labels = set()
    for split, shards in (("train", 2), ("eval", 1)):
        files, examples = _as_the_vendor_parses(out / split)
        assert [os.path.basename(f).split("-")[0] for f in files] == [split] * shards  # a split's own shards only
        assert len(examples) == made[split] > 0
        for e in examples:
            n = int(e["input_mask"].sum())
            assert (e["input_mask"] == (np.arange(SEQ) < n)).all()  # 1 on the real tokens, then 0 (Google's)
            ids, segments = e["input_ids"], e["segment_ids"]
            assert ids[0] == cls and ids[n - 1] == sep and (ids[n:] == 0).all()
            k = int(e["masked_lm_weights"].sum())
            positions = e["masked_lm_positions"][:k]
            seps = np.setdiff1d(np.flatnonzero(ids[:n] == sep), positions)  # a masked one may be a random [SEP]
            assert len(seps) == 2  # [CLS] A [SEP] B [SEP]
            assert (segments[:seps[0] + 1] == 0).all() and (segments[seps[0] + 1:n] == 1).all()
            assert (segments[n:] == 0).all()
            assert k >= 1 and (e["masked_lm_weights"] == (np.arange(PRED) < k)).all()
            assert (np.diff(positions) > 0).all() and positions[0] >= 1 and positions[-1] < n - 1
            assert not np.isin(positions, seps).any()
            assert (0 <= e["masked_lm_ids"][:k]).all() and (e["masked_lm_ids"][:k] < len(vocab)).all()
            assert (e["masked_lm_ids"][k:] == 0).all() and (e["masked_lm_positions"][k:] == 0).all()
            assert not np.isin(e["masked_lm_ids"][:k], [cls, sep]).any()
            labels.add(int(e["next_sentence_labels"][0]))
        # most masked positions hold [MASK] (80 % of them, Google's rule); the label is the token that was there
        masked = np.concatenate([e["input_ids"][e["masked_lm_positions"][:int(e["masked_lm_weights"].sum())]]
                                 for e in examples])
        assert 0.6 < (masked == mask).mean() < 0.95
    assert labels == {0, 1}  # is next and random next, both
    assert made["vocab_size"] == len(vocab)


def test_the_command_prints_the_params_and_refuses_bad_input_in_one_line(tmp_path):
    script = os.path.join(ROOT, "datasets", "prepare_vendor_bert.py")
    env = {**os.environ, "PYTHONPATH": ROOT}
    result = subprocess.run([sys.executable, script, "--format", "tfrecords", "--output_dir", str(tmp_path / "d"),
                             "--num_files", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2 and result.stderr == "error: --num_files 0: must be at least 1\n"
    assert not (tmp_path / "d").exists()  # refused before any work
    result = subprocess.run([sys.executable, script, "--format", "tfrecords", "--output_dir", str(tmp_path / "d"),
                             "--max_documents", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 2
    assert result.stderr == ("error: --max_documents: --format tfrecords takes the whole corpus and writes one "
                             "eval file\n")
