"""common/data/text/classification.py: the classification tasks (the default one from the
default corpus, GLUE's SST-2 and MNLI read from generated TSV files) and BERT's inputs."""

import collections

import numpy as np
import pytest

from common.data.text.classification import ClassificationTask, encode_pairs, load_task
from common.data.text.corpus import topic_sentences
from common.errors import UserError

WORDS = ["the", "cat", "sat", "on", "mat", "a", "dog", "ran", "far", "away", "##s"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A vocab whose ids are known: the five special tokens 0..4, then WORDS from 5."""
    tok = pytest.importorskip("common.data.text.tokenizer", reason="needs the tokenizers package")
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("".join(t + "\n" for t in [*tok.BERT_SPECIAL_TOKENS, *WORDS]))
    return tok.read_vocab_txt(path)


def ids(text):
    return [WORDS.index(w) + 5 for w in text.split()]


CLS, SEP = 2, 3


# --- the default task -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def topics_task():
    return load_task("corpus_topics", None)


def test_default_task_has_true_labels_and_held_out_sentences(topics_task):
    from pydoc_data.topics import topics

    task = topics_task
    assert isinstance(task, ClassificationTask) and task.name == "corpus_topics"
    assert task.num_classes == len(task.label_names) == 4
    assert len(task.train) > 600 and len(task.eval) > 150
    documents = {name: set(topic_sentences(topics[name])) for name in task.label_names}
    for text_a, text_b, label in task.train + task.eval:
        assert text_b is None
        # the label is the topic the sentence is printed in, and in no other class's topic
        assert [name for name in task.label_names if text_a in documents[name]] == [task.label_names[label]]
    train_sentences = {a for a, _, _ in task.train}
    assert len(train_sentences) == len(task.train)  # each sentence once
    assert not train_sentences & {a for a, _, _ in task.eval}  # held out
    counts = collections.Counter(label for _, _, label in task.eval)
    assert sorted(counts) == [0, 1, 2, 3]  # every class in eval, in proportion (20 % of each)
    for label, n in counts.items():
        in_train = sum(1 for _, _, l in task.train if l == label)
        assert abs(n / (n + in_train) - 0.2) < 0.01


def test_default_task_is_deterministic_and_states_its_majority_rate(topics_task):
    again = load_task("corpus_topics", "ignored/by/this/task")
    assert again == topics_task
    majority = collections.Counter(l for _, _, l in topics_task.train).most_common(1)[0][0]
    rate = sum(l == majority for _, _, l in topics_task.eval) / len(topics_task.eval)
    assert topics_task.majority_class_rate() == rate
    assert 0.25 < rate < 0.5  # four classes, none the bulk of the data
    summary = topics_task.summary()
    assert f"{100 * rate:.1f}% on eval" in summary and f"{len(topics_task.train)} train" in summary


# --- GLUE TSV -------------------------------------------------------------------------------

def write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")
    return path


def sst2(folder, train=None, dev=None):
    write(folder / "train.tsv", train or [("sentence", "label"), ("the cat sat ", "1"), ("a dog ran away ", "0")])
    write(folder / "dev.tsv", dev or [("sentence", "label"), ("the dogs sat ", "1")])
    return folder


MNLI_HEADER = ("index", "promptID", "pairID", "genre", "sentence1", "sentence2", "label1", "gold_label")


def mnli_row(i, a, b, label):
    return (str(i), "7", f"{i}e", "fiction", a, b, label, label)


def mnli(folder, train=None):
    write(folder / "train.tsv", train or [MNLI_HEADER, mnli_row(0, "the cat sat", "a cat sat", "entailment"),
                                          mnli_row(1, 'a "dog" ran', "the cat sat", "neutral"),
                                          mnli_row(2, "the dog ran", "the dog sat", "contradiction")])
    write(folder / "dev_matched.tsv", [MNLI_HEADER + ("label2",), mnli_row(0, "the mat", "a mat", "neutral") + ("x",)])
    return folder


def test_sst2(tmp_path):
    task = load_task("sst2", str(sst2(tmp_path)))
    assert (task.name, task.num_classes, task.label_names) == ("sst2", 2, ("negative", "positive"))
    assert task.train == [("the cat sat ", None, 1), ("a dog ran away ", None, 0)]
    assert task.eval == [("the dogs sat ", None, 1)]
    (tmp_path / "dev.tsv").write_bytes(b"\xef\xbb\xbfsentence\tlabel\r\nthe mat\t0\r\n")  # a BOM, CRLF
    assert load_task("sst2", str(tmp_path)).eval == [("the mat", None, 0)]


def test_mnli(tmp_path):
    task = load_task("mnli", str(mnli(tmp_path)))
    assert (task.name, task.num_classes) == ("mnli", 3)
    assert task.label_names == ("entailment", "neutral", "contradiction")
    # quotes are text, as Google's reader (no quoting) keeps them
    assert task.train == [("the cat sat", "a cat sat", 0), ('a "dog" ran', "the cat sat", 1),
                          ("the dog ran", "the dog sat", 2)]
    assert task.eval == [("the mat", "a mat", 1)]  # columns found by name, whatever others there are


@pytest.mark.parametrize("rows, message", [
    ([("sentence", "label"), ("good", "1"), ("bad", "2")], r"train.tsv:3: unknown label '2' \(expected one of 0, 1\)"),
    ([("sentence", "score"), ("good", "1")],
     r"train.tsv:1: no column 'label' in the header \(it has sentence, score\)"),
    ([("sentence", "label"), ("good", "1"), ("bad", "0", "extra")],
     r"train.tsv:3: 3 tab-separated fields, the header has 2"),
    ([("sentence", "label")], r"train.tsv: empty file \(a header and no example\)"),
    ([], r"train.tsv: empty file \(expected a header with sentence, label\)"),
])
def test_bad_sst2_files(tmp_path, rows, message):
    sst2(tmp_path)
    write(tmp_path / "train.tsv", rows)
    with pytest.raises(UserError, match=message):
        load_task("sst2", str(tmp_path))


def test_bad_mnli_files_and_folders(tmp_path):
    mnli(tmp_path / "ok")
    with pytest.raises(UserError, match=r"train.tsv:3: unknown label '-'"):
        load_task("mnli", str(mnli(tmp_path / "unlabelled", [MNLI_HEADER, mnli_row(0, "a", "b", "neutral"),
                                                             mnli_row(1, "a", "b", "-")])))
    (tmp_path / "ok" / "dev_matched.tsv").unlink()
    with pytest.raises(UserError, match=r"ok/dev_matched.tsv: no such file"):
        load_task("mnli", str(tmp_path / "ok"))
    with pytest.raises(UserError, match=r"missing: no such folder \(the GLUE SST2 data"):
        load_task("sst2", str(tmp_path / "missing"))
    with pytest.raises(UserError, match="classifier task mnli: needs data_dir"):
        load_task("mnli", None)
    with pytest.raises(UserError, match="classifier task 'cola': unknown; choose from corpus_topics, sst2, mnli"):
        load_task("cola", str(tmp_path))
    sst2(tmp_path / "latin1")
    (tmp_path / "latin1" / "train.tsv").write_bytes(b"sentence\tlabel\ncaf\xe9\t1\n")
    with pytest.raises(UserError, match=r"train.tsv: not UTF-8 text"):
        load_task("sst2", str(tmp_path / "latin1"))


# --- BERT's inputs --------------------------------------------------------------------------

def test_single_sentences(tokenizer):
    arrays = encode_pairs([("The Cats sat", None, 1), ("a dog", None, 0)], tokenizer, 7)
    assert sorted(arrays) == ["input_ids", "input_mask", "labels", "segment_ids"]
    assert all(a.dtype == np.int32 for a in arrays.values())
    # uncased WordPiece: "Cats" -> cat ##s
    np.testing.assert_array_equal(arrays["input_ids"], [[CLS, *ids("the cat ##s sat"), SEP, 0],
                                                        [CLS, *ids("a dog"), SEP, 0, 0, 0]])
    np.testing.assert_array_equal(arrays["input_mask"], [[1] * 6 + [0], [1] * 4 + [0] * 3])
    np.testing.assert_array_equal(arrays["segment_ids"], np.zeros((2, 7)))
    np.testing.assert_array_equal(arrays["labels"], [1, 0])
    # too long: cut from the end, [SEP] kept
    cut = encode_pairs([("the cat sat on the mat", None, 0)], tokenizer, 5)
    np.testing.assert_array_equal(cut["input_ids"], [[CLS, *ids("the cat sat"), SEP]])


def test_pairs_and_google_truncation(tokenizer):
    arrays = encode_pairs([("the cat sat", "a dog", 2)], tokenizer, 9)
    np.testing.assert_array_equal(arrays["input_ids"], [[CLS, *ids("the cat sat"), SEP, *ids("a dog"), SEP, 0]])
    np.testing.assert_array_equal(arrays["segment_ids"], [[0, 0, 0, 0, 0, 1, 1, 1, 0]])
    np.testing.assert_array_equal(arrays["input_mask"], [[1] * 8 + [0]])
    # 5 + 2 tokens into 8 - 3 = 5: the longer one loses tokens from its end, the short one keeps all
    long_a = encode_pairs([("the cat sat on the mat", "a dog", 0)], tokenizer, 8)
    np.testing.assert_array_equal(long_a["input_ids"], [[CLS, *ids("the cat sat"), SEP, *ids("a dog"), SEP]])
    # equal lengths: b loses first, then they alternate
    even = encode_pairs([("the cat sat", "a dog ran", 0)], tokenizer, 8)
    np.testing.assert_array_equal(even["input_ids"], [[CLS, *ids("the cat sat"), SEP, *ids("a dog"), SEP]])
    even = encode_pairs([("the cat sat", "a dog ran", 0)], tokenizer, 7)
    np.testing.assert_array_equal(even["input_ids"], [[CLS, *ids("the cat"), SEP, *ids("a dog"), SEP]])
    np.testing.assert_array_equal(even["segment_ids"], [[0, 0, 0, 0, 1, 1, 1]])


def test_mixed_examples_and_bad_lengths(tokenizer):
    arrays = encode_pairs([("the cat", None, 0), ("a dog", "far away", 1)], tokenizer, 8)
    np.testing.assert_array_equal(arrays["input_ids"], [[CLS, *ids("the cat"), SEP, 0, 0, 0, 0],
                                                        [CLS, *ids("a dog"), SEP, *ids("far away"), SEP, 0]])
    np.testing.assert_array_equal(arrays["segment_ids"][1], [0, 0, 0, 0, 1, 1, 1, 0])
    with pytest.raises(UserError, match=r"max_sequence_length 2: too short for \[CLS\] a \[SEP\] b \[SEP\]"):
        encode_pairs([("a", "b", 0)], tokenizer, 2)
    empty = encode_pairs([], tokenizer, 4)
    assert empty["input_ids"].shape == (0, 4) and empty["labels"].shape == (0,)


def test_default_task_encodes_with_a_trained_vocab(topics_task):
    from common.data.text.corpus import default_corpus

    tok = pytest.importorskip("common.data.text.tokenizer", reason="needs the tokenizers package")
    tokenizer = tok.train_wordpiece(default_corpus()[:10], vocab_size=300)
    arrays = encode_pairs(topics_task.eval[:16], tokenizer, 32)
    assert arrays["input_ids"].shape == (16, 32)
    lengths = arrays["input_mask"].sum(1)
    assert (arrays["input_ids"][:, 0] == CLS).all()
    assert (arrays["input_ids"][np.arange(16), lengths - 1] == SEP).all()
    np.testing.assert_array_equal(arrays["labels"], [l for _, _, l in topics_task.eval[:16]])
