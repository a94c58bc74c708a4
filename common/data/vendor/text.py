"""Text data in the layouts the vendor's PyTorch BERT, T5 and Transformer folders read (R1.6).

Each writer takes this zoo's corpus and tokenizers (common/data/text/) and writes files
that the vendor's data processors read unchanged. The contracts, as those processors read them:

- ``meta.dat`` (every layout): one line per data file, ``<name> <examples>``; the reader
  joins ``<name>`` to the ``data_dir`` holding meta.dat and reads exactly ``<examples>``
  rows of it. The Transformer's is ``<source path> <target path> <examples>`` with the
  paths used as written, so they are written absolute.
- BERT pretraining (BertCSVDynamicMaskDataProcessor): CSV with a header ``tokens,
  segment_ids,is_random_next``; ``tokens`` a Python list of token strings
  (``['[CLS]', 'the', ...]``, read with eval), ``segment_ids`` a list of ints
  (``[0, 0, 1]``), ``is_random_next`` 0 or 1. Unmasked: the reader masks each epoch.
  ``[CLS] A [SEP] B [SEP]`` pairs made by this zoo's port of Google's algorithm
  (common/data/text/pretraining.py) with no masking, at most max_seq_length tokens.
- T5 (T5DynamicDataProcessor): text files, one document a line, its pieces separated by
  single spaces; the reader splits, looks the pieces up in ``vocab.txt`` (one piece a line,
  the id the line number) and makes the span-corruption examples itself.
- Transformer (TransformerDynamicDataProcessor): two line-aligned text files of space-
  separated pieces, source and target, and a vocab file for each.

A vocab file holds every token the data files use (nothing maps to the reader's
out-of-vocabulary id) and the special tokens the vendor's readers look up.
"""

from __future__ import annotations

import csv
import dataclasses
import random
from pathlib import Path

from common.errors import UserError

META = "meta.dat"
BERT_COLUMNS = ("tokens", "segment_ids", "is_random_next")


def check_output_dir(output_dir) -> Path:
    """``output_dir`` if it is new or an empty folder; a file there or a folder with anything in it is
    refused (nothing is overwritten). Checked before any work, and again when the writing starts."""
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise UserError(f"--output_dir {path}: is a file, not a folder")
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"--output_dir {path}: not empty; give a new or empty folder (nothing is overwritten)")
    return path


def claim_output_dir(output_dir) -> Path:
    path = check_output_dir(output_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_positive(**values) -> None:
    for name, value in values.items():
        if value < 1:
            raise UserError(f"--{name} {value}: must be at least 1")


def split_documents(documents: list, eval_fraction: float, seed: int, what: str) -> dict[str, list]:
    """The items shuffled with ``seed`` and cut: the first ``eval_fraction`` (at least one) for eval."""
    if not 0.0 < eval_fraction < 1.0:
        raise UserError(f"--eval_fraction {eval_fraction}: must be in (0, 1)")
    items = list(documents)
    random.Random(seed).shuffle(items)
    num_eval = max(1, round(len(items) * eval_fraction))
    if len(items) - num_eval < 1:
        raise UserError(f"{len(items)} {what}: too few to hold out {eval_fraction} for eval and train on the rest")
    return {"train": items[num_eval:], "eval": items[:num_eval]}


def write_meta_dat(data_dir: Path, counts: list[tuple[str, int]]) -> Path:
    """meta.dat of ``data_dir``: ``<name> <examples>`` a line."""
    path = Path(data_dir) / META
    path.write_text("".join(f"{name} {count}\n" for name, count in counts), encoding="utf-8")
    return path


def deal(items: list, num_files: int, option: str, what: str) -> list[list]:
    """Item k into file k % num_files (as the vendor's scripts deal rows); every file gets one at least."""
    if len(items) < num_files:
        raise UserError(f"{len(items)} {what} cannot fill {option} {num_files}; lower it or give more text")
    return [items[k::num_files] for k in range(num_files)]


def _files_of(split: str, num_files: int, num_eval_files: int) -> tuple[int, str]:
    return (num_eval_files, "--num_eval_files") if split == "eval" else (num_files, "--num_files")


# --- BERT pretraining CSV ------------------------------------------------------------------------

def bert_rows(token_documents: list[list[list[int]]], vocab: list[str], max_seq_length: int,
              short_seq_prob: float, dupe_factor: int, seed: int) -> list[dict]:
    """Unmasked [CLS] A [SEP] B [SEP] pairs of the documents (lists of sentences of ids), as CSV rows."""
    from common.data.text.pretraining import MaskingConfig, SpecialIds, instances_from_document
    from common.data.text.tokenizer import CLS, MASK, SEP

    cfg = MaskingConfig(max_seq_length=max_seq_length, short_seq_prob=short_seq_prob,
                        dupe_factor=dupe_factor).validate()
    # no position is masked: the vendor's reader masks each example itself, each epoch anew
    cfg = dataclasses.replace(cfg, max_predictions_per_seq=0)
    index = {t: i for i, t in enumerate(vocab)}
    ids = SpecialIds(cls=index[CLS], sep=index[SEP], mask=index[MASK], vocab_size=len(vocab))
    rng = random.Random(seed)
    rows = []
    for _ in range(dupe_factor):
        for d in range(len(token_documents)):
            for inst in instances_from_document(token_documents, d, cfg, ids, rng):
                rows.append({"tokens": str([vocab[t] for t in inst.tokens]),
                             "segment_ids": str(list(inst.segment_ids)),
                             "is_random_next": int(inst.is_random_next)})
    rng.shuffle(rows)
    return rows


def write_bert_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=BERT_COLUMNS, quoting=csv.QUOTE_MINIMAL)
        writer.writeheader()
        writer.writerows(rows)


def prepare_vendor_bert(output_dir, max_seq_length: int = 128, vocab_size: int = 8192, num_files: int = 8,
                        num_eval_files: int = 1, dupe_factor: int = 2, short_seq_prob: float = 0.1,
                        eval_fraction: float = 0.1, max_documents: int | None = None, seed: int = 12345,
                        log=print) -> dict:
    """DIR/vocab.txt, DIR/train/{meta.dat, bert-1.csv..} and DIR/eval/{meta.dat, bert-1.csv..}; returns counts."""
    from common.data.text.corpus import default_corpus
    from common.data.text.tokenizer import train_wordpiece, vocab_in_id_order, write_vocab_txt

    check_positive(num_files=num_files, num_eval_files=num_eval_files, dupe_factor=dupe_factor, vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    check_output_dir(output_dir)
    documents = default_corpus()[:max_documents]
    tokenizer = train_wordpiece(documents, vocab_size, lowercase=True)
    vocab = vocab_in_id_order(tokenizer)
    sentences = [s for d in documents for s in d]
    encoded = iter(e.ids for e in tokenizer.encode_batch(sentences, add_special_tokens=False))
    token_documents = [[i for i in (next(encoded) for _ in d) if i] for d in documents]
    token_documents = [d for d in token_documents if d]
    files = {}  # split -> rows of each file; all made before anything is written
    for split, docs in split_documents(token_documents, eval_fraction, seed, "documents").items():
        rows = bert_rows(docs, vocab, max_seq_length, short_seq_prob, dupe_factor, seed)
        files[split] = deal(rows, *_files_of(split, num_files, num_eval_files), f"{split} examples")

    out = claim_output_dir(output_dir)
    write_vocab_txt(tokenizer, out / "vocab.txt")
    for split, parts in files.items():
        (out / split).mkdir()
        for k, part in enumerate(parts, start=1):
            write_bert_csv(out / split / f"bert-{k}.csv", part)
        write_meta_dat(out / split, [(f"bert-{k}.csv", len(part)) for k, part in enumerate(parts, start=1)])
    counts = {split: sum(map(len, parts)) for split, parts in files.items()}
    log(f"the default corpus: {len(token_documents):,} documents; vocab {len(vocab):,}; "
        f"{counts['train']:,} train and {counts['eval']:,} eval examples in {out}")
    return {"vocab_size": len(vocab), **counts}


# --- T5 and Transformer: lines of space-separated pieces -----------------------------------------

def write_token_lines(path: Path, lines: list[list[str]]) -> None:
    """One example a line, its pieces separated by single spaces (no piece holds a space)."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        for pieces in lines:
            f.write(" ".join(pieces) + "\n")


def _pieces(tokenizer, texts: list[str]) -> list[list[str]]:
    return [e.tokens for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _write_vocab(tokenizer, path: Path) -> list[str]:
    from common.data.text.tokenizer import vocab_in_id_order

    vocab = vocab_in_id_order(tokenizer)
    path.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    return vocab


def prepare_vendor_t5(output_dir, vocab_size: int = 4096, num_files: int = 8, num_eval_files: int = 8,
                      sentences_per_line: int = 4, eval_fraction: float = 0.1, max_documents: int | None = None,
                      seed: int = 12345, log=print) -> dict:
    """DIR/vocab.txt and DIR/train/, DIR/eval/ (meta.dat, c4-1.txt ..): a line is ``sentences_per_line``
    consecutive sentences of a document of the corpus (its last line what is left)."""
    from common.data.text.corpus import default_corpus
    from common.data.text.seq2seq import EOS, PAD, START, UNK
    from common.data.text.tokenizer import train_unigram

    check_positive(num_files=num_files, num_eval_files=num_eval_files, sentences_per_line=sentences_per_line,
                   vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    check_output_dir(output_dir)
    texts = [" ".join(d[k:k + sentences_per_line]) for d in default_corpus()[:max_documents]
             for k in range(0, len(d), sentences_per_line)]
    # T5's first ids (<pad> 0, </s> 1, <unk> 2), then <s>, which the vendor's reader looks up as its sos_token;
    # no sentinels: the reader adds extra_ids of them past the file's last id
    tokenizer = train_unigram(texts, vocab_size, (PAD, EOS, UNK, START), UNK)
    lines = [p for p in _pieces(tokenizer, texts) if p]
    files = {split: deal(items, *_files_of(split, num_files, num_eval_files), f"{split} lines")
             for split, items in split_documents(lines, eval_fraction, seed, "lines").items()}

    out = claim_output_dir(output_dir)
    vocab = _write_vocab(tokenizer, out / "vocab.txt")
    for split, parts in files.items():
        (out / split).mkdir()
        for k, part in enumerate(parts, start=1):
            write_token_lines(out / split / f"c4-{k}.txt", part)
        write_meta_dat(out / split, [(f"c4-{k}.txt", len(part)) for k, part in enumerate(parts, start=1)])
    counts = {split: sum(map(len, parts)) for split, parts in files.items()}
    log(f"the default corpus: {len(lines):,} lines of {sentences_per_line} sentences; vocab {len(vocab):,}; "
        f"{counts['train']:,} train and {counts['eval']:,} eval lines in {out}")
    return {"vocab_size": len(vocab), **counts}


def prepare_vendor_transformer(output_dir, vocab_size: int = 4096, num_files: int = 8, num_eval_files: int = 8,
                               eval_fraction: float = 0.1, max_documents: int | None = None, seed: int = 12345,
                               log=print) -> dict:
    """DIR/vocab.txt and, per split, DIR/<split>/src/ (meta.dat, text-K.src) and DIR/<split>/tgt/ (text-K.tgt):
    the zoo's reversal task (each sentence of the corpus, and its words in reverse order)."""
    from common.data.text.corpus import default_corpus
    from common.data.text.seq2seq import EOS, PAD, START, UNK, reversal_pairs
    from common.data.text.tokenizer import train_bpe_with_specials

    check_positive(num_files=num_files, num_eval_files=num_eval_files, vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    check_output_dir(output_dir)
    pairs = reversal_pairs(default_corpus()[:max_documents])
    # one vocab for both sides: the vendor's reader looks the target's pieces up in src_vocab_file too
    tokenizer = train_bpe_with_specials([t for p in pairs for t in p], vocab_size, (PAD, START, EOS, UNK))
    sources, targets = _pieces(tokenizer, [s for s, _ in pairs]), _pieces(tokenizer, [t for _, t in pairs])
    files = {split: deal(items, *_files_of(split, num_files, num_eval_files), f"{split} pairs")
             for split, items in split_documents(list(zip(sources, targets)), eval_fraction, seed,
                                                 "sentence pairs").items()}

    out = claim_output_dir(output_dir)
    vocab = _write_vocab(tokenizer, out / "vocab.txt")
    for split, parts in files.items():
        src_dir, tgt_dir = out / split / "src", out / split / "tgt"
        src_dir.mkdir(parents=True)
        tgt_dir.mkdir()
        meta = []
        for k, part in enumerate(parts, start=1):
            src, tgt = src_dir / f"text-{k}.src", tgt_dir / f"text-{k}.tgt"
            write_token_lines(src, [s for s, _ in part])
            write_token_lines(tgt, [t for _, t in part])
            # the reader opens these paths as written: absolute, so any working directory finds them
            meta.append((f"{src.resolve()} {tgt.resolve()}", len(part)))
        write_meta_dat(src_dir, meta)
    counts = {split: sum(map(len, parts)) for split, parts in files.items()}
    log(f"the default corpus: {len(pairs):,} sentence pairs (target: the words reversed); vocab {len(vocab):,}; "
        f"{counts['train']:,} train and {counts['eval']:,} eval pairs in {out}")
    return {"vocab_size": len(vocab), **counts}
