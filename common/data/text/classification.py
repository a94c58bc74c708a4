"""Sequence-classification data for fine-tuning BERT: the tasks, and their examples as arrays.

A task is a ``ClassificationTask``: its classes and its train and eval examples, each
``(text_a, text_b or None, label)``. ``load_task(task, data_dir)`` makes one of:

- ``corpus_topics`` (the default; no download): which pydoc topic of the default corpus
  (``corpus.default_corpus``) a sentence comes from, among the ``NUM_TOPICS`` largest
  topics that are not copies of a larger one (pydoc's ``compound`` holds the text of
  ``if``, ``while`` ... again; ``specialnames`` that of ``customization``). The labels are
  true: the topic the sentence is printed in. A sentence printed in two of the chosen
  topics is dropped, each other one is an example once. The split is by sentence: 20 % of
  each topic's sentences, drawn with a fixed seed, are held out for eval, so no eval
  sentence is in train. (The pretraining examples are made from the whole corpus without
  its labels, as BERT's pretraining text may hold a task's text.) The topics are those of
  the running CPython, so the counts change slightly between Python versions;
  ``summary()`` states them and the majority-class rate a classifier has to beat.
- ``sst2``: GLUE SST-2, ``data_dir`` holding ``train.tsv`` and ``dev.tsv`` (header
  ``sentence<TAB>label``, labels 0 = negative, 1 = positive).
- ``mnli``: GLUE MNLI, ``data_dir`` holding ``train.tsv`` and ``dev_matched.tsv``
  (columns ``sentence1``, ``sentence2``, ``gold_label``; the others are ignored).

GLUE's TSV files are read as Google's run_classifier.py reads them: tab-separated, no
quoting (MNLI's sentences hold quote characters). Bad input is one ``UserError`` line
naming the file and line: a missing file, an empty file, a missing column, a row with
another number of fields than the header, an unknown label.

``encode_pairs(examples, tokenizer, max_seq_length)`` turns examples into BERT's inputs as
run_classifier.py's ``convert_single_example`` does: ``[CLS] a [SEP]`` or ``[CLS] a [SEP]
b [SEP]``, the longer text cut from its end first when the pair does not fit, zero padding.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from pathlib import Path

import numpy as np

from common.errors import UserError

TASKS = ("corpus_topics", "sst2", "mnli")
NUM_TOPICS = 4  # the classes of corpus_topics
EVAL_FRACTION = 0.2  # of each topic's sentences, held out
SEED = 12345

Example = tuple[str, str | None, int]  # (text_a, text_b or None, label)

# GLUE task -> ((text_a, text_b, label) columns, the labels as written, their names, train file, eval file)
_GLUE = {
    "sst2": (("sentence", None, "label"), ("0", "1"), ("negative", "positive"), "train.tsv", "dev.tsv"),
    "mnli": (("sentence1", "sentence2", "gold_label"), ("entailment", "neutral", "contradiction"),
             ("entailment", "neutral", "contradiction"), "train.tsv", "dev_matched.tsv"),
}


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
    name: str
    num_classes: int
    label_names: tuple[str, ...]
    train: list[Example]
    eval: list[Example]

    def majority_class_rate(self) -> float:
        """Eval accuracy of always answering train's most frequent class: the bar to beat."""
        majority = collections.Counter(label for _, _, label in self.train).most_common(1)[0][0]
        return sum(label == majority for _, _, label in self.eval) / len(self.eval)

    def summary(self) -> str:
        """One line: the classes, the example counts and the majority-class rate."""
        majority = collections.Counter(label for _, _, label in self.train).most_common(1)[0][0]
        return (f"{self.name}: {self.num_classes} classes ({', '.join(self.label_names)}), {len(self.train)} train "
                f"and {len(self.eval)} eval examples; always answering {self.label_names[majority]!r} (train's "
                f"most frequent) scores {100 * self.majority_class_rate():.1f}% on eval")


def load_task(task: str, data_dir: str | None) -> ClassificationTask:
    """The task named ``task`` (one of TASKS); ``data_dir`` is the GLUE task's folder (unused
    by corpus_topics)."""
    if task == "corpus_topics":
        return corpus_topics()
    if task not in TASKS:
        raise UserError(f"classifier task {task!r}: unknown; choose from {', '.join(TASKS)}")
    if not data_dir:
        raise UserError(f"classifier task {task}: needs data_dir, the folder of GLUE's {task.upper()} TSV files")
    folder = Path(data_dir)
    if not folder.is_dir():
        raise UserError(f"{folder}: no such folder (the GLUE {task.upper()} data of classifier task {task})")
    columns, label_texts, label_names, train_file, eval_file = _GLUE[task]
    labels = {text: i for i, text in enumerate(label_texts)}
    return ClassificationTask(task, len(label_names), label_names, _read_tsv(folder / train_file, columns, labels),
                              _read_tsv(folder / eval_file, columns, labels))


# --- corpus_topics ------------------------------------------------------------------------

def corpus_topics() -> ClassificationTask:
    """Which of the NUM_TOPICS largest pydoc topics a sentence comes from (see the module doc)."""
    from pydoc_data.topics import topics  # ships with CPython, as the default corpus

    from common.data.text.corpus import topic_sentences

    documents = {name: list(dict.fromkeys(topic_sentences(topics[name]))) for name in sorted(topics)}
    printed_in = collections.defaultdict(set)
    for name, sentences in documents.items():
        for sentence in sentences:
            printed_in[sentence].add(name)
    # the largest topics first; one that is mostly a copy of a chosen one is not a class of its own
    chosen: list[str] = []
    for name in sorted(documents, key=lambda n: (-len(documents[n]), n)):
        own = [s for s in documents[name] if not printed_in[s] & set(chosen)]
        if len(own) >= len(documents[name]) / 2:
            chosen.append(name)
        if len(chosen) == NUM_TOPICS:
            break
    rng = random.Random(SEED)
    train, eval_ = [], []
    for label, name in enumerate(chosen):
        sentences = [s for s in documents[name] if len(printed_in[s] & set(chosen)) == 1]
        rng.shuffle(sentences)
        held_out = round(len(sentences) * EVAL_FRACTION)
        eval_ += [(s, None, label) for s in sentences[:held_out]]
        train += [(s, None, label) for s in sentences[held_out:]]
    rng.shuffle(train)
    rng.shuffle(eval_)
    return ClassificationTask("corpus_topics", len(chosen), tuple(chosen), train, eval_)


# --- GLUE TSV -----------------------------------------------------------------------------

def _read_tsv(path: Path, columns: tuple[str, str | None, str], labels: dict[str, int]) -> list[Example]:
    """Examples of a GLUE TSV file with a header; ``columns`` names text_a, text_b (None: no
    second text) and the label's columns; ``labels`` maps a label's text to its index."""
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is not text
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    if not numbered:
        raise UserError(f"{path}: empty file (expected a header with {', '.join(c for c in columns if c)})")
    header_line, header = numbered[0][0], numbered[0][1].split("\t")
    index = {}
    for column in columns:
        if column is None:
            continue
        if column not in header:
            raise UserError(f"{path}:{header_line}: no column {column!r} in the header (it has "
                            f"{', '.join(header)})")
        index[column] = header.index(column)
    text_a, text_b, label = columns
    examples = []
    for number, line in numbered[1:]:
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{number}: {len(fields)} tab-separated fields, the header has {len(header)}")
        value = fields[index[label]].strip()
        if value not in labels:
            raise UserError(f"{path}:{number}: unknown label {value!r} (expected one of {', '.join(labels)})")
        examples.append((fields[index[text_a]], fields[index[text_b]] if text_b else None, labels[value]))
    if not examples:
        raise UserError(f"{path}: empty file (a header and no example)")
    return examples


# --- BERT's inputs ------------------------------------------------------------------------

def _truncate_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
    """Google's _truncate_seq_pair: drop a token from the end of the longer text until the
    pair fits (of two equal ones, from b), so that a short text keeps all its tokens."""
    while len(tokens_a) + len(tokens_b) > max_length:
        (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def encode_pairs(examples, tokenizer, max_seq_length: int) -> dict[str, np.ndarray]:
    """BERT's inputs of ``examples``: ``input_ids``, ``input_mask`` and ``segment_ids`` int32
    [N, max_seq_length] (``[CLS] a [SEP] b [SEP]``, segment 1 from b on, zero padding), and
    ``labels`` int32 [N]. ``tokenizer``: a BERT tokenizer of ``tokenizers`` (``tokenizer.py``)."""
    from common.data.text.tokenizer import CLS, SEP

    cls, sep = tokenizer.token_to_id(CLS), tokenizer.token_to_id(SEP)
    if cls is None or sep is None:
        raise UserError(f"the tokenizer lacks {CLS} or {SEP}, which BERT's inputs need")
    examples = list(examples)
    pairs = any(b is not None for _, b, _ in examples)
    if max_seq_length < (3 if pairs else 2):
        raise UserError(f"max_sequence_length {max_seq_length}: too short for [CLS] a [SEP]"
                        + (" b [SEP]" if pairs else ""))
    def encode(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    tokens_a = encode([a for a, _, _ in examples])
    tokens_b = iter(encode([b for _, b, _ in examples if b is not None]))
    n = len(examples)
    arrays = {key: np.zeros((n, max_seq_length), np.int32) for key in ("input_ids", "input_mask", "segment_ids")}
    arrays["labels"] = np.array([label for _, _, label in examples], np.int32).reshape(n)
    for row, ((_, b, _), a) in enumerate(zip(examples, tokens_a)):
        if b is None:
            a = a[:max_seq_length - 2]
            ids, segments = [cls, *a, sep], [0] * (len(a) + 2)
        else:
            b = next(tokens_b)
            _truncate_pair(a, b, max_seq_length - 3)
            ids, segments = [cls, *a, sep, *b, sep], [0] * (len(a) + 2) + [1] * (len(b) + 1)
        arrays["input_ids"][row, :len(ids)] = ids
        arrays["input_mask"][row, :len(ids)] = 1
        arrays["segment_ids"][row, :len(ids)] = segments
    return arrays
