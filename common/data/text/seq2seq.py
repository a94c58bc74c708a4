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

import hashlib
import json
import os
import random
from pathlib import Path
from typing import Sequence

import numpy as np

from common.data.text.corpus import default_corpus, read_corpus
from common.data.text.shards import (
    FORMATS, HDF5Examples, Schema, ShardResult, check_formats, previous_files, read_hdf5, tfrecord_dataset,
    write_shards,
)
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


# --- readers (common/data/text/shards.py does the work) -----------------------------------------

SCHEMA = Schema((("input_ids", "source"), ("attention_mask", "source"), ("decoder_input_ids", "target"),
                 ("decoder_attention_mask", "target"), ("labels", "target")), "sequence-to-sequence",
                binary=("attention_mask", "decoder_attention_mask"))
TASKS = ("reversal", "parallel", "span_corruption")
META = "meta.json"
DEFAULT_VOCAB_SIZE = 4096
PAD, START, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SENTINELS = 100  # T5's <extra_id_0> .. <extra_id_99>


def _lengths(source_length=None, target_length=None) -> dict:
    return {k: v for k, v in (("source", source_length), ("target", target_length)) if v is not None}


def read_seq2seq_hdf5(path, source_length=None, target_length=None) -> dict[str, np.ndarray]:
    """The int32 arrays of one HDF5 shard, schema-checked."""
    return read_hdf5(path, SCHEMA, _lengths(source_length, target_length))


class Seq2SeqHDF5Dataset(HDF5Examples):
    """A map-style torch dataset over HDF5 shards: item k is a dict of int64 tensors, the
    encoder fields (source_length,) and the decoder fields (target_length,)."""

    def __init__(self, paths, source_length=None, target_length=None):
        super().__init__(paths, SCHEMA, _lengths(source_length, target_length))


def seq2seq_dataset(paths, source_length=None, target_length=None):
    """A tf.data.Dataset of dicts of int32 tensors over TFRecord shards (shards.tfrecord_dataset)."""
    return tfrecord_dataset(paths, SCHEMA, _lengths(source_length, target_length))


def read_seq2seq_meta(data_dir) -> dict:
    path = Path(data_dir) / META
    if not path.is_file():
        raise UserError(f"{path}: no such file; prepare the folder with datasets/prepare_seq2seq.py")
    try:
        meta = json.loads(path.read_text())
        for key in ("vocab_size", "source_length", "target_length", "pad_id", "eos_id", "decoder_start_id"):
            int(meta[key])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise UserError(f"{path}: unreadable (not the meta.json of datasets/prepare_seq2seq.py)") from None
    return meta


def check_seq2seq_meta(data_dir, vocab_size: int, source_length: int, target_length: int) -> dict:
    """data_dir's meta.json, after checking the model's vocab and lengths equal the data's."""
    meta = read_seq2seq_meta(data_dir)
    where = Path(data_dir) / META
    if meta["vocab_size"] != vocab_size:
        raise UserError(f"{where}: the data's vocab has {meta['vocab_size']:,} tokens, but model.vocab_size is "
                        f"{vocab_size:,}; set model.vocab_size: {meta['vocab_size']} or prepare data with "
                        f"--vocab_size {vocab_size}")
    for side, length in (("source", source_length), ("target", target_length)):
        if meta[f"{side}_length"] != length:
            raise UserError(f"{where}: the data's {side} sequences have {meta[f'{side}_length']} tokens, but the "
                            f"model's {side} length is {length}; use a data_dir prepared with --{side}_length {length}")
    return meta


# --- prepare ----------------------------------------------------------------------------------

def _split(items: list, seed: int, eval_fraction: float, what: str) -> dict[str, list]:
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)  # which items are held out: the same for a seed
    num_eval = max(1, round(len(order) * eval_fraction)) if eval_fraction > 0 else 0
    if len(order) - num_eval < 1:
        raise UserError(f"{what}: {len(order)} item(s) leave none for training after eval_fraction {eval_fraction}")
    return {"train": [items[i] for i in order[num_eval:]], "eval": [items[i] for i in order[:num_eval]]}


def _span_examples(token_docs: list[list[int]], tokens_length: int, vocab_size: int, eos_id: int,
                   noise_density: float, mean_noise_span_length: float, seed: str) -> list:
    """T5's unsupervised examples: the documents concatenated, cut into chunks of
    tokens_length (the last one shorter), each chunk span-corrupted."""
    stream = np.array([t for d in token_docs for t in d], dtype=np.int64)
    rng = np.random.default_rng(int(hashlib.sha256(seed.encode()).hexdigest()[:16], 16))
    chunks = [stream[k:k + tokens_length] for k in range(0, len(stream), tokens_length)]
    return [span_corrupt(c, vocab_size, eos_id, noise_density, mean_noise_span_length, rng)
            for c in chunks if len(c) >= 2]


def prepare_seq2seq(
    output_dir,
    task: str = "reversal",
    source_length: int = 64,
    target_length: int | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    input_files=None,
    field: str = "text",
    formats=FORMATS,
    num_shards: int = 1,
    seed: int = 12345,
    eval_fraction: float = 0.1,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    log=print,
) -> list[ShardResult]:
    """A folder of encoder-decoder examples (datasets/prepare_seq2seq.py documents it).

    ``task``: ``reversal`` (input_files: corpora, default the default corpus), ``parallel``
    (input_files: [source file, target file]) or ``span_corruption`` (T5; input_files:
    corpora). target_length defaults to source_length, and for span corruption to what T5's
    rule gives for source_length.
    """
    from common.data.text.prepare import _Progress
    from common.data.text.tokenizer import train_bpe_with_specials, train_unigram, vocab_in_id_order

    if task not in TASKS:
        raise UserError(f"task {task!r}: unknown; choose from {', '.join(TASKS)}")
    if source_length < 2:
        raise UserError(f"source_length {source_length}: must be at least 2")
    if task == "span_corruption":
        _check_noise(noise_density, mean_noise_span_length)
        tokens_length, needed = span_corruption_lengths(source_length, noise_density, mean_noise_span_length)
        target_length = needed if target_length is None else target_length
        if target_length < needed:
            raise UserError(f"target_length {target_length}: span corruption of {source_length} input tokens "
                            f"makes targets of up to {needed} tokens")
    target_length = source_length if target_length is None else target_length
    if target_length < 2:
        raise UserError(f"target_length {target_length}: must be at least 2")
    if vocab_size < 300 + (SENTINELS if task == "span_corruption" else 0):
        raise UserError(f"vocab_size {vocab_size}: too small (at least "
                        f"{300 + (SENTINELS if task == 'span_corruption' else 0)})")
    if num_shards < 1:
        raise UserError(f"num_shards {num_shards}: must be at least 1")
    if not 0.0 <= eval_fraction < 1.0:
        raise UserError(f"eval_fraction {eval_fraction}: must be in [0, 1)")
    io = check_formats(formats)  # a missing library stops before any work

    output_dir = Path(output_dir)
    input_files = [str(f) for f in (input_files or [])]
    if task == "parallel":
        if len(input_files) != 2:
            raise UserError("task parallel: give two input files, the source text and its translation "
                            f"(got {len(input_files)})")
        pairs, blank = read_parallel(*input_files)
        source = f"{input_files[0]} -> {input_files[1]}"
        texts = [s for p in pairs for s in p]
    else:
        documents = read_corpus(input_files, field) if input_files else default_corpus()
        source = ", ".join(input_files) if input_files else "the default corpus (pydoc_data topics)"
        blank = 0
        if task == "reversal":
            pairs = reversal_pairs(documents)
            texts = [s for p in pairs for s in p]
        else:
            texts = [" ".join(d) for d in documents]

    if task == "span_corruption":
        tokenizer = train_unigram(texts, vocab_size, (PAD, EOS, UNK), UNK, sentinels=SENTINELS)
        pad_id, eos_id = tokenizer.token_to_id(PAD), tokenizer.token_to_id(EOS)
        start_id = pad_id  # T5 starts the decoder with the pad id
    else:
        tokenizer = train_bpe_with_specials(texts, vocab_size, (PAD, START, EOS))
        pad_id, eos_id, start_id = (tokenizer.token_to_id(t) for t in (PAD, EOS, START))
    vocab = vocab_in_id_order(tokenizer)

    def encode(batch: list[str], progress) -> list[list[int]]:
        out = []
        for k in range(0, len(batch), 256):
            out.extend(e.ids for e in tokenizer.encode_batch(batch[k:k + 256], add_special_tokens=False))
            progress(min(256, len(batch) - k))
        return out

    dropped = {}
    if task == "span_corruption":
        progress = _Progress(len(texts), "tokenize")
        token_docs = [d for d in encode(texts, progress) if d]
        progress.close()
        examples = {split: _span_examples(docs, tokens_length, len(vocab), eos_id, noise_density,
                                          mean_noise_span_length, f"{seed}/{split}")
                    for split, docs in _split(token_docs, seed, eval_fraction, source).items()}
    else:
        progress = _Progress(2 * len(pairs), "tokenize")
        ids = encode([s for s, _ in pairs], progress), encode([t for _, t in pairs], progress)
        progress.close()
        encoded = [(s + [eos_id], t + [eos_id]) for s, t in zip(*ids)]
        examples = {}
        for split, items in _split(encoded, seed, eval_fraction, source).items():
            examples[split], dropped[split] = fitting_pairs(items, source_length, target_length)
    splits = {}
    for split, items in examples.items():
        random.Random(f"{seed}/{split}").shuffle(items)
        splits[split] = encode_pairs(items, source_length, target_length, pad_id, start_id)
    n_train = splits["train"]["input_ids"].shape[0]
    if n_train < num_shards:
        raise UserError(f"{source}: {n_train} training example(s) fit source_length {source_length} and "
                        f"target_length {target_length}: too few for {num_shards} shard(s)")

    settings = {
        "task": task,
        "source": source,
        "fingerprint": hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16],
        "vocab_size_requested": vocab_size,
        "source_length": source_length,
        "target_length": target_length,
        "seed": seed,
        "num_shards": num_shards,
        "eval_fraction": eval_fraction,
        **({"noise_density": noise_density, "mean_noise_span_length": mean_noise_span_length}
           if task == "span_corruption" else {}),
    }
    output_dir.mkdir(parents=True, exist_ok=True)
    meta_path = output_dir / META
    meta = {
        "task": task,
        "vocab_size": len(vocab),
        "source_length": source_length,
        "target_length": target_length,
        "pad_id": pad_id,
        "eos_id": eos_id,
        "decoder_start_id": start_id,
        **({"first_sentinel_id": len(vocab) - 1, "sentinels": SENTINELS} if task == "span_corruption" else {}),
        "counts": {s: int(a["input_ids"].shape[0]) for s, a in splits.items()},
        "dropped_too_long": dropped,
        "blank_pairs": blank,
        "vocab_sha256": hashlib.sha256("\n".join(vocab).encode()).hexdigest()[:16],
        "settings": settings,
        "files": previous_files(meta_path, settings),
    }
    tmp = output_dir / "tokenizer.json.tmp"
    tokenizer.save(str(tmp))
    os.replace(tmp, output_dir / "tokenizer.json")
    too_long = sum(dropped.values())
    log(f"{source}: task {task}, {sum(meta['counts'].values()):,} examples ({meta['counts']['eval']:,} held out "
        f"for eval){f', {too_long:,} longer than the lengths left out' if too_long else ''}"
        f"{f', {blank:,} pairs with a blank side left out' if blank else ''}; vocab {len(vocab):,} "
        f"-> {output_dir / 'tokenizer.json'}")
    shard_counts = {"train": num_shards, "eval": 1 if meta["counts"]["eval"] else 0}
    return write_shards(output_dir, splits, shard_counts, io, SCHEMA, meta, meta_path, log,
                        what=f"examples of {source_length} -> {target_length} tokens")
