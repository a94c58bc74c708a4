"""common/data/text/seq2seq.py: parallel text, the reversal task, T5 span corruption, arrays."""

import json

import numpy as np
import pytest

from common.data.text.corpus import default_corpus
from common.data.text.seq2seq import (FIELDS, encode_pairs, fitting_pairs, random_spans_noise_mask,
                                      read_parallel, reversal_pairs, span_corrupt, span_corruption_lengths)
from common.errors import UserError


# --- parallel text -----------------------------------------------------------------------------

def test_read_parallel_pairs_lines_and_drops_blank_sides(tmp_path):
    (tmp_path / "train.en").write_text("A cat.\n\nThe  house\r\nOnly English.\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("Eine Katze.\nLeer.\nDas Haus\n\n", encoding="utf-8")
    pairs, dropped = read_parallel(tmp_path / "train.en", tmp_path / "train.de")
    assert pairs == [("A cat.", "Eine Katze."), ("The house", "Das Haus")]
    assert dropped == 2


def test_read_parallel_files_of_different_lengths_is_one_line(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(UserError, match=r"a.en has 2 lines but .*a.de has 1"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_read_parallel_names_the_line_that_is_not_utf8(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzw\xffei\n")
    with pytest.raises(UserError, match=r"a.de:2: not UTF-8"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")
    with pytest.raises(UserError, match=r"missing.de: no such file"):
        read_parallel(tmp_path / "a.en", tmp_path / "missing.de")


# --- the reversal task -------------------------------------------------------------------------

def test_reversal_pairs_of_the_default_corpus_have_one_right_answer():
    pairs = reversal_pairs(default_corpus())
    assert len(pairs) > 1000  # enough for a real train / eval split
    sources = [s for s, _ in pairs]
    assert len(set(sources)) == len(sources)
    for source, target in pairs[:200]:
        assert target.split() == source.split()[::-1]
        assert 3 <= len(source.split()) <= 24
    assert reversal_pairs([["Names refer to objects."]]) == [("Names refer to objects.", "objects. to refer Names")]
    with pytest.raises(UserError, match="min_words"):
        reversal_pairs([["a b"]], min_words=5, max_words=2)


# --- span corruption ---------------------------------------------------------------------------

@pytest.mark.parametrize("length", [2, 3, 10, 57, 568])
def test_noise_mask_has_t5s_counts_and_starts_with_kept_tokens(length):
    rng = np.random.default_rng(length)
    mask = random_spans_noise_mask(length, 0.15, 3.0, rng)
    noise = min(max(round(length * 0.15), 1), length - 1)
    assert mask.shape == (length,) and mask.sum() == noise
    assert not mask[0]  # the sequence starts with a kept span
    starts = int(np.sum(mask[1:] & ~mask[:-1]))
    assert starts == min(max(round(noise / 3.0), 1), noise, length - noise)


def test_noise_spans_average_the_mean_length():
    rng = np.random.default_rng(0)
    spans, tokens = 0, 0
    for _ in range(200):
        mask = random_spans_noise_mask(568, 0.15, 3.0, rng)
        tokens += int(mask.sum())
        spans += int(np.sum(mask[1:] & ~mask[:-1]))
    assert tokens / spans == pytest.approx(3.0, rel=0.02)


def test_span_corrupt_inputs_and_targets_rebuild_the_tokens():
    vocab, eos = 100, 1
    tokens = np.arange(2, 42)
    inputs, targets = span_corrupt(tokens, vocab, eos, rng=np.random.default_rng(3))
    assert inputs[-1] == eos and targets[-1] == eos
    sentinels_in = [t for t in inputs[:-1] if t >= 90]
    assert sentinels_in == list(range(99, 99 - len(sentinels_in), -1))  # <extra_id_0> = vocab - 1, then down
    # filling each input sentinel with the tokens that follow the same sentinel in the targets gives the tokens
    spans, current = {}, None
    for t in targets[:-1]:
        if t >= 90:
            current = int(t)
            spans[current] = []
        else:
            spans[current].append(int(t))
    rebuilt = [x for t in inputs[:-1] for x in (spans[int(t)] if t >= 90 else [int(t)])]
    assert rebuilt == tokens.tolist()
    assert len(inputs) + len(targets) == len(tokens) + len(spans) + len(sentinels_in) + 2


def test_span_corrupt_refuses_ids_that_collide_with_the_sentinels():
    with pytest.raises(UserError, match="collides with the sentinels"):
        span_corrupt(np.arange(90, 100), 100, 1, rng=np.random.default_rng(0))
    with pytest.raises(UserError, match="needs at least 2"):
        span_corrupt([5], 100, 1)
    with pytest.raises(UserError, match="noise_density"):
        random_spans_noise_mask(10, 1.5)


def test_span_corruption_lengths_are_t5s():
    # T5's C4 span-corruption task: 512 input tokens come from 568 raw ones, targets 114
    assert span_corruption_lengths(512) == (568, 114)
    rng = np.random.default_rng(1)
    for inputs_length in (16, 64, 128):
        raw, targets_length = span_corruption_lengths(inputs_length)
        inputs, targets = span_corrupt(np.arange(2, 2 + raw), 32100, 1, rng=rng)
        assert len(inputs) == inputs_length and len(targets) == targets_length


# --- arrays ------------------------------------------------------------------------------------

def test_encode_pairs_shifts_the_target_behind_the_start_id():
    arrays = encode_pairs([([5, 6, 1], [7, 8, 9, 1]), ([4, 1], [3, 1])], source_length=4, target_length=5,
                          pad_id=0, decoder_start_id=2)
    assert tuple(arrays) == FIELDS
    assert arrays["input_ids"].tolist() == [[5, 6, 1, 0], [4, 1, 0, 0]]
    assert arrays["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert arrays["decoder_input_ids"].tolist() == [[2, 7, 8, 9, 0], [2, 3, 0, 0, 0]]
    assert arrays["labels"].tolist() == [[7, 8, 9, 1, 0], [3, 1, 0, 0, 0]]
    assert arrays["decoder_attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    assert all(a.dtype == np.int32 for a in arrays.values())


def test_encode_pairs_refuses_to_cut_and_fitting_pairs_filters():
    pairs = [([5, 6, 1], [7, 1]), ([4, 4, 4, 4, 1], [3, 1])]
    with pytest.raises(UserError, match="example 1: a source of 5 tokens; source length is 4"):
        encode_pairs(pairs, 4, 4, 0, 0)
    kept, dropped = fitting_pairs(pairs, 4, 4)
    assert kept == pairs[:1] and dropped == 1


# --- prepare_seq2seq and the readers -------------------------------------------------------------

def _prepare_main():
    """datasets/prepare_seq2seq.py's main (the folder is not a package: load it by path)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "datasets" / "prepare_seq2seq.py"
    spec = importlib.util.spec_from_file_location("prepare_seq2seq", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_prepare_reversal_writes_true_answers_and_restarts(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("h5py")
    from common.data.text.seq2seq import check_seq2seq_meta, prepare_seq2seq, read_seq2seq_hdf5
    from common.data.text.tokenizer import read_tokenizer_json

    lines = []
    results = prepare_seq2seq(tmp_path, source_length=48, formats=("hdf5",), log=lines.append)
    meta = check_seq2seq_meta(tmp_path, 4096, 48, 48)
    assert (meta["pad_id"], meta["decoder_start_id"], meta["eos_id"]) == (0, 1, 2)
    arrays = read_seq2seq_hdf5(tmp_path / "train-00000.h5", 48, 48)
    assert arrays["input_ids"].shape == (meta["counts"]["train"], 48)
    assert meta["counts"]["train"] + meta["counts"]["eval"] + sum(meta["dropped_too_long"].values()) == 1911
    tokenizer = read_tokenizer_json(tmp_path / "tokenizer.json")
    for k in range(5):  # each target decodes to its source's words reversed
        src = arrays["input_ids"][k][arrays["attention_mask"][k] == 1]
        tgt = arrays["labels"][k][arrays["decoder_attention_mask"][k] == 1]
        assert src[-1] == tgt[-1] == 2
        assert tokenizer.decode(tgt[:-1].tolist()).split() == tokenizer.decode(src[:-1].tolist()).split()[::-1]
        assert arrays["decoder_input_ids"][k][0] == 1
    assert not any(r.skipped for r in results)
    again = prepare_seq2seq(tmp_path, source_length=48, formats=("hdf5",), log=lines.append)
    assert all(r.skipped for r in again)
    with pytest.raises(UserError, match="holds examples made with source_length = 48, not 32"):
        prepare_seq2seq(tmp_path, source_length=32, formats=("hdf5",), log=lines.append)
    with pytest.raises(UserError, match="model.vocab_size is 512"):
        check_seq2seq_meta(tmp_path, 512, 48, 48)
    with pytest.raises(UserError, match="target sequences have 48 tokens, but the model's target length is 40"):
        check_seq2seq_meta(tmp_path, 4096, 48, 40)


def test_prepare_span_corruption_both_formats_hold_the_same_examples(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("h5py")
    tf = pytest.importorskip("tensorflow")
    from common.data.text.seq2seq import prepare_seq2seq, read_seq2seq_hdf5, seq2seq_dataset

    prepare_seq2seq(tmp_path, task="span_corruption", source_length=64, log=lambda line: None)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert (meta["source_length"], meta["target_length"]) == (64, span_corruption_lengths(64)[1])
    assert meta["first_sentinel_id"] == meta["vocab_size"] - 1 == 4095
    h5 = read_seq2seq_hdf5(tmp_path / "eval-00000.h5")
    records = list(seq2seq_dataset([tmp_path / "eval-00000.tfrecord"]).batch(1000).as_numpy_iterator())[0]
    for name in FIELDS:
        np.testing.assert_array_equal(records[name], h5[name])
    assert (h5["decoder_input_ids"][:, 0] == 0).all()  # T5 starts the decoder with the pad id
    assert (h5["labels"][:, 0] == 4095).all()  # every target opens with <extra_id_0>
    del tf


def test_prepare_parallel_reads_generated_files(tmp_path):
    pytest.importorskip("tokenizers")
    pytest.importorskip("h5py")
    from common.data.text.seq2seq import prepare_seq2seq, read_seq2seq_hdf5

    words = "the a house cat dog runs sleeps red big small".split()
    rng = np.random.default_rng(0)
    en = [" ".join(rng.choice(words, size=rng.integers(2, 8))) for _ in range(300)]
    (tmp_path / "train.en").write_text("\n".join(en) + "\n")
    (tmp_path / "train.de").write_text("\n".join(s.upper() for s in en) + "\n")
    out = tmp_path / "out"
    prepare_seq2seq(out, task="parallel", source_length=16, target_length=24, vocab_size=300,
                    input_files=[tmp_path / "train.en", tmp_path / "train.de"], formats=("hdf5",),
                    log=lambda line: None)
    arrays = read_seq2seq_hdf5(out / "train-00000.h5", 16, 24)
    assert arrays["labels"].shape[1] == 24 and arrays["input_ids"].shape[1] == 16
    meta = json.loads((out / "meta.json").read_text())
    kept = meta["counts"]["train"] + meta["counts"]["eval"]
    assert kept + sum(meta["dropped_too_long"].values()) == 300 and kept > 200
    from common.data.text.tokenizer import read_tokenizer_json

    tokenizer = read_tokenizer_json(out / "tokenizer.json")
    for k in range(5):
        src = tokenizer.decode(arrays["input_ids"][k][arrays["attention_mask"][k] == 1].tolist())
        tgt = tokenizer.decode(arrays["labels"][k][arrays["decoder_attention_mask"][k] == 1].tolist())
        assert src.strip() in en and tgt.strip() == src.strip().upper()


def test_prepare_bad_input_is_one_error_line(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    main = _prepare_main()
    (tmp_path / "one.en").write_text("a\nb\n")
    cases = [
        (["--task", "parallel", "--input_files", str(tmp_path / "one.en")], "task parallel: give two input files"),
        (["--task", "parallel", "--input_files", str(tmp_path / "one.en"), str(tmp_path / "no.de")],
         "no.de: no such file"),
        (["--source_length", "1"], "source_length 1: must be at least 2"),
        (["--task", "span_corruption", "--source_length", "64", "--target_length", "5"],
         "target_length 5: span corruption of 64 input tokens makes targets of up to 14 tokens"),
        (["--vocab_size", "100"], "vocab_size 100: too small"),
    ]
    for argv, message in cases:
        assert main(["--output_dir", str(tmp_path / "out"), "--format", "hdf5", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and message in err[-1], err
        assert not any(line.startswith("Traceback") for line in err)


def test_wrong_hdf5_file_names_the_field(tmp_path):
    h5py = pytest.importorskip("h5py")
    from common.data.text.seq2seq import read_seq2seq_hdf5

    good = encode_pairs([([5, 1], [6, 1])], 4, 3, 0, 1)
    with h5py.File(tmp_path / "x.h5", "w") as f:
        for name, a in good.items():
            f.create_dataset(name, data=a if name != "labels" else a[:, :2])
    with pytest.raises(UserError, match="x.h5: field 'labels' holds 2 tokens per example; expected target length 3"):
        read_seq2seq_hdf5(tmp_path / "x.h5")
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f.create_dataset("input_ids", data=good["input_ids"])
    with pytest.raises(UserError, match="y.h5: not a sequence-to-sequence data file: field 'attention_mask' is missing"):
        read_seq2seq_hdf5(tmp_path / "y.h5")


def test_the_unigram_tokenizer_is_the_same_in_every_process():
    # the trainer of `tokenizers` sums in hash-map order, seeded afresh in each process: without
    # canonical scores and order, two processes give pieces at other ids (and README figures
    # that a rerun from scratch does not reproduce)
    import subprocess
    import sys
    code = ("from common.data.text.corpus import default_corpus\n"
            "from common.data.text.tokenizer import train_unigram\n"
            "texts = [' '.join(d) for d in default_corpus()][:200]\n"
            "print(train_unigram(texts, 1000, ('<pad>', '</s>', '<unk>'), '<unk>', sentinels=4).to_str())\n")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(3)}
    assert len(runs) == 1
    vocab = json.loads(runs.pop())["model"]["vocab"]
    assert [p for p, _ in vocab[:3]] == ["<pad>", "</s>", "<unk>"] and len(vocab) == 996
    scores = [s for _, s in vocab[3:]]
    assert scores == sorted(scores, reverse=True)
