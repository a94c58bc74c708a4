"""GPT-2 data in the vendor's HDF5 layout (common/data/vendor/gpt2.py, datasets/prepare_vendor_gpt2.py):
the files are read back here with h5py as the vendor's GPT-2 reader reads them (every *.h5 of a folder,
sorted; ``n_examples``; ``example_{i}`` of shape (3, max_seq_length)), and equal the zoo's own examples."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from common.data.text.lm import read_lm_hdf5
from common.data.vendor.gpt2 import (
    prepare_vendor_lm, read_vendor_lm_hdf5, read_vendor_lm_tfrecord, vendor_lm_examples, write_vendor_lm_hdf5,
    write_vendor_lm_split,
)
from common.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _arrays(n, length, seed=0):
    rng = np.random.default_rng(seed)
    mask = (rng.random((n, length)) < 0.8).astype(np.int32)
    return {"input_ids": rng.integers(0, 500, (n, length), dtype=np.int32),
            "attention_mask": mask,
            "labels": rng.integers(0, 500, (n, length), dtype=np.int32) * mask}


def _as_the_vendor_reads(folder):
    """(file name, example index, (3, T) array) in the vendor reader's order, read with h5py alone."""
    out = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".h5")):
        with h5py.File(os.path.join(folder, name), "r") as f:
            for i in range(f.attrs["n_examples"]):
                out.append((name, i, np.array(f[f"example_{i}"])))
    return out


def test_a_file_round_trips_in_the_vendors_shape(tmp_path):
    arrays = _arrays(5, 16)
    path = tmp_path / "gpt2-1.h5"
    write_vendor_lm_hdf5(arrays, path)
    read = _as_the_vendor_reads(tmp_path)
    assert [(name, i) for name, i, _ in read] == [("gpt2-1.h5", i) for i in range(5)]
    for _, i, example in read:
        assert example.shape == (3, 16) and example.dtype == np.int32
        assert (example[0] == arrays["input_ids"][i]).all() and (example[1] == arrays["attention_mask"][i]).all()
        assert (example[2] == arrays["labels"][i]).all()
    back = read_vendor_lm_hdf5(path)
    assert all((back[k] == arrays[k]).all() for k in arrays)
    assert os.listdir(tmp_path) == ["gpt2-1.h5"]  # no temporary file left


def test_a_split_is_dealt_round_robin_and_stale_files_go(tmp_path):
    arrays = _arrays(7, 8)
    write_vendor_lm_split(arrays, tmp_path, num_files=4)
    write_vendor_lm_split(arrays, tmp_path, num_files=3)  # a rerun with fewer files
    assert sorted(os.listdir(tmp_path)) == ["gpt2-1.h5", "gpt2-2.h5", "gpt2-3.h5"]
    # example k in file k % 3 as example_{k // 3}, as the vendor's script deals them
    for name, i, example in _as_the_vendor_reads(tmp_path):
        k = 3 * i + int(name[5]) - 1
        assert (example[0] == arrays["input_ids"][k]).all()
    order = [e["input_ids"] for e in vendor_lm_examples(tmp_path)]
    assert [int(np.flatnonzero((arrays["input_ids"] == ids).all(1))[0]) for ids in order] == [0, 3, 6, 1, 4, 2, 5]
    with pytest.raises(UserError, match=r"7 example\(s\) cannot fill 8 files"):
        write_vendor_lm_split(arrays, tmp_path, num_files=8)


def test_prepare_writes_the_zoos_examples_in_both_layouts(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(" ".join(f"word{(d * 7 + w) % 50} and more text" for w in range(30))
                                for d in range(12)) + "\n")
    lines = []
    written = prepare_vendor_lm(tmp_path / "data", max_seq_length=32, vocab_size=300, input_files=[str(text)],
                                num_files=2, log=lines.append)
    assert [p.name for p in written["train"]] == ["gpt2-1.h5", "gpt2-2.h5"] and len(written["eval"]) == 1
    for split in ("train", "eval"):
        zoo = read_lm_hdf5(tmp_path / "data" / f"{split}-00000.h5")
        vendor = list(vendor_lm_examples(tmp_path / "data" / split))
        assert len(vendor) == zoo["input_ids"].shape[0] > 0
        as_rows = sorted(tuple(np.concatenate([e["input_ids"], e["attention_mask"], e["labels"]])) for e in vendor)
        zoo_rows = sorted(tuple(np.concatenate(r)) for r in zip(zoo["input_ids"], zoo["attention_mask"], zoo["labels"]))
        assert as_rows == zoo_rows
    assert f"train_input.data_dir={tmp_path / 'data' / 'train'}" in lines[-1] and "model.vocab_size=" in lines[-1]


def test_a_file_not_in_the_layout_is_one_line(tmp_path):
    path = tmp_path / "bad.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("example_0", data=np.zeros((3, 4), np.int32))
    with pytest.raises(UserError, match=r"bad\.h5: not a file of the vendor's GPT-2 layout: no attribute 'n_examples'"):
        read_vendor_lm_hdf5(path)
    with h5py.File(path, "a") as f:
        f.attrs["n_examples"] = 2
    with pytest.raises(UserError, match=r"bad\.h5: n_examples is 2, but there is no dataset 'example_1'"):
        read_vendor_lm_hdf5(path)
    with h5py.File(path, "a") as f:
        f.create_dataset("example_1", data=np.zeros((2, 4), np.int32))
    with pytest.raises(UserError, match=r"example_1 is int32 of shape \(2, 4\); expected integers of shape \(3, "):
        read_vendor_lm_hdf5(path)
    path.write_bytes(b"not hdf5")
    with pytest.raises(UserError, match=r"bad\.h5: not a readable HDF5 file"):
        read_vendor_lm_hdf5(path)
    with pytest.raises(UserError, match=r"empty: no \*\.h5 files"):
        (tmp_path / "empty").mkdir()
        list(vendor_lm_examples(tmp_path / "empty"))


def test_the_command_refuses_bad_input_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(ROOT, "datasets", "prepare_vendor_gpt2.py"),
                             "--output_dir", str(tmp_path / "d"), "--num_files", "0"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert result.returncode == 2 and result.stderr == "error: num_files 0: must be at least 1\n"
    assert not (tmp_path / "d").exists()  # refused before any work


# --- the TF folders' TFRecords (gpt2, gpt3, gptj) -----------------------------------------------------


def _as_the_vendors_tf_reader_parses(folder, max_seq_length):
    """Every example of folder/*.tfrecord*, parsed as the vendor's GPT TF reader parses them
    (FixedLenFeature int64 of max_seq_length: input_ids, input_mask, labels), files in name order."""
    tf = pytest.importorskip("tensorflow")
    spec = {key: tf.io.FixedLenFeature([max_seq_length], tf.int64) for key in ("input_ids", "input_mask", "labels")}
    files = sorted(str(p) for p in folder.glob("*.tfrecord*"))
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()}
            for r in tf.data.TFRecordDataset(files)]


def test_tfrecords_are_what_the_vendors_tf_reader_parses(tmp_path):
    pytest.importorskip("tensorflow")
    arrays = _arrays(7, 16)
    paths = write_vendor_lm_split(arrays, tmp_path, num_files=2, format="tfrecords")
    assert [p.name for p in paths] == ["gpt2-1.tfrecords", "gpt2-2.tfrecords"]
    assert sorted(os.listdir(tmp_path)) == ["gpt2-1.tfrecords", "gpt2-2.tfrecords"]  # no partial file left
    parsed = _as_the_vendors_tf_reader_parses(tmp_path, 16)
    order = [0, 2, 4, 6, 1, 3, 5]  # dealt round-robin, read file by file
    for example, k in zip(parsed, order, strict=True):
        assert (example["input_ids"] == arrays["input_ids"][k]).all()
        assert (example["input_mask"] == arrays["attention_mask"][k]).all()  # 1 on real tokens
        assert (example["labels"] == arrays["labels"][k]).all()
    back = [e["input_ids"] for e in vendor_lm_examples(tmp_path, format="tfrecords")]
    assert [int(np.flatnonzero((arrays["input_ids"] == ids).all(1))[0]) for ids in back] == order


def test_prepare_writes_tfrecords_for_the_tf_folders(tmp_path):
    pytest.importorskip("tensorflow")
    text = tmp_path / "corpus.txt"
    text.write_text("\n\n".join(" ".join(f"word{(d * 5 + w) % 40} more" for w in range(30)) for d in range(10)) + "\n")
    lines = []
    written = prepare_vendor_lm(tmp_path / "data", max_seq_length=32, vocab_size=300, input_files=[str(text)],
                                format="tfrecords", log=lines.append)
    assert [p.name for p in written["train"]] == ["gpt2-1.tfrecords"]
    zoo = read_lm_hdf5(tmp_path / "data" / "train-00000.h5")
    parsed = _as_the_vendors_tf_reader_parses(tmp_path / "data" / "train", 32)
    assert sorted(tuple(e["input_ids"]) for e in parsed) == sorted(map(tuple, zoo["input_ids"]))
    assert "train_input.vocab_size=" in lines[-1] and "(in the params file)" in lines[-1]


def test_a_tfrecords_file_not_in_the_layout_is_one_line(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = tmp_path / "bad.tfrecords"
    with tf.io.TFRecordWriter(str(path)) as writer:
        feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))}
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with pytest.raises(UserError, match=r"bad\.tfrecords: example 0 has no int64 feature 'input_mask'"):
        read_vendor_lm_tfrecord(path)
    path.write_bytes(b"not a record file at all")
    with pytest.raises(UserError, match=r"bad\.tfrecords: not a readable TFRecords file"):
        read_vendor_lm_tfrecord(path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"no \*\.tfrecord\* files \(make them with: .* --format tfrecords\)"):
        list(vendor_lm_examples(tmp_path / "empty", format="tfrecords"))
