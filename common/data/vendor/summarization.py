"""A stand-in for CNN/DailyMail in the BertSum CSV layout the vendor's extractive summarization folder reads (R1.6).

A runnable stand-in made from the default corpus (the Python documentation's prose), not
the benchmark set. The rule: an article is up to ``sentences_per_article`` consecutive
sentences of one document (as many whole sentences as fit ``max_sequence_length``); its
summary, the sentences labelled 1, is the ``ceil(k / 3)`` of its k sentences that share
the most distinct words (lowercased, 4 letters or more) with the article's other
sentences, the earlier one first on a tie: the sentences most central to the article.

The files, as the vendor's BertSumCSVDataProcessor reads them (its BertCSVFormatter
writes the same): ``<split>/meta.dat`` (``<file> <rows>``) and ``<split>/bertsum-K.csv``
with the header ``input_token_ids, labels, segment_ids, cls_ids``, each a list as Python
prints it; ``[CLS] s1 [SEP] [CLS] s2 [SEP] ...``, the segment id of each sentence's
pieces (its [CLS] and [SEP] included) 0, 1, 0, ... in turn, ``cls_ids`` the positions of
the [CLS] tokens, ``labels`` one 0 or 1 per sentence.

With ``format="tfrecords"``, the same rows as its TF folder's BertSumTfRecordsProcessor reads
them (every ``*.tfrecord*`` of a split's folder): ``<split>/bertsum-K.tfrecords``, padded as
the vendor's TF writer (its input/utils.py) pads them, with [PAD]'s id (0): int64 lists of
max_sequence_length ``input_ids``, ``segment_ids`` and ``input_mask`` (1 where input_ids is
[PAD]'s id, the writer's sense, which its reader keeps), and of max_cls_tokens
``cls_indices``, ``labels`` and the float ``cls_weights`` (1 where cls_indices is not [PAD]'s
id: the writer's rule, which also gives the first sentence, at position 0, weight 0); no
meta.dat.
"""

from __future__ import annotations

import csv
import math
import re

from common.data.vendor.text import (check_output_dir, check_positive, claim_output_dir, deal, split_documents,
                                    write_meta_dat)
from common.errors import UserError

COLUMNS = ("input_token_ids", "labels", "segment_ids", "cls_ids")
_WORD = re.compile(r"[a-z]{4,}")


def summary_labels(sentences: list[str]) -> list[int]:
    """1 for the ceil(k/3) sentences sharing the most distinct words with the others, else 0."""
    words = [set(_WORD.findall(s.lower())) for s in sentences]
    shared = [len(w & set().union(*(words[:i] + words[i + 1:]))) for i, w in enumerate(words)]
    chosen = sorted(range(len(sentences)), key=lambda i: (-shared[i], i))[:math.ceil(len(sentences) / 3)]
    return [int(i in chosen) for i in range(len(sentences))]


def article_row(sentence_pieces: list[list[str]], sentences: list[str], vocab_index: dict,
                max_sequence_length: int) -> dict | None:
    """The row of an article: as many of its first sentences as fit whole; None if not even one does."""
    ids, segments, cls_ids, kept = [], [], [], 0
    for pieces in sentence_pieces:
        block = ["[CLS]", *pieces, "[SEP]"]
        if len(ids) + len(block) > max_sequence_length:
            break
        cls_ids.append(len(ids))
        ids += [vocab_index[t] for t in block]
        segments += [kept % 2] * len(block)
        kept += 1
    if kept == 0:
        return None
    return {"input_token_ids": str(ids), "labels": str(summary_labels(sentences[:kept])),
            "segment_ids": str(segments), "cls_ids": str(cls_ids)}


def write_bertsum_tfrecord(path, rows: list[dict], pad_id: int, max_sequence_length: int,
                           max_cls_tokens: int) -> None:
    """``rows`` (as the CSV has them) as the TFRecords of the vendor's TF extractive summarization (module
    docstring)."""
    import ast

    import tensorflow as tf

    def pad(values: list, length: int) -> list:
        return values + [pad_id] * (length - len(values))

    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in rows:
            ids = pad(ast.literal_eval(row["input_token_ids"]), max_sequence_length)
            cls = pad(ast.literal_eval(row["cls_ids"]), max_cls_tokens)
            ints = {"input_ids": ids, "input_mask": [int(i == pad_id) for i in ids],
                    "segment_ids": pad(ast.literal_eval(row["segment_ids"]), max_sequence_length),
                    "cls_indices": cls, "labels": pad(ast.literal_eval(row["labels"]), max_cls_tokens)}
            feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in ints.items()}
            weights = [float(c != pad_id) for c in cls]
            feature["cls_weights"] = tf.train.Feature(float_list=tf.train.FloatList(value=weights))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def prepare_vendor_bert_summarization(output_dir, max_sequence_length: int = 512, sentences_per_article: int = 12,
                                      vocab_size: int = 8192, num_files: int = 1, num_eval_files: int = 1,
                                      eval_fraction: float = 0.2, max_documents: int | None = None,
                                      seed: int = 12345, format: str = "csv", max_cls_tokens: int = 50,
                                      log=print) -> dict:
    """DIR/vocab.txt, DIR/train/ and DIR/valid/ (meta.dat, bertsum-K.csv; format tfrecords: bertsum-K.tfrecords,
    each article's sentences cut to max_cls_tokens); returns the counts."""
    if format not in ("csv", "tfrecords"):
        raise UserError(f"--format {format!r}: choose from csv, tfrecords")
    check_positive(max_cls_tokens=max_cls_tokens)
    if format == "tfrecords":
        sentences_per_article = min(sentences_per_article, max_cls_tokens)
    from common.data.text.corpus import default_corpus
    from common.data.text.tokenizer import train_wordpiece, vocab_in_id_order, write_vocab_txt

    check_positive(num_files=num_files, num_eval_files=num_eval_files, sentences_per_article=sentences_per_article,
                   vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    if max_sequence_length < 4:
        raise UserError(f"--max_sequence_length {max_sequence_length}: must be at least 4 ([CLS] a piece [SEP])")
    check_output_dir(output_dir)
    documents = default_corpus()[:max_documents]
    tokenizer = train_wordpiece(documents, vocab_size, lowercase=True)
    vocab_index = {t: i for i, t in enumerate(vocab_in_id_order(tokenizer))}
    files = {}
    for split, docs in split_documents(documents, eval_fraction, seed, "documents").items():
        rows = []
        for d in docs:
            for k in range(0, len(d), sentences_per_article):
                article = d[k:k + sentences_per_article]
                pieces = [e.tokens for e in tokenizer.encode_batch(article, add_special_tokens=False)]
                row = article_row(pieces, article, vocab_index, max_sequence_length)
                if row:
                    rows.append(row)
        name, count, option = ("valid", num_eval_files, "--num_eval_files") if split == "eval" else \
            ("train", num_files, "--num_files")
        files[name] = deal(rows, count, option, f"{name} articles")

    out = claim_output_dir(output_dir)
    write_vocab_txt(tokenizer, out / "vocab.txt")
    for name, parts in files.items():
        (out / name).mkdir()
        if format == "tfrecords":
            for k, part in enumerate(parts, start=1):
                write_bertsum_tfrecord(out / name / f"bertsum-{k}.tfrecords", part, vocab_index["[PAD]"],
                                       max_sequence_length, max_cls_tokens)
            continue
        for k, part in enumerate(parts, start=1):
            with open(out / name / f"bertsum-{k}.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, quoting=csv.QUOTE_MINIMAL)
                writer.writeheader()
                writer.writerows(part)
        write_meta_dat(out / name, [(f"bertsum-{k}.csv", len(part)) for k, part in enumerate(parts, start=1)])
    counts = {name: sum(map(len, parts)) for name, parts in files.items()}
    log(f"the default corpus: summarization stand-in, {counts['train']:,} train and {counts['valid']:,} valid "
        f"articles in {out}; vocab {len(vocab_index):,}")
    return {"vocab_size": len(vocab_index), **counts}
