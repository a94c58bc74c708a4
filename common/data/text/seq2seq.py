"""Sequence-to-sequence data (Transformer, T5): parallel text, a default task with a true
answer, T5's span corruption, and fixed-length encoder/decoder arrays.

- ``read_parallel(source, target)``: translation data as WMT ships it, two line-aligned
  UTF-8 files (``train.en`` / ``train.de``), line k of one the translation of line k of the
  other. Pairs with a blank side are dropped and counted; files of different lengths, or a
  line that is not UTF-8, stop with one line naming the file (and the line).
- ``reversal_pairs(documents)``: the default task when no parallel text is given, built
  from the default corpus's sentences: the target is the source's words in reverse order
  ("Names refer to objects." -> "objects. to refer Names"). Deterministic, every target
  has one right answer (exact match is a true accuracy), and solving it needs what
  translation needs: attention from each output position to the right input position.
- ``random_spans_noise_mask`` and ``span_corrupt``: T5's pretraining objective (Raffel et
  al. 2020, section 3.1.4): about ``noise_density`` of the tokens, in spans of mean length
  ``mean_noise_span_length``, are dropped from the input, each span replaced by one
  sentinel; the target lists the dropped spans, each after its sentinel::

      tokens   Thank you for inviting me to your party last week .
      inputs   Thank you <X> me to your party <Y> week . </s>
      targets  <X> for inviting <Y> last <Z> </s>

  The sentinels are the vocabulary's last ids, ``<extra_id_0>`` = vocab_size - 1 and down,
  as T5's vocabulary orders them. ``span_corruption_lengths`` is T5's rule for the raw
  length that fills the input exactly (512 input tokens take 568 raw tokens, and their
  targets at most 114).
- ``encode_pairs``: (source ids, target ids) pairs into the arrays an encoder-decoder
  trains on, (N, S) and (N, T) int32: ``input_ids``, ``attention_mask`` (1 on real source
  tokens), ``decoder_input_ids`` (the target shifted right behind the start id),
  ``labels`` (the target, padded) and ``decoder_attention_mask`` (1 on real labels).

Everything here is numpy and the standard library; the randomness comes from a
``numpy.random.Generator`` the caller seeds, so a seed gives the same examples.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from common.errors import UserError

FIELDS = ("input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels")


# --- parallel text -----------------------------------------------------------------------------

def _lines(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    out = []
    for k, raw in enumerate(lines, start=1):
        try:
            out.append(raw.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise UserError(f"{path}:{k}: not UTF-8 text (byte {e.start + 1} of the line)") from None
    return out


def read_parallel(source, target) -> tuple[list[tuple[str, str]], int]:
    """(pairs, dropped): the line-aligned pairs of two files, and how many had a blank side."""
    source, target = Path(source), Path(target)
    src, tgt = _lines(source), _lines(target)
    if len(src) != len(tgt):
        raise UserError(f"{source} has {len(src):,} lines but {target} has {len(tgt):,}: parallel files "
                        f"hold one sentence per line, line k of one translating line k of the other")
    pairs, dropped = [], 0
    for s, t in zip(src, tgt):
        s, t = " ".join(s.split()), " ".join(t.split())
        if s and t:
            pairs.append((s, t))
        else:
            dropped += 1
    if not pairs:
        raise UserError(f"{source}, {target}: no line pair with text on both sides")
    return pairs, dropped


# --- the default task --------------------------------------------------------------------------

def reverse_words(sentence: str) -> str:
    return " ".join(reversed(sentence.split()))


def reversal_pairs(documents: Sequence[Sequence[str]], min_words: int = 3,
                   max_words: int = 24) -> list[tuple[str, str]]:
    """(sentence, its words reversed) for every sentence of ``documents`` of min..max words,
    in corpus order, each distinct sentence once."""
    if not 1 <= min_words <= max_words:
        raise UserError(f"min_words {min_words}, max_words {max_words}: need 1 <= min_words <= max_words")
    seen, pairs = set(), []
    for document in documents:
        for sentence in document:
            sentence = " ".join(sentence.split())
            if min_words <= len(sentence.split()) <= max_words and sentence not in seen:
                seen.add(sentence)
                pairs.append((sentence, reverse_words(sentence)))
    return pairs


# --- T5 span corruption ------------------------------------------------------------------------

def _check_noise(noise_density: float, mean_noise_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise UserError(f"noise_density {noise_density}: must be in (0, 1)")
    if not mean_noise_span_length >= 1.0:
        raise UserError(f"mean_noise_span_length {mean_noise_span_length}: must be at least 1")


def _noise_counts(length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """(noise tokens, noise spans) of a sequence of ``length`` tokens, T5's rounding."""
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_noise_span_length)), 1)
    return num_noise, num_spans


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths (num_segments,) >= 1 summing to num_items, uniform over such splits."""
    first = np.zeros(num_items, dtype=bool)
    first[1 + rng.choice(num_items - 1, size=num_segments - 1, replace=False)] = True
    first[0] = True
    return np.diff(np.append(np.flatnonzero(first), num_items))


def random_spans_noise_mask(length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0,
                            rng: np.random.Generator | None = None) -> np.ndarray:
    """A bool mask (length,) of the tokens to drop: noise spans alternating with kept spans,
    the sequence starting with a kept one, as T5's ``random_spans_noise_mask``."""
    _check_noise(noise_density, mean_noise_span_length)
    rng = rng if rng is not None else np.random.default_rng(0)
    if length < 2:
        raise UserError(f"span corruption of {length} token(s): needs at least 2")
    num_noise, num_spans = _noise_counts(length, noise_density, mean_noise_span_length)
    num_spans = min(num_spans, num_noise, length - num_noise)  # each span, kept or noise, holds a token
    noise_lengths = _random_segmentation(num_noise, num_spans, rng)
    kept_lengths = _random_segmentation(length - num_noise, num_spans, rng)
    mask = np.zeros(length, dtype=bool)
    start = 0
    for kept, noise in zip(kept_lengths, noise_lengths):
        start += kept
        mask[start:start + noise] = True
        start += noise
    return mask


def _spans_to_sentinels(tokens: np.ndarray, drop: np.ndarray, first_sentinel: int) -> np.ndarray:
    """``tokens`` with each run of ``drop`` replaced by one sentinel, counting down from first_sentinel."""
    starts = drop & ~np.concatenate([[False], drop[:-1]])
    sentinels = first_sentinel - (np.cumsum(starts) - 1)
    out = np.where(starts, sentinels, tokens)
    return out[~drop | starts]


def span_corrupt(tokens: Sequence[int], vocab_size: int, eos_id: int, noise_density: float = 0.15,
                 mean_noise_span_length: float = 3.0,
                 rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of one token sequence, each ending in eos_id (see the module docstring)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    mask = random_spans_noise_mask(len(tokens), noise_density, mean_noise_span_length, rng)
    first_sentinel = vocab_size - 1
    spans = int(np.sum(mask & ~np.concatenate([[False], mask[:-1]])))
    if tokens.size and int(tokens.max()) > first_sentinel - spans:
        raise UserError(f"token id {int(tokens.max())} collides with the sentinels (ids {first_sentinel - spans + 1}.."
                        f"{first_sentinel} of a vocab of {vocab_size}); keep the vocabulary's last ids for them")
    inputs = _spans_to_sentinels(tokens, mask, first_sentinel)
    targets = _spans_to_sentinels(tokens, ~mask, first_sentinel)
    return np.append(inputs, eos_id), np.append(targets, eos_id)


def span_corruption_lengths(inputs_length: int, noise_density: float = 0.15,
                            mean_noise_span_length: float = 3.0) -> tuple[int, int]:
    """(raw tokens, targets length): the most raw tokens whose corrupted input (with its
    sentinels and EOS) fits ``inputs_length``, and the length of their targets."""
    _check_noise(noise_density, mean_noise_span_length)

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    if inputs_length < 2:
        raise UserError(f"inputs_length {inputs_length}: must be at least 2 (a token and EOS)")
    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    return tokens_length, lengths(tokens_length)[1]


# --- fixed-length arrays -----------------------------------------------------------------------

def encode_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], source_length: int, target_length: int,
                 pad_id: int, decoder_start_id: int) -> dict[str, np.ndarray]:
    """The arrays of ``FIELDS`` for token-id pairs, each side already ending in its EOS.

    A pair longer than its side's length is an error rather than cut: a cut target is a
    wrong answer. Padding is pad_id with mask 0; labels are the target (pad_id where padded,
    never a real label: decoder_attention_mask says which positions count).
    """
    n = len(pairs)
    arrays = {
        "input_ids": np.full((n, source_length), pad_id, dtype=np.int32),
        "attention_mask": np.zeros((n, source_length), dtype=np.int32),
        "decoder_input_ids": np.full((n, target_length), pad_id, dtype=np.int32),
        "decoder_attention_mask": np.zeros((n, target_length), dtype=np.int32),
        "labels": np.full((n, target_length), pad_id, dtype=np.int32),
    }
    for k, (source, target) in enumerate(pairs):
        if not 0 < len(source) <= source_length:
            raise UserError(f"example {k}: a source of {len(source)} tokens; source length is {source_length}")
        if not 0 < len(target) <= target_length:
            raise UserError(f"example {k}: a target of {len(target)} tokens; target length is {target_length}")
        arrays["input_ids"][k, :len(source)] = source
        arrays["attention_mask"][k, :len(source)] = 1
        arrays["labels"][k, :len(target)] = target
        arrays["decoder_attention_mask"][k, :len(target)] = 1
        arrays["decoder_input_ids"][k, 0] = decoder_start_id
        arrays["decoder_input_ids"][k, 1:len(target)] = target[:-1]
    return arrays


def fitting_pairs(pairs: Sequence[tuple[Sequence[int], Sequence[int]]], source_length: int,
                  target_length: int) -> tuple[list, int]:
    """(the pairs whose sides fit their lengths, how many did not): what a prepare step keeps."""
    kept = [p for p in pairs if 0 < len(p[0]) <= source_length and 0 < len(p[1]) <= target_length]
    return kept, len(pairs) - len(kept)
