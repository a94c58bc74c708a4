"""datasets/prepare_bert.py end to end: shards in both formats holding the same examples,
restart, the framework readers, and one clear line for each kind of bad input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")
h5py = pytest.importorskip("h5py")

from common.data.text import default_corpus  # noqa: E402
from common.data.text.pretraining import FEATURES, read_hdf5  # noqa: E402
from common.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "datasets" / "prepare_bert.py"
TINY = ["--max_seq_length", "32", "--max_predictions_per_seq", "5", "--dupe_factor", "1", "--vocab_size", "600"]


def prepare_main():
    """datasets/prepare_bert.py's main (the folder is not a package: load it by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_bert", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


main = prepare_main()


def have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """20 documents of the default corpus in BERT's text convention."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join("\n".join(d) for d in default_corpus()[20:40]) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The default corpus, tiny settings, both formats where TensorFlow is installed."""
    out = tmp_path_factory.mktemp("bert")
    formats = "tfrecord,hdf5" if have("tensorflow") else "hdf5"
    assert main(["--output_dir", str(out), "--num_shards", "2", "--formats", formats, *TINY]) == 0
    return out


def test_default_corpus_prepares_train_and_eval_shards(prepared, capsys):
    manifest = json.loads((prepared / "manifest.json").read_text())
    names = ["train-00000-of-00002", "train-00001-of-00002", "eval-00000-of-00001"]
    assert sorted(manifest["shards"]) == sorted(names)
    assert manifest["settings"]["max_seq_length"] == 32
    assert manifest["settings"]["source"].startswith("the default corpus")
    vocab = (prepared / "vocab.txt").read_text().splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and len(vocab) == 600
    total = 0
    for name in names:
        arrays = read_hdf5(prepared / f"{name}.hdf5", 32, 5)
        n = manifest["shards"][name]
        assert n > 20 and all(a.shape[0] == n for a in arrays.values())
        assert (arrays["input_ids"][:, 0] == 2).all() and arrays["input_ids"].max() < len(vocab)
        total += n
    assert total > 300  # 79 documents, dupe_factor 1, up to 29 tokens an example


def test_tfrecord_and_hdf5_hold_the_same_examples(prepared):
    pytest.importorskip("tensorflow")
    from common.data.text.tfrecord import pretraining_dataset

    for hdf5 in sorted(prepared.glob("*.hdf5")):
        expected = read_hdf5(hdf5)
        got = list(pretraining_dataset([hdf5.with_suffix(".tfrecord")]).as_numpy_iterator())
        assert len(got) == expected["input_ids"].shape[0]
        for name in FEATURES:
            assert np.array_equal(np.stack([g[name] for g in got]), expected[name]), (hdf5.name, name)
        assert got[0]["input_ids"].dtype == np.int32 and got[0]["masked_lm_weights"].dtype == np.float32


def test_torch_dataset_over_the_hdf5_shards(prepared):
    torch = pytest.importorskip("torch")
    from common.data.text.torch_dataset import PretrainingHDF5Dataset

    paths = sorted(prepared.glob("train-*.hdf5"))
    ds = PretrainingHDF5Dataset(paths)
    first, second = read_hdf5(paths[0]), read_hdf5(paths[1])
    n0 = first["input_ids"].shape[0]
    assert len(ds) == n0 + second["input_ids"].shape[0]
    item = ds[n0 + 3]
    assert torch.equal(item["input_ids"], torch.from_numpy(second["input_ids"][3]).long())
    assert item["next_sentence_labels"].shape == () and item["masked_lm_weights"].dtype == torch.float32
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert batch["input_ids"].shape == (4, 32) and batch["masked_lm_positions"].shape == (4, 5)
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_restart_skips_complete_shards_and_remakes_the_rest(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    args = ["--output_dir", str(out), "--input", str(text_file), "--num_shards", "3", "--formats", "hdf5", *TINY]
    assert main(args) == 0
    first = {p.name: read_hdf5(p) for p in out.glob("*.hdf5")}
    assert len(first) == 4
    mtime = (out / "train-00002-of-00003.hdf5").stat().st_mtime_ns
    capsys.readouterr()

    (out / "train-00000-of-00003.hdf5").unlink()  # a shard lost
    with h5py.File(out / "train-00001-of-00003.hdf5", "a") as f:  # a shard cut short
        data = f["input_ids"][:5]
        del f["input_ids"]
        f["input_ids"] = data
    assert main(args) == 0
    log = capsys.readouterr().out
    assert "train-00002-of-00003: complete" in log and "eval-00000-of-00001: complete" in log
    assert "train-00000-of-00003: complete" not in log and "train-00001-of-00003: complete" not in log
    assert (out / "train-00002-of-00003.hdf5").stat().st_mtime_ns == mtime  # not rewritten
    for name, arrays in first.items():  # the remade shards hold the very same examples
        again = read_hdf5(out / name)
        assert all(np.array_equal(arrays[k], again[k]) for k in FEATURES), name
    assert not list(out.glob("*.tmp"))

    # other settings in the same folder: refused, naming the setting
    assert main([*args, "--random_seed", "7"]) == 2
    assert "holds examples made with seed = 12345, not 7" in capsys.readouterr().err


def _error_line(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def test_bad_input_one_line_each(tmp_path, capsys, text_file):
    out = ["--output_dir", str(tmp_path / "out"), "--formats", "hdf5"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert f"{empty}: empty corpus file" in _error_line(capsys, [*out, "--input", str(empty)])

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    line = _error_line(capsys, [*out, "--input", str(text_file), "--vocab_file", str(vocab)])
    assert f"{vocab}: vocab lacks the special token(s) [MASK]" in line

    bad_jsonl = tmp_path / "c.jsonl"
    bad_jsonl.write_text('{"text": "Fine here."}\n{"text": 3}\n')
    assert f"{bad_jsonl}:2: expected an object" in _error_line(capsys, [*out, "--input", str(bad_jsonl)])

    assert "max_seq_length 4: must be in 8..512" in _error_line(capsys, [*out, "--max_seq_length", "4"])
    assert "max_seq_length 1024: must be in 8..512" in _error_line(capsys, [*out, "--max_seq_length", "1024"])
    line = _error_line(capsys, [*out, "--input", str(text_file), "--num_shards", "50", "--vocab_size", "300"])
    assert "18 train documents cannot fill 50 shard(s)" in line
    assert "vocab_size 10: must be at least 64" in _error_line(capsys, [*out, "--vocab_size", "10"])
    assert "unknown format 'parquet'" in _error_line(capsys, [*out, "--formats", "parquet"])
    assert not (tmp_path / "out").exists()  # nothing written on bad input


def test_script_runs_as_a_command_without_traceback(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output_dir", str(tmp_path / "o"), "--input", str(empty),
                           "--formats", "hdf5"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {empty}: empty corpus file (no line with text in field 'text')"


def test_wrong_schema_hdf5(tmp_path, prepared):
    good = read_hdf5(prepared / "eval-00000-of-00001.hdf5")
    path = tmp_path / "bad.hdf5"
    with h5py.File(path, "w") as f:
        for name, a in good.items():
            if name != "masked_lm_ids":
                f[name] = a
    with pytest.raises(UserError, match=r"bad\.hdf5: not a BERT pretraining file: field 'masked_lm_ids' is missing"):
        read_hdf5(path)
    with h5py.File(path, "a") as f:
        f["masked_lm_ids"] = good["masked_lm_ids"][:, :3]
    with pytest.raises(UserError, match=r"bad\.hdf5: field 'masked_lm_ids' has shape \(\d+, 3\); expected \(\d+, 5\)"):
        read_hdf5(path)
    path.write_bytes((prepared / "eval-00000-of-00001.hdf5").read_bytes())
    with pytest.raises(UserError, match=r"bad\.hdf5: field 'input_ids' has shape \(\d+, 32\); expected \(\d+, 128\)"):
        read_hdf5(path, max_seq_length=128)
    path.write_bytes(b"not hdf5 at all")
    with pytest.raises(UserError, match=r"bad\.hdf5: not a readable HDF5 file"):
        read_hdf5(path)
    if have("torch"):
        from common.data.text.torch_dataset import PretrainingHDF5Dataset

        with pytest.raises(UserError, match=r"bad\.hdf5: not a readable HDF5 file"):
            PretrainingHDF5Dataset([prepared / "eval-00000-of-00001.hdf5", path])


def test_wrong_schema_tfrecord(tmp_path, prepared):
    tf = pytest.importorskip("tensorflow")
    from common.data.text.tfrecord import pretraining_dataset

    path = tmp_path / "bad.tfrecord"

    def write(feature):
        with tf.io.TFRecordWriter(str(path)) as w:
            w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())

    ints = lambda n: tf.train.Feature(int64_list=tf.train.Int64List(value=[1] * n))  # noqa: E731
    floats = lambda n: tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * n))  # noqa: E731
    good = {"input_ids": ints(32), "input_mask": ints(32), "segment_ids": ints(32), "masked_lm_positions": ints(5),
            "masked_lm_ids": ints(5), "masked_lm_weights": floats(5), "next_sentence_labels": ints(1)}
    write({k: v for k, v in good.items() if k != "segment_ids"})
    with pytest.raises(UserError, match=r"bad\.tfrecord: not a BERT pretraining file: feature 'segment_ids' is missing"):
        pretraining_dataset([path])
    write({**good, "masked_lm_weights": ints(5)})
    with pytest.raises(UserError, match=r"bad\.tfrecord: feature 'masked_lm_weights' is a int64_list; expected a float_list"):
        pretraining_dataset([path])
    write({**good, "input_mask": ints(31)})
    with pytest.raises(UserError, match=r"bad\.tfrecord: feature 'input_mask' has 31 values; expected 32"):
        pretraining_dataset([path])
    write(good)
    assert len(list(pretraining_dataset([path]))) == 1
    with pytest.raises(UserError, match=r"bad\.tfrecord: feature 'input_ids' has 32 values; expected 128"):
        pretraining_dataset([path], max_seq_length=128)
    path.write_bytes(b"\x00" * 40)
    with pytest.raises(UserError, match=r"bad\.tfrecord: not a TFRecord file of tf\.train\.Example"):
        pretraining_dataset([prepared / "eval-00000-of-00001.tfrecord", path])


def test_progress_without_tqdm_prints_plain_lines(monkeypatch, capsys):
    from common.data.text.prepare import _Progress

    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now raises ImportError
    progress = _Progress(total=20, desc="train-00000-of-00001")
    for _ in range(20):
        progress(1)
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "train-00000-of-00001: 2/20 documents" and lines[-1] == "train-00000-of-00001: 20/20 documents"
    assert lines == [f"train-00000-of-00001: {k}/20 documents" for k in range(2, 21, 2)]
