"""The vendor's BERT CSV, T5 and Transformer text layouts and GLUE TSV stand-ins (common/data/vendor/,
datasets/prepare_vendor_*.py).

Each layout is read back by a small reader written here from the vendor's documented
contract (meta.dat lines, CSV columns, one example a line of space-separated pieces), not
by the writer's own code."""

import ast
import builtins
import csv
import importlib.util
import json
import os
from pathlib import Path

import pytest

from common.data.vendor.classifier import prepare_vendor_bert_classifier
from common.data.vendor.ner import prepare_vendor_bert_ner, word_labels
from common.data.vendor.qa import prepare_vendor_bert_qa
from common.data.vendor.summarization import prepare_vendor_bert_summarization, summary_labels
from common.data.vendor.text import prepare_vendor_bert, prepare_vendor_t5, prepare_vendor_transformer
from common.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TINY = {"vocab_size": 300, "max_documents": 12, "log": lambda *_: None}


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "datasets" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _meta(data_dir: Path) -> list[list[str]]:
    """meta.dat as the vendor reads it: each line split on whitespace."""
    return [line.split() for line in (data_dir / "meta.dat").read_text().splitlines()]


def _vocab(path: Path) -> list[str]:
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def _pieces_lines(path) -> list[list[str]]:
    """A text file as the vendor's T5 and Transformer readers take it: csv rows on "\\n", pieces split on spaces."""
    with open(path, newline="") as f:
        return ["".join(row).split() for row in csv.reader((x.replace("\0", "") for x in f), delimiter="\n")]


def test_bert_csv_is_the_vendors_columns_meta_and_vocab(tmp_path):
    msl = 32
    made = prepare_vendor_bert(tmp_path / "d", max_seq_length=msl, num_files=2, num_eval_files=1, dupe_factor=1, **TINY)
    vocab = _vocab(tmp_path / "d" / "vocab.txt")
    assert len(vocab) == made["vocab_size"] and {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} <= set(vocab)
    labels = set()
    for split, files in (("train", 2), ("eval", 1)):
        data_dir = tmp_path / "d" / split
        meta = _meta(data_dir)
        assert len(meta) == files and all(len(line) == 2 for line in meta)
        total = 0
        for name, count in meta:
            with open(data_dir / name, newline="") as f:  # the reader joins the name to data_dir
                reader = csv.DictReader(f)
                rows = list(reader)
            assert reader.fieldnames == ["tokens", "segment_ids", "is_random_next"]
            assert len(rows) == int(count) > 0
            total += len(rows)
            for row in rows:
                tokens = ast.literal_eval(row["tokens"])  # the vendor evals it
                segments = list(map(int, row["segment_ids"].strip("[]").split(", ")))  # as the vendor parses it
                assert len(tokens) <= msl and len(segments) == len(tokens)
                assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]" and tokens.count("[SEP]") == 2
                first_sep = tokens.index("[SEP]")
                assert segments == [0] * (first_sep + 1) + [1] * (len(tokens) - first_sep - 1)
                assert set(tokens) <= set(vocab) and "[MASK]" not in tokens  # unmasked: the reader masks
                labels.add(int(row["is_random_next"]))
        assert total == made[split]
    assert labels == {0, 1}


def test_t5_lines_are_pieces_of_the_vocab_counted_in_meta(tmp_path):
    made = prepare_vendor_t5(tmp_path / "d", num_files=2, num_eval_files=2, sentences_per_line=3, **TINY)
    vocab = _vocab(tmp_path / "d" / "vocab.txt")
    assert vocab[:4] == ["<pad>", "</s>", "<unk>", "<s>"] and len(vocab) == made["vocab_size"]
    for split in ("train", "eval"):
        meta, total = _meta(tmp_path / "d" / split), 0
        assert len(meta) == 2
        for name, count in meta:
            lines = _pieces_lines(tmp_path / "d" / split / name)
            assert len(lines) == int(count) > 0 and all(lines)
            assert {p for line in lines for p in line} <= set(vocab)
            total += len(lines)
        assert total == made[split]


def test_transformer_pairs_are_aligned_and_meta_names_them_absolutely(tmp_path):
    made = prepare_vendor_transformer(tmp_path / "d", num_files=2, num_eval_files=1, **TINY)
    vocab = set(_vocab(tmp_path / "d" / "vocab.txt"))
    assert {"<pad>", "<s>", "</s>", "<unk>"} <= vocab
    reversed_pairs = 0
    for split, files in (("train", 2), ("eval", 1)):
        meta, total = _meta(tmp_path / "d" / split / "src"), 0
        assert len(meta) == files and all(len(line) == 3 for line in meta)
        for src, tgt, count in meta:
            assert os.path.isabs(src) and os.path.isabs(tgt)  # opened as written, from any directory
            sources, targets = _pieces_lines(src), _pieces_lines(tgt)
            assert len(sources) == len(targets) == int(count) > 0
            for s, t in zip(sources, targets):
                assert set(s) <= vocab and set(t) <= vocab
                words = "".join(s).replace("Ġ", " ").split()
                if all(ord(c) < 128 for c in "".join(words)):  # byte-level BPE spells ASCII as itself
                    assert "".join(t).replace("Ġ", " ").split() == words[::-1]
                    reversed_pairs += 1
            total += len(sources)
        assert total == made[split]
    assert reversed_pairs > 0


def _glue_tsv(path) -> tuple[list[str], list[dict]]:
    """A GLUE file as the vendor's classifier reads it: tab-separated, a header, no quoting."""
    with open(path) as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        rows = list(reader)
    return reader.fieldnames, rows


def test_sst2_stand_in_is_glue_tsv_with_two_labels(tmp_path):
    made = prepare_vendor_bert_classifier(tmp_path / "d", task="sst2", **TINY)
    assert made["data_dir"] == str(tmp_path / "d" / "SST-2")
    assert sorted(os.listdir(made["data_dir"])) == ["dev.tsv", "train.tsv"]
    for name in ("train", "dev"):
        columns, rows = _glue_tsv(Path(made["data_dir"]) / f"{name}.tsv")
        assert columns == ["sentence", "label"] and len(rows) == made[name] > 0
        assert {row["label"] for row in rows} == {"0", "1"}  # the vendor reads int(label)
        assert all(row["sentence"] and None not in row for row in rows)  # no stray tab made an extra field
    train = {row["sentence"] for row in _glue_tsv(Path(made["data_dir"]) / "train.tsv")[1]}
    assert not train & {row["sentence"] for row in _glue_tsv(Path(made["data_dir"]) / "dev.tsv")[1]}
    assert {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"} <= set(_vocab(tmp_path / "d" / "vocab.txt"))


def test_mnli_stand_in_is_glue_tsv_labelled_by_its_rule(tmp_path):
    made = prepare_vendor_bert_classifier(tmp_path / "d", task="mnli", **{**TINY, "max_documents": 30})
    assert sorted(os.listdir(made["data_dir"])) == ["dev_matched.tsv", "dev_mismatched.tsv", "train.tsv"]
    for name in ("train", "dev_matched", "dev_mismatched"):
        columns, rows = _glue_tsv(Path(made["data_dir"]) / f"{name}.tsv")
        assert columns == ["sentence1", "sentence2", "gold_label"] and len(rows) == made[name] > 0
        assert {row["gold_label"] for row in rows} == {"entailment", "neutral", "contradiction"}
        for row in rows:
            assert None not in row and row["sentence1"] and row["sentence2"]
            words = row["sentence1"].split()
            if row["gold_label"] == "entailment":
                assert row["sentence2"] == " ".join(words[:(len(words) + 1) // 2])


def test_ner_stand_in_is_the_vendors_csv_labelled_by_its_rule(tmp_path):
    msl = 24
    made = prepare_vendor_bert_ner(tmp_path / "d", max_sequence_length=msl, num_files=2,
                                   **{**TINY, "max_documents": 20})
    label_map = json.loads((tmp_path / "d" / "train" / "label2id.json").read_text())
    assert label_map == {"[PAD]": 0, "B": 1, "I": 2, "O": 3, "X": 4, "[CLS]": 5, "[SEP]": 6}
    vocab = set(_vocab(tmp_path / "d" / "vocab.txt"))
    builtin_names = {n.lower() for n in dir(builtins) if not n.startswith("_")}
    seen = set()
    for split, files in (("train", 2), ("dev", 1)):
        meta, total = _meta(tmp_path / "d" / split), 0
        assert len(meta) == files
        for name, count in meta:
            with open(tmp_path / "d" / split / name, newline="") as f:
                reader = csv.DictReader(f, delimiter=",", quoting=csv.QUOTE_MINIMAL)  # as the vendor reads it
                rows = list(reader)
            assert reader.fieldnames == ["tokens", "labels"] and len(rows) == int(count) > 0
            for row in rows:
                tokens, labels = row["tokens"].split(), row["labels"].split()
                assert len(tokens) == len(labels) <= msl and set(tokens) <= vocab
                assert tokens[0] == labels[0] == "[CLS]" and tokens[-1] == labels[-1] == "[SEP]"
                assert set(labels[1:-1]) <= {"B", "I", "O", "X"}
                words, first_labels = [], []  # WordPiece: a word's later pieces start with ##
                for token, label in zip(tokens[1:-1], labels[1:-1]):
                    assert (label == "X") == token.startswith("##")
                    if label == "X":
                        words[-1] += token[2:]
                    else:
                        words.append(token)
                        first_labels.append(label)
                for k, (word, label) in enumerate(zip(words, first_labels)):
                    if label in ("B", "I"):
                        assert word in builtin_names  # uncased here; the rule reads the printed case
                    if label == "I":
                        assert first_labels[k - 1] in ("B", "I")
                seen.update(labels)
            total += len(rows)
        assert total == made[split]
    assert {"B", "O", "X"} <= seen
    # a run of builtin names is one entity; the rule reads the word as printed
    assert word_labels(["call", "len", "None", "on", "object", "Len"]) == ["O", "B", "I", "O", "B", "O"]


def _int_list(text: str) -> list[int]:
    """As the vendor's convert_str_to_int_list: "[1, 5, 7]" -> [1, 5, 7]."""
    assert text.startswith("[") and text.endswith("]")
    return [int(x.strip()) for x in text.strip("[]").split(",")]


def test_qa_stand_in_is_the_vendors_squad_csv_answered_by_its_rule(tmp_path):
    msl = 96
    made = prepare_vendor_bert_qa(tmp_path / "d", max_sequence_length=msl, sentences_per_context=2,
                                  num_files=2, num_eval_files=1, **{**TINY, "max_documents": 20})
    vocab = _vocab(tmp_path / "d" / "vocab.txt")
    for split, files in (("train", 2), ("dev", 1)):
        meta, total = _meta(tmp_path / "d" / split), 0
        assert len(meta) == files
        for name, count in meta:
            with open(tmp_path / "d" / split / name, newline="") as f:
                reader = csv.DictReader(f, delimiter=",", quoting=csv.QUOTE_MINIMAL)
                rows = list(reader)
            assert reader.fieldnames == ["unique_id", "example_index", "doc_span_index", "tokens", "token_to_orig_map",
                                         "token_is_max_context", "input_ids", "input_mask", "segment_ids",
                                         "start_position", "end_position", "is_impossible"]
            assert len(rows) == int(count) > 0
            for row in rows:
                ids, mask, segments = (_int_list(row[k]) for k in ("input_ids", "input_mask", "segment_ids"))
                tokens = ast.literal_eval(row["tokens"])
                n = len(tokens)
                assert len(ids) == len(mask) == len(segments) == msl and mask == [1] * n + [0] * (msl - n)
                assert ids[:n] == [vocab.index(t) for t in tokens] and ids[n:] == [0] * (msl - n)
                sep = tokens.index("[SEP]")
                assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
                assert segments[:n] == [0] * (sep + 1) + [1] * (n - sep - 1)
                start, end = int(row["start_position"]), int(row["end_position"])
                assert sep < start <= end < n - 1 and row["is_impossible"] == "False"
                orig = ast.literal_eval(row["token_to_orig_map"])
                assert sorted(orig) == list(range(sep + 1, n - 1))
                # the rule: the question is the opening of the answer sentence
                question, answer = tokens[1:sep], tokens[start:end + 1]
                assert answer[:len(question)] == question and len(answer) > len(question)
                # ... and ends where its last word ends (a word's later pieces start with ##)
                assert not tokens[end + 1].startswith("##") and orig.get(end + 1) != orig[end]
            total += len(rows)
        assert total == made[split]


def test_summarization_stand_in_is_the_vendors_bertsum_csv(tmp_path):
    msl = 64
    made = prepare_vendor_bert_summarization(tmp_path / "d", max_sequence_length=msl, sentences_per_article=4,
                                             num_files=2, num_eval_files=1, **TINY)
    vocab = _vocab(tmp_path / "d" / "vocab.txt")
    cls_id, sep_id = vocab.index("[CLS]"), vocab.index("[SEP]")
    for split, files in (("train", 2), ("valid", 1)):
        meta, total = _meta(tmp_path / "d" / split), 0
        assert len(meta) == files
        for name, count in meta:
            with open(tmp_path / "d" / split / name, newline="") as f:
                reader = csv.DictReader(f, delimiter=",", quoting=csv.QUOTE_MINIMAL)
                rows = list(reader)
            assert reader.fieldnames == ["input_token_ids", "labels", "segment_ids", "cls_ids"]
            assert len(rows) == int(count) > 0
            for row in rows:
                # the vendor takes the values in column order, each by convert_str_to_int_list
                ids, labels, segments, cls_ids = (_int_list(v) for v in row.values())
                assert len(ids) == len(segments) <= msl and ids[-1] == sep_id
                assert cls_ids == [i for i, t in enumerate(ids) if t == cls_id] and cls_ids[0] == 0
                assert len(labels) == len(cls_ids) <= 4 and set(labels) <= {0, 1}
                assert sum(labels) == -(-len(labels) // 3)  # ceil(k / 3) sentences in the summary
                ends = cls_ids[1:] + [len(ids)]
                for k, (start, end) in enumerate(zip(cls_ids, ends)):
                    assert ids[end - 1] == sep_id and segments[start:end] == [k % 2] * (end - start)
            total += len(rows)
        assert total == made[split]
    # the rule: the most shared words first; a tie goes to the earlier sentence
    assert summary_labels(["Names bind objects.", "Objects have names.", "Spam eggs.", "Other eggs."]) == [1, 1, 0, 0]


@pytest.mark.parametrize("name", ["prepare_vendor_bert", "prepare_vendor_t5", "prepare_vendor_transformer",
                                  "prepare_vendor_bert_classifier", "prepare_vendor_bert_ner",
                                  "prepare_vendor_bert_qa", "prepare_vendor_bert_summarization"])
def test_a_non_empty_output_dir_is_refused_and_kept(tmp_path, capsys, name):
    out = tmp_path / "d"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert _script(name).main(["--output_dir", str(out), "--max_documents", "4", "--vocab_size", "300"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --output_dir {out}: not empty; give a new or empty folder (nothing is overwritten)\n"
    assert [p.name for p in out.iterdir()] == ["keep.txt"] and (out / "keep.txt").read_text() == "mine"


def test_bad_sizes_are_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "d"
    assert _script("prepare_vendor_bert").main(["--output_dir", str(out), "--num_files", "0"]) == 2
    assert capsys.readouterr().err == "error: --num_files 0: must be at least 1\n"
    with pytest.raises(UserError, match=r"^\d+ eval lines cannot fill --num_eval_files 50; lower it or give more "):
        prepare_vendor_t5(out, num_eval_files=50, **TINY)
    assert _script("prepare_vendor_bert_classifier").main(["--output_dir", str(out), "--task", "qnli"]) == 2
    assert capsys.readouterr().err == "error: --task 'qnli': choose from sst2, mnli\n"
    with pytest.raises(UserError, match=r"^--output_dir .*: is a file, not a folder$"):
        (tmp_path / "f").write_text("x")
        prepare_vendor_transformer(tmp_path / "f", **TINY)
    assert not out.exists()
