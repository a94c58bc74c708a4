"""A stand-in for a NER set (BC5CDR-chem) in the CSV layout the vendor's BERT token classifier reads (R1.6).

A runnable stand-in made from the default corpus (the Python documentation's prose), not
the benchmark set. The rule: a word is an entity when, as printed (case-sensitive), it is
the name of a Python builtin (``dir(builtins)`` without the ``_`` names: ``len``,
``ValueError``, ``None``, ``object``); the first word of a run of such words is ``B``, the
others ``I``, every other word ``O``. Words are the uncased WordPiece tokenizer's words
(punctuation split off); a word's first piece carries its label, its other pieces ``X``.

The files, as the vendor's BertTokenClassifierDataProcessor reads them:

- ``<split>/meta.dat``: ``<file> <rows>`` a line, the file joined to the split's folder;
- ``<split>/ner-K.csv``: a header ``tokens,labels``; ``tokens`` the pieces of one sentence,
  ``[CLS] ... [SEP]``, separated by spaces, ``labels`` as many labels, ``[CLS]`` and
  ``[SEP]`` on the special tokens, at most max_sequence_length of each;
- ``label2id.json``: ``{"[PAD]": 0, "B": 1, "I": 2, "O": 3, "X": 4, "[CLS]": 5, "[SEP]": 6}``,
  the vendor's label list in its order (its configs: num_classes 7).

With ``format="tfrecords"``, the same rows as its TF token classifier's NerDataProcessor reads
them (every ``*.tfrecord*`` of a split's folder): ``<split>/ner-K.tfrecords``, each example
four int64 lists of max_sequence_length, as the vendor's write_tfrecords_ner.py pads them:
``input_ids`` (the pieces' ids in vocab.txt, then [PAD]'s), ``input_mask`` (1 on a piece),
``segment_ids`` (0) and ``label_ids`` (label2id.json's, then [PAD]'s 0); no meta.dat.
"""

from __future__ import annotations

import builtins
import csv
import json

from common.data.vendor.text import (check_output_dir, check_positive, claim_output_dir, deal, split_documents,
                                    write_meta_dat)
from common.errors import UserError

LABELS = ("[PAD]", "B", "I", "O", "X", "[CLS]", "[SEP]")
COLUMNS = ("tokens", "labels")
ENTITY_WORDS = frozenset(w for w in dir(builtins) if not w.startswith("_"))


def word_labels(words: list[str]) -> list[str]:
    labels = []
    for word in words:
        if word in ENTITY_WORDS:
            labels.append("I" if labels and labels[-1] in ("B", "I") else "B")
        else:
            labels.append("O")
    return labels


def sentence_row(encoding, sentence: str, max_sequence_length: int) -> dict[str, str] | None:
    """The row of one sentence's encoding (no special tokens): its pieces and labels, or None if empty."""
    pieces, piece_labels = [], []
    word_ids = encoding.word_ids
    words = {}
    for w, (start, end) in zip(word_ids, encoding.offsets):
        if w is not None:
            s, e = words.get(w, (start, end))
            words[w] = (min(s, start), max(e, end))
    order = sorted(words)
    labels_of = dict(zip(order, word_labels([sentence[s:e] for s, e in (words[w] for w in order)])))
    previous = None
    for token, w in zip(encoding.tokens, word_ids):
        pieces.append(token)
        piece_labels.append(labels_of[w] if w != previous else "X")
        previous = w
    cut = max_sequence_length - 2  # room for [CLS] and [SEP]
    while 0 < cut < len(pieces) and piece_labels[cut] == "X":
        cut -= 1  # a long sentence ends at a whole word: no word is cut into a shorter one
    pieces, piece_labels = pieces[:cut], piece_labels[:cut]
    if not pieces:
        return None
    return {"tokens": " ".join(["[CLS]", *pieces, "[SEP]"]), "labels": " ".join(["[CLS]", *piece_labels, "[SEP]"])}


def write_ner_tfrecord(path, rows: list[dict[str, str]], vocab: dict[str, int], max_sequence_length: int) -> None:
    """``rows`` (as the CSV has them) as TFRecords of the vendor's TF token classifier, padded to
    max_sequence_length with [PAD]'s id and label."""
    import tensorflow as tf

    label_id = {label: i for i, label in enumerate(LABELS)}
    with tf.io.TFRecordWriter(str(path)) as writer:
        for row in rows:
            pieces, labels = row["tokens"].split(" "), row["labels"].split(" ")
            pad = max_sequence_length - len(pieces)
            features = {
                "input_ids": [vocab[p] for p in pieces] + [vocab["[PAD]"]] * pad,
                "input_mask": [1] * len(pieces) + [0] * pad,
                "segment_ids": [0] * max_sequence_length,
                "label_ids": [label_id[label] for label in labels] + [label_id["[PAD]"]] * pad,
            }
            feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=v)) for k, v in features.items()}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def prepare_vendor_bert_ner(output_dir, max_sequence_length: int = 128, vocab_size: int = 8192, num_files: int = 1,
                            num_eval_files: int = 1, eval_fraction: float = 0.2, max_documents: int | None = None,
                            seed: int = 12345, format: str = "csv", log=print) -> dict:
    """DIR/vocab.txt, DIR/train/ (label2id.json, meta.dat, ner-K.csv) and DIR/dev/ (meta.dat, ner-K.csv); with
    format tfrecords, DIR/train/ (label2id.json, ner-K.tfrecords) and DIR/dev/ (ner-K.tfrecords)."""
    if format not in ("csv", "tfrecords"):
        raise UserError(f"--format {format!r}: choose from csv, tfrecords")
    from common.data.text.corpus import default_corpus
    from common.data.text.tokenizer import train_wordpiece, write_vocab_txt

    check_positive(num_files=num_files, num_eval_files=num_eval_files, vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    if max_sequence_length < 3:
        raise UserError(f"--max_sequence_length {max_sequence_length}: must be at least 3 ([CLS] a piece [SEP])")
    check_output_dir(output_dir)
    documents = default_corpus()[:max_documents]
    tokenizer = train_wordpiece(documents, vocab_size, lowercase=True)
    files = {}
    for split, docs in split_documents(documents, eval_fraction, seed, "documents").items():
        sentences = [" ".join(s.split()) for d in docs for s in d]
        encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
        rows = [r for r in (sentence_row(e, s, max_sequence_length) for e, s in zip(encodings, sentences)) if r]
        name, count = ("dev", num_eval_files) if split == "eval" else ("train", num_files)
        files[name] = deal(rows, count, "--num_eval_files" if split == "eval" else "--num_files", f"{name} sentences")

    out = claim_output_dir(output_dir)
    write_vocab_txt(tokenizer, out / "vocab.txt")
    for name, parts in files.items():
        (out / name).mkdir()
        if format == "tfrecords":
            for k, part in enumerate(parts, start=1):
                write_ner_tfrecord(out / name / f"ner-{k}.tfrecords", part, tokenizer.get_vocab(), max_sequence_length)
            continue
        for k, part in enumerate(parts, start=1):
            with open(out / name / f"ner-{k}.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, quoting=csv.QUOTE_MINIMAL)
                writer.writeheader()
                writer.writerows(part)
        write_meta_dat(out / name, [(f"ner-{k}.csv", len(part)) for k, part in enumerate(parts, start=1)])
    (out / "train" / "label2id.json").write_text(json.dumps({label: i for i, label in enumerate(LABELS)}))
    counts = {name: sum(map(len, parts)) for name, parts in files.items()}
    log(f"the default corpus: NER stand-in, {counts['train']:,} train and {counts['dev']:,} dev sentences in {out}; "
        f"vocab {tokenizer.get_vocab_size():,}")
    return {"vocab_size": tokenizer.get_vocab_size(), **counts}
