"""common/data/text/seq2seq.py: parallel text, the reversal task, T5 span corruption, arrays."""

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
