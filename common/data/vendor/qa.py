"""A stand-in for SQuAD v1.1 in the CSV layout the vendor's BERT QA folder reads (R1.6).

A runnable stand-in made from the default corpus (the Python documentation's prose), not
the benchmark set. The rule: a context is ``sentences_per_context`` consecutive sentences
of one document; each of its sentences gives a question, the sentence's first
``max(2, ceil(n / 3))`` words, whose answer is that whole sentence in the context (find
where a quoted opening goes on); a sentence of fewer than 3 words asks nothing. A pair that
does not fit ``max_sequence_length`` is left out.

The files, as the vendor's BertQADataProcessor reads them (its write_csv_qa.py writes the
same columns): ``<split>/meta.dat`` (``<file> <rows>``) and ``<split>/squad-K.csv`` with
the header ``unique_id, example_index, doc_span_index, tokens, token_to_orig_map,
token_is_max_context, input_ids, input_mask, segment_ids, start_position, end_position,
is_impossible``; lists and dicts as Python prints them (``[101, 7592]``, ``{5: 0}``),
``input_ids``, ``input_mask`` and ``segment_ids`` padded with 0 to max_sequence_length,
``[CLS] question [SEP] context [SEP]`` with the positions counted in it. The reader takes
the ids, mask, segments and the two positions; the rest is for prediction's answer text.
"""

from __future__ import annotations

import csv
import math

from common.data.vendor.text import (check_output_dir, check_positive, claim_output_dir, deal, split_documents,
                                    write_meta_dat)
from common.errors import UserError

COLUMNS = ("unique_id", "example_index", "doc_span_index", "tokens", "token_to_orig_map", "token_is_max_context",
           "input_ids", "input_mask", "segment_ids", "start_position", "end_position", "is_impossible")
FIRST_UNIQUE_ID = 1000000000  # as the vendor numbers its features
MAX_QUERY_LENGTH = 64  # the vendor's default: longer questions are cut
MIN_WORDS = 3  # a shorter sentence would be its own question


def question_words(sentence_words: list[str]) -> list[str]:
    return sentence_words[:max(2, math.ceil(len(sentence_words) / 3))]


def context_features(sentences: list[str], tokenizer, vocab_index: dict, max_sequence_length: int) -> list[dict]:
    """The features of one context (its sentences), one per sentence that fits; without the numbering."""
    words_of = [s.split() for s in sentences]
    doc_words = [w for ws in words_of for w in ws]
    pieces, orig = [], []  # a context word's WordPiece pieces, and the word each piece comes from
    for i, encoding in enumerate(tokenizer.encode_batch(doc_words, add_special_tokens=False)):
        pieces += encoding.tokens
        orig += [i] * len(encoding.tokens)
    features = []
    first_word = 0
    for words in words_of:
        last_word = first_word + len(words) - 1
        question = tokenizer.encode(" ".join(question_words(words)), add_special_tokens=False).tokens
        tokens = ["[CLS]", *question[:MAX_QUERY_LENGTH], "[SEP]"]
        offset = len(tokens)
        tokens += [*pieces, "[SEP]"]
        segments = [0] * offset + [1] * (len(pieces) + 1)
        fits = len(tokens) <= max_sequence_length and first_word in orig and last_word in orig
        if fits and len(words) >= MIN_WORDS:
            padding = [0] * (max_sequence_length - len(tokens))
            features.append({
                "doc_span_index": 0,  # the context fits whole: one span
                "tokens": str(tokens),
                "token_to_orig_map": str({offset + k: w for k, w in enumerate(orig)}),
                "token_is_max_context": str({offset + k: True for k in range(len(orig))}),
                "input_ids": str([vocab_index[t] for t in tokens] + padding),
                "input_mask": str([1] * len(tokens) + padding),
                "segment_ids": str(segments + padding),
                "start_position": offset + orig.index(first_word),
                "end_position": offset + len(orig) - 1 - orig[::-1].index(last_word),
                "is_impossible": False,
            })
        first_word = last_word + 1
    return features


def prepare_vendor_bert_qa(output_dir, max_sequence_length: int = 384, sentences_per_context: int = 4,
                           vocab_size: int = 8192, num_files: int = 2, num_eval_files: int = 2,
                           eval_fraction: float = 0.2, max_documents: int | None = None, seed: int = 12345,
                           log=print) -> dict:
    """DIR/vocab.txt, DIR/train/ and DIR/dev/ (meta.dat, squad-K.csv); returns the counts."""
    from common.data.text.corpus import default_corpus
    from common.data.text.tokenizer import train_wordpiece, vocab_in_id_order, write_vocab_txt

    check_positive(num_files=num_files, num_eval_files=num_eval_files, sentences_per_context=sentences_per_context,
                   vocab_size=vocab_size)
    if max_documents is not None:
        check_positive(max_documents=max_documents)
    if max_sequence_length < 8:
        raise UserError(f"--max_sequence_length {max_sequence_length}: must be at least 8")
    check_output_dir(output_dir)
    documents = default_corpus()[:max_documents]
    tokenizer = train_wordpiece(documents, vocab_size, lowercase=True)
    vocab_index = {t: i for i, t in enumerate(vocab_in_id_order(tokenizer))}
    files, unique_id = {}, FIRST_UNIQUE_ID
    for split, docs in split_documents(documents, eval_fraction, seed, "documents").items():
        rows = []
        contexts = [d[k:k + sentences_per_context] for d in docs for k in range(0, len(d), sentences_per_context)]
        for example_index, context in enumerate(contexts):
            for feature in context_features(context, tokenizer, vocab_index, max_sequence_length):
                rows.append({"unique_id": unique_id, "example_index": example_index, **feature})
                unique_id += 1
        name, count, option = ("dev", num_eval_files, "--num_eval_files") if split == "eval" else \
            ("train", num_files, "--num_files")
        files[name] = deal(rows, count, option, f"{name} questions")

    out = claim_output_dir(output_dir)
    write_vocab_txt(tokenizer, out / "vocab.txt")
    for name, parts in files.items():
        (out / name).mkdir()
        for k, part in enumerate(parts, start=1):
            with open(out / name / f"squad-{k}.csv", "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, quoting=csv.QUOTE_MINIMAL)
                writer.writeheader()
                writer.writerows(part)
        write_meta_dat(out / name, [(f"squad-{k}.csv", len(part)) for k, part in enumerate(parts, start=1)])
    counts = {name: sum(map(len, parts)) for name, parts in files.items()}
    log(f"the default corpus: QA stand-in, {counts['train']:,} train and {counts['dev']:,} dev questions in {out}; "
        f"vocab {len(vocab_index):,}")
    return {"vocab_size": len(vocab_index), **counts}
