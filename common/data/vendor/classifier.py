"""Stand-ins for GLUE SST-2 and MNLI in the TSV files the vendor's BERT classifier folder reads (R1.6).

Runnable stand-ins made from the default corpus (the Python documentation's prose), not
the benchmark sets: the labels follow a stated rule, so a model can learn them, but the
scores are no GLUE scores. The files are the vendor's exactly (its SST2DataProcessor and
MNLIDataProcessor read them with ``csv.DictReader``, tab-separated, no quoting):

- SST-2: ``train.tsv`` and ``dev.tsv``, header ``sentence<TAB>label``, labels 0 and 1. The
  rule: a sentence's label is which of two pydoc topics it is printed in, the two largest
  distinct topics that ``common.data.text.classification.corpus_topics`` chooses (0 the
  larger), with its split (a fifth of each topic's sentences held out for dev).
- MNLI: ``train.tsv``, ``dev_matched.tsv`` and ``dev_mismatched.tsv``, header
  ``sentence1<TAB>sentence2<TAB>gold_label``, labels entailment, neutral, contradiction.
  The rule, for a premise that is a sentence of a document followed by another one:
  ``entailment`` a hypothesis of the premise's own words (its first ``ceil(n/2)`` words),
  ``neutral`` the next sentence of the same document, ``contradiction`` a sentence of
  another document of the same file; each premise gives one pair, the label taking turns.
  A fifth of the documents is held out, half for dev_matched, half for dev_mismatched,
  whose contradiction hypotheses come from the train documents instead (a different mix,
  as GLUE's mismatched set is another mix of genres).

Every text is one line with no tab (whitespace runs become one space).
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from common.errors import UserError

from common.data.vendor.text import check_output_dir, check_positive, claim_output_dir, split_documents

SST2_COLUMNS = ("sentence", "label")
MNLI_COLUMNS = ("sentence1", "sentence2", "gold_label")
MNLI_LABELS = ("entailment", "neutral", "contradiction")
TASKS = ("sst2", "mnli")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def write_tsv(path: Path, columns: tuple[str, ...], rows: list[tuple]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", quoting=csv.QUOTE_NONE, quotechar=None, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


def sst2_rows() -> dict[str, list[tuple[str, int]]]:
    from common.data.text.classification import corpus_topics

    task = corpus_topics()
    return {split: [(_one_line(text), label) for text, _, label in examples if label in (0, 1)]
            for split, examples in (("train", task.train), ("dev", task.eval))}


def mnli_pairs(documents: list[list[str]], rng: random.Random,
               others: list[list[str]] | None = None) -> list[tuple[str, str, str]]:
    """One (premise, hypothesis, label) for each sentence of ``documents`` that has a next one; a
    contradiction's hypothesis is a sentence of ``others`` if given, else of another of ``documents``."""
    pairs = []
    for d, document in enumerate(documents):
        for i in range(len(document) - 1):
            premise = _one_line(document[i])
            label = MNLI_LABELS[len(pairs) % 3]
            if label == "entailment":
                words = premise.split()
                hypothesis = " ".join(words[:(len(words) + 1) // 2])
            elif label == "neutral":
                hypothesis = _one_line(document[i + 1])
            else:
                pool = others if others is not None else documents[:d] + documents[d + 1:]
                if not pool:
                    raise UserError(f"{len(documents)} document(s) for a file of MNLI pairs: a contradiction "
                                    f"needs another document; give more documents (--max_documents)")
                hypothesis = _one_line(rng.choice(rng.choice(pool)))
            pairs.append((premise, hypothesis, label))
    return pairs


def prepare_vendor_bert_classifier(output_dir, task: str = "sst2", vocab_size: int = 8192,
                                   max_documents: int | None = None, seed: int = 12345, log=print) -> dict:
    """DIR/vocab.txt and DIR/<SST-2 or MNLI>/ with the task's TSV files; returns the rows of each file."""
    from common.data.text.corpus import default_corpus
    from common.data.text.tokenizer import train_wordpiece, write_vocab_txt

    if task not in TASKS:
        raise UserError(f"--task {task!r}: choose from {', '.join(TASKS)}")
    check_positive(vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    check_output_dir(output_dir)
    documents = default_corpus()[:max_documents]
    tokenizer = train_wordpiece(documents, vocab_size, lowercase=True)
    if task == "sst2":
        folder, columns, files = "SST-2", SST2_COLUMNS, sst2_rows()
    else:
        rng = random.Random(seed)
        split = split_documents([d for d in documents if len(d) >= 2], 0.2, seed, "documents of two sentences or more")
        held_out = split["eval"]
        matched, mismatched = held_out[: (len(held_out) + 1) // 2], held_out[(len(held_out) + 1) // 2:]
        folder, columns = "MNLI", MNLI_COLUMNS
        files = {"train": mnli_pairs(split["train"], rng),
                 "dev_matched": mnli_pairs(matched, rng),
                 "dev_mismatched": mnli_pairs(mismatched, rng, others=split["train"])}
    for name, rows in files.items():
        if not rows:
            raise UserError(f"{name}.tsv would be empty: give more documents (--max_documents)")

    out = claim_output_dir(output_dir)
    write_vocab_txt(tokenizer, out / "vocab.txt")
    (out / folder).mkdir()
    for name, rows in files.items():
        write_tsv(out / folder / f"{name}.tsv", columns, rows)
    counts = {name: len(rows) for name, rows in files.items()}
    log(f"the default corpus: {task} stand-in, {', '.join(f'{n}.tsv {c:,} rows' for n, c in counts.items())} "
        f"in {out / folder}; vocab {tokenizer.get_vocab_size():,}")
    return {"vocab_size": tokenizer.get_vocab_size(), "data_dir": str(out / folder), **counts}
