"""GPT-2 language-model data: packing, prepare_lm (both formats, restart, bad input), readers, meta checks."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from common.data.text.lm import check_lm_meta, pack_documents
from common.errors import UserError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "datasets" / "prepare_gpt2.py"


def prepare_main():
    """datasets/prepare_gpt2.py's main (the folder is not a package: load it by path)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prepare_gpt2", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def _error_line(capsys, argv) -> str:
    assert prepare_main()(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()  # a progress bar may come before
    errors = [line for line in err if line.startswith("error: ")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    return errors[0]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """20 documents of the default corpus in the text convention (a blank line between documents)."""
    from common.data.text import default_corpus

    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join("\n".join(d) for d in default_corpus()[20:40]) + "\n")
    return path


# --- packing ----------------------------------------------------------------------------------

def test_pack_documents_windows_stride_and_padding():
    out = pack_documents([[5, 6, 7], [8, 9]], max_seq_length=4, eot_id=1)
    # stream 5 6 7 1 8 9 1: windows of 5 tokens at stride 4, the last padded with eot (1)
    np.testing.assert_array_equal(out["input_ids"], [[5, 6, 7, 1], [8, 9, 1, 1]])
    np.testing.assert_array_equal(out["labels"], [[6, 7, 1, 8], [9, 1, 0, 0]])
    np.testing.assert_array_equal(out["attention_mask"], [[1, 1, 1, 1], [1, 1, 0, 0]])
    assert all(a.dtype == np.int32 for a in out.values())


def test_pack_documents_every_token_but_the_first_is_one_label():
    rng = np.random.default_rng(0)
    docs = [rng.integers(2, 50, size=n).tolist() for n in (7, 1, 12, 3)]
    stream = [t for d in docs for t in (*d, 0)]  # 27 tokens: 26 labels, 13 windows of 2 tokens exactly
    for msl, windows in ((2, 13), (5, 6), (26, 1), (64, 1)):
        out = pack_documents(docs, msl, eot_id=0)
        assert out["input_ids"].shape == (windows, msl)
        mask = out["attention_mask"].astype(bool)
        assert out["labels"][mask].tolist() == stream[1:]
        assert out["input_ids"].reshape(-1)[:len(stream) - 1].tolist() == stream[:-1]
        assert (out["labels"][~mask] == 0).all() and (out["input_ids"].reshape(-1)[len(stream) - 1:] == 0).all()
    assert pack_documents([], 8, eot_id=0)["input_ids"].shape == (0, 8)
    with pytest.raises(UserError, match="max_seq_length 0: must be at least 1"):
        pack_documents(docs, 0, eot_id=0)


# --- prepare_lm -------------------------------------------------------------------------------

def test_default_corpus_vocab_and_meta(tmp_path):
    """The default corpus at the default vocab size: the vocab_size the gpt2 params_tiny configs use."""
    pytest.importorskip("tokenizers")
    pytest.importorskip("h5py")
    from common.data.text.lm import DEFAULT_VOCAB_SIZE, prepare_lm, read_lm_hdf5

    results = prepare_lm(tmp_path, max_seq_length=128, formats=("hdf5",), log=lambda line: None)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["vocab_size"] == DEFAULT_VOCAB_SIZE == 4096
    assert meta["eot_id"] == 0 and meta["max_seq_length"] == 128
    assert [r.name for r in results] == ["train-00000", "eval-00000"]
    assert meta["counts"] == {"train": results[0].examples, "eval": results[1].examples}
    train = read_lm_hdf5(tmp_path / "train-00000.h5", 128)
    assert train["input_ids"].shape == (meta["counts"]["train"], 128)
    assert int(train["input_ids"].max()) < 4096
    assert check_lm_meta(tmp_path, 4096, 128)["counts"] == meta["counts"]


def test_examples_hold_the_corpus_tokenized_by_the_written_vocab(tmp_path, text_file):
    pytest.importorskip("h5py")
    from common.data.text import read_corpus
    from common.data.text.lm import prepare_lm, read_lm_hdf5
    from common.data.text.tokenizer import read_gpt2

    prepare_lm(tmp_path, max_seq_length=32, vocab_size=600, input_files=[text_file], formats=("hdf5",),
               eval_fraction=0.0, log=lambda line: None)
    tokenizer = read_gpt2(tmp_path / "encoder.json", tmp_path / "vocab.bpe")
    eot = tokenizer.token_to_id("<|endoftext|>")
    expected = Counter()
    for d in read_corpus([text_file]):
        expected.update(tokenizer.encode(" ".join(d)).ids + [eot])
    train = read_lm_hdf5(tmp_path / "train-00000.h5", 32)
    labels = Counter(train["labels"][train["attention_mask"] == 1].tolist())
    missing = expected - labels  # the stream's first token is the one token never a label
    assert sum(missing.values()) == 1 and not labels - expected
    assert not (tmp_path / "eval-00000.h5").exists()


def test_tokenizer_json_beside_the_data_encodes_as_the_gpt2_files(tmp_path, text_file):
    """--tokenizer_json (the llama folders' data): one tokenizer.json that the tokenizers library
    and transformers' fast tokenizer load, giving the ids of encoder.json + vocab.bpe."""
    pytest.importorskip("h5py")
    from tokenizers import Tokenizer

    from common.data.text import read_corpus
    from common.data.text.lm import read_lm_hdf5
    from common.data.text.tokenizer import read_gpt2

    plain, with_json = tmp_path / "plain", tmp_path / "json"
    argv = ["--max_seq_length", "32", "--vocab_size", "600", "--input_files", str(text_file), "--format", "hdf5"]
    assert prepare_main()(["--output_dir", str(plain), *argv]) == 0
    assert prepare_main()(["--output_dir", str(with_json), *argv, "--tokenizer_json"]) == 0
    assert not (plain / "tokenizer.json").exists()
    gpt2 = read_gpt2(with_json / "encoder.json", with_json / "vocab.bpe")
    loaded = Tokenizer.from_file(str(with_json / "tokenizer.json"))
    text = " ".join(read_corpus([text_file])[0]) + "<|endoftext|>"
    ids = gpt2.encode(text).ids
    assert loaded.encode(text).ids == ids and len(ids) > 20
    assert loaded.get_vocab_size() == gpt2.get_vocab_size() == 600
    assert loaded.decode(ids[:-1]) == text[:-len("<|endoftext|>")]
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(with_json / "tokenizer.json"))
    assert fast(text)["input_ids"] == ids
    # the same examples either way: the flag is not one of the settings meta.json records
    a, b = read_lm_hdf5(plain / "train-00000.h5"), read_lm_hdf5(with_json / "train-00000.h5")
    assert all(np.array_equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def test_both_formats_and_readers_hold_the_same_examples(tmp_path, text_file):
    pytest.importorskip("h5py")
    pytest.importorskip("tensorflow")
    from common.data.text.lm import lm_dataset, prepare_lm, read_lm_hdf5

    prepare_lm(tmp_path, max_seq_length=16, vocab_size=500, input_files=[text_file], num_shards=2,
               log=lambda line: None)
    for name in ("train-00000", "train-00001", "eval-00000"):
        h5 = read_lm_hdf5(tmp_path / f"{name}.h5")
        records = list(lm_dataset([tmp_path / f"{name}.tfrecord"], 16).as_numpy_iterator())
        assert len(records) == h5["input_ids"].shape[0] > 0
        for field, array in h5.items():
            stacked = np.stack([r[field] for r in records])
            assert stacked.dtype == np.int32
            np.testing.assert_array_equal(stacked, array)


def test_torch_dataset_over_the_shards(tmp_path, text_file):
    torch = pytest.importorskip("torch")
    pytest.importorskip("h5py")
    from common.data.text.lm import LMHDF5Dataset, prepare_lm, read_lm_hdf5

    prepare_lm(tmp_path, max_seq_length=16, vocab_size=500, input_files=[text_file], num_shards=2,
               formats=("hdf5",), log=lambda line: None)
    paths = [tmp_path / "train-00000.h5", tmp_path / "train-00001.h5"]
    dataset = LMHDF5Dataset(paths, max_seq_length=16)
    first, second = (read_lm_hdf5(p) for p in paths)
    assert len(dataset) == len(first["input_ids"]) + len(second["input_ids"])
    last = dataset[len(dataset) - 1]
    assert last["input_ids"].dtype == torch.int64 and last["labels"].shape == (16,)
    np.testing.assert_array_equal(last["labels"].numpy(), second["labels"][-1])
    batch = next(iter(torch.utils.data.DataLoader(dataset, batch_size=4)))
    assert batch["attention_mask"].shape == (4, 16)
    with pytest.raises(IndexError):
        dataset[len(dataset)]


def test_restart_skips_complete_files_and_remakes_the_rest(tmp_path, text_file):
    pytest.importorskip("h5py")
    from common.data.text.lm import prepare_lm, read_lm_hdf5

    kwargs = dict(max_seq_length=16, vocab_size=500, input_files=[text_file], num_shards=3, formats=("hdf5",))
    first = prepare_lm(tmp_path, log=lambda line: None, **kwargs)
    before = {p.name: read_lm_hdf5(p) for p in tmp_path.glob("*.h5")}
    mtimes = {p.name: p.stat().st_mtime_ns for p in tmp_path.glob("*.h5")}
    (tmp_path / "train-00001.h5").write_bytes(b"half a file")  # a shard cut short
    (tmp_path / "eval-00000.h5").unlink()
    (tmp_path / "train-00002.h5.tmp").write_bytes(b"left by a killed run")
    lines = []
    again = prepare_lm(tmp_path, log=lines.append, **kwargs)
    assert [r.skipped for r in again] == [True, False, True, False]
    assert [r.examples for r in again] == [r.examples for r in first]
    assert "train-00000: complete" in "\n".join(lines)
    assert (tmp_path / "train-00000.h5").stat().st_mtime_ns == mtimes["train-00000.h5"]
    for name, arrays in before.items():
        for field, array in read_lm_hdf5(tmp_path / name).items():
            np.testing.assert_array_equal(array, arrays[field])  # the same examples, remade
    with pytest.raises(UserError, match="holds examples made with max_seq_length = 16, not 32"):
        prepare_lm(tmp_path, log=lambda line: None, **{**kwargs, "max_seq_length": 32})


def test_bad_input_one_line_each(tmp_path, capsys, text_file):
    pytest.importorskip("tokenizers")
    out = ["--output_dir", str(tmp_path / "out"), "--format", "hdf5"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    line = _error_line(capsys, [*out, "--input_files", str(empty)])
    assert line == f"error: {empty}: empty corpus file (no sentence in it)"
    assert "vocab_size 100: must be at least 257" in _error_line(capsys, [*out, "--vocab_size", "100"])
    assert "max_seq_length 0: must be at least 1" in _error_line(capsys, [*out, "--max_seq_length", "0"])
    line = _error_line(capsys, [*out, "--input_files", str(text_file), "--max_seq_length", "100000",
                                "--num_shards", "3"])
    assert "training example(s) cannot fill 3 shard(s)" in line
    assert "eval_fraction 1.0: must be in [0, 1)" in _error_line(capsys, [*out, "--eval_fraction", "1"])
    assert not (tmp_path / "out").exists()  # nothing written on bad input


def test_script_runs_as_a_command_without_traceback(tmp_path):
    missing = tmp_path / "nothing.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output_dir", str(tmp_path / "o"), "--input_files",
                           str(missing), "--format", "hdf5"], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"error: {missing}: no such corpus file"


# --- bad files and meta -----------------------------------------------------------------------

def test_wrong_hdf5_files_one_line(tmp_path):
    h5py = pytest.importorskip("h5py")
    from common.data.text.lm import read_lm_hdf5

    not_hdf5 = tmp_path / "x.h5"
    not_hdf5.write_text("text")
    with pytest.raises(UserError, match=r"x.h5: not a readable HDF5 file"):
        read_lm_hdf5(not_hdf5)
    ok = {"input_ids": np.zeros((3, 8), np.int32), "attention_mask": np.ones((3, 8), np.int32),
          "labels": np.zeros((3, 8), np.int32)}
    cases = {
        "no_labels": ({k: v for k, v in ok.items() if k != "labels"}, "field 'labels' is missing"),
        "floats": ({**ok, "labels": np.zeros((3, 8), np.float32)}, "field 'labels' is float32 of shape"),
        "short": ({**ok, "labels": np.zeros((3, 7), np.int32)},
                  "field 'labels' holds 7 tokens per example; expected max_seq_length 8"),
        "fewer": ({**ok, "labels": np.zeros((2, 8), np.int32)}, "field 'labels' has 2 examples; expected 3"),
        "mask": ({**ok, "attention_mask": np.full((3, 8), 2, np.int32)}, "values other than 0 and 1"),
    }
    for name, (arrays, message) in cases.items():
        path = tmp_path / f"{name}.h5"
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f.create_dataset(k, data=v)
        with pytest.raises(UserError, match=f"{name}.h5: .*{message}"):
            read_lm_hdf5(path)
    path = tmp_path / "ok.h5"
    with h5py.File(path, "w") as f:
        for k, v in ok.items():
            f.create_dataset(k, data=v)
    with pytest.raises(UserError, match="ok.h5: field 'input_ids' holds 8 tokens per example; expected max_seq_length 16"):
        read_lm_hdf5(path, 16)


def test_wrong_tfrecord_files_one_line(tmp_path):
    tf = pytest.importorskip("tensorflow")
    from common.data.text.lm import lm_dataset, write_lm_tfrecord

    garbage = tmp_path / "garbage.tfrecord"
    garbage.write_bytes(b"\x00" * 40)
    with pytest.raises(UserError, match="garbage.tfrecord: not a TFRecord file"):
        lm_dataset([garbage])
    empty = tmp_path / "empty.tfrecord"
    with tf.io.TFRecordWriter(str(empty)):
        pass
    with pytest.raises(UserError, match="empty.tfrecord: empty TFRecord file"):
        lm_dataset([empty])
    ok = {n: np.zeros((2, 8), np.int32) for n in ("input_ids", "attention_mask", "labels")}
    path = tmp_path / "ok.tfrecord"
    write_lm_tfrecord(ok, path)
    with pytest.raises(UserError, match="ok.tfrecord: feature 'input_ids' has 8 values; expected max_seq_length 16"):
        lm_dataset([path], 16)
    bert = tmp_path / "bert.tfrecord"
    with tf.io.TFRecordWriter(str(bert)) as w:  # an example without labels
        feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=[1, 2]))}
        w.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    with pytest.raises(UserError, match="bert.tfrecord: not a language-model data file: feature 'attention_mask'"):
        lm_dataset([bert])


def test_check_lm_meta_names_the_mismatch(tmp_path):
    with pytest.raises(UserError, match="meta.json: no such file; prepare the folder with datasets/prepare_gpt2.py"):
        check_lm_meta(tmp_path, 4096, 128)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(UserError, match="meta.json: unreadable"):
        check_lm_meta(tmp_path, 4096, 128)
    (tmp_path / "meta.json").write_text(json.dumps({"vocab_size": 4096, "max_seq_length": 128, "eot_id": 0}))
    assert check_lm_meta(tmp_path, 4096, 128)["eot_id"] == 0
    with pytest.raises(UserError, match="the data's vocab has 4,096 tokens, but model.vocab_size is 50,257"):
        check_lm_meta(tmp_path, 50257, 128)
    with pytest.raises(UserError, match="the data's examples have 128 tokens, but max_sequence_length is 1024"):
        check_lm_meta(tmp_path, 4096, 1024)
