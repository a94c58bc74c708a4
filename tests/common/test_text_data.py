"""common/data/text: the default corpus, the corpus readers, the tokenizers and their files,
and Google BERT's masked-LM + next-sentence example generation."""

import json
import random

import numpy as np
import pytest

from common.data.text import (
    corpus_fingerprint, default_corpus, read_corpus, read_jsonl, read_text_file, split_sentences,
)
from common.data.text.corpus import topic_sentences
from common.data.text.pretraining import MaskingConfig, SpecialIds, instances_from_document, make_shard, to_arrays
from common.errors import UserError

tok = pytest.importorskip("common.data.text.tokenizer", reason="needs the tokenizers package")


@pytest.fixture(scope="module")
def corpus():
    return default_corpus()


@pytest.fixture(scope="module")
def small_docs(corpus):
    return corpus[:12]


# --- the default corpus --------------------------------------------------------------------

def test_default_corpus_is_real_prose_and_deterministic(corpus):
    assert corpus == default_corpus()
    assert len(corpus) >= 60  # one document per pydoc topic with prose (79 on Python 3.11)
    sentences = [s for d in corpus for s in d]
    assert len(sentences) >= 2000
    # grammar rules and code examples are dropped; what stays reads as sentences
    assert not any("::=" in s or s.startswith(">>>") for s in sentences)
    assert sum(s[-1] in ".?!:" for s in sentences) >= 0.95 * len(sentences)
    assert "The suite is executed." in [s for d in corpus for s in d]


def test_topic_sentences_drops_heading_grammar_and_code():
    text = ('The "x" statement\n*****************\n\nThe statement is used for a purpose. It\n'
            'does something else too.\n\n   x_stmt ::= "x" expression\n\nFor example:\n\n'
            '   x = 1\n   print(x)\n\nNote:\n\n  This note is prose and stays here.\n')
    assert topic_sentences(text) == [
        "The statement is used for a purpose.", "It does something else too.",
        "This note is prose and stays here.",
    ]


def test_split_sentences():
    assert split_sentences("One, i.e. the first. Two!  \"Three?\" (Four.) five") == [
        "One, i.e. the first.", "Two!", "\"Three?\"", "(Four.) five"]


def test_corpus_fingerprint_changes_with_the_text(corpus):
    assert corpus_fingerprint(corpus) == corpus_fingerprint(default_corpus())
    assert corpus_fingerprint(corpus) != corpus_fingerprint(corpus[1:])


# --- corpus readers ------------------------------------------------------------------------

def test_read_text_file_bert_convention(tmp_path):
    p = tmp_path / "c.txt"
    p.write_text("First a.\nFirst b.\n\n\nSecond a.\n  \nThird a.\nThird b.\n")
    assert read_text_file(p) == [["First a.", "First b."], ["Second a."], ["Third a.", "Third b."]]


def test_read_jsonl_and_mixed(tmp_path):
    j = tmp_path / "c.jsonl"
    j.write_text(json.dumps({"text": "One here. Two here.\n\nThree here."}) + "\n\n"
                 + json.dumps({"text": "Alone.", "id": 3}) + "\n")
    assert read_jsonl(j) == [["One here.", "Two here.", "Three here."], ["Alone."]]
    t = tmp_path / "c.txt"
    t.write_text("Plain.\n")
    assert read_corpus([t, j]) == [["Plain."], ["One here.", "Two here.", "Three here."], ["Alone."]]


@pytest.mark.parametrize("content, message", [
    ("", "c.txt: empty corpus file"),
    ("\n  \n\n", "c.txt: empty corpus file"),
])
def test_empty_text_file(tmp_path, content, message):
    (tmp_path / "c.txt").write_text(content)
    with pytest.raises(UserError, match=message):
        read_text_file(tmp_path / "c.txt")


def test_jsonl_errors_name_file_and_line(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text('{"text": "Fine."}\n{"text": "broken\n')
    with pytest.raises(UserError, match=r"c\.jsonl:2: not valid JSON"):
        read_jsonl(p)
    p.write_text('{"text": "Fine."}\n{"body": "no text field"}\n')
    with pytest.raises(UserError, match=r"c\.jsonl:2: expected an object with a string field 'text'"):
        read_jsonl(p)
    p.write_text("")
    with pytest.raises(UserError, match=r"c\.jsonl: empty corpus file"):
        read_jsonl(p)
    with pytest.raises(UserError, match="nope.txt: no such corpus file"):
        read_corpus([tmp_path / "nope.txt"])


# --- tokenizers ----------------------------------------------------------------------------

def test_wordpiece_special_tokens_and_determinism(small_docs):
    a = tok.train_wordpiece(small_docs, vocab_size=300)
    b = tok.train_wordpiece(small_docs, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()  # tokenizers' own WordPieceTrainer differs run to run
    vocab = tok.vocab_in_id_order(a)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert len(vocab) == 300 and any(t.startswith("##") for t in vocab)
    enc = a.encode("The suite is executed.", "Another one.")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    first_sep = enc.tokens.index("[SEP]")
    assert enc.type_ids == [0] * (first_sep + 1) + [1] * (len(enc.tokens) - first_sep - 1)
    # WordPiece pieces spell the word back
    words = a.encode("attributes executed", add_special_tokens=False).tokens
    assert "".join(w.removeprefix("##") if i and w.startswith("##") else (" " + w if i else w)
                   for i, w in enumerate(words)) == "attributes executed"


def test_vocab_txt_round_trip_same_ids(tmp_path, small_docs, corpus):
    trained = tok.train_wordpiece(small_docs, vocab_size=300)
    path = tok.write_vocab_txt(trained, tmp_path / "vocab.txt")
    assert path.read_text().splitlines()[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    read = tok.read_vocab_txt(path)
    for sentence in corpus[40][:20]:
        assert read.encode(sentence, "A pair.").ids == trained.encode(sentence, "A pair.").ids


def test_tokenizer_json_round_trip_same_ids(tmp_path, small_docs, corpus):
    for trained in (tok.train_wordpiece(small_docs, 300), tok.train_byte_bpe(small_docs, 400)):
        trained.save(str(tmp_path / "tokenizer.json"))
        read = tok.read_tokenizer_json(tmp_path / "tokenizer.json")
        text = " ".join(corpus[40][:20])
        assert read.encode(text).ids == trained.encode(text).ids


def test_gpt2_files_round_trip_same_ids(tmp_path, small_docs, corpus):
    trained = tok.train_byte_bpe(small_docs, vocab_size=400)
    assert tok.train_byte_bpe(small_docs, vocab_size=400).get_vocab() == trained.get_vocab()
    enc_json, vocab_bpe = tok.write_gpt2(trained, tmp_path / "encoder.json", tmp_path / "vocab.bpe")
    assert vocab_bpe.read_text().startswith("#version: 0.2\n")
    assert json.loads(enc_json.read_text())["<|endoftext|>"] == 0
    read = tok.read_gpt2(enc_json, vocab_bpe)
    text = " ".join(corpus[40][:20]) + " naïve café <|endoftext|> ünïcödé"
    assert read.encode(text).ids == trained.encode(text).ids
    assert read.decode(read.encode(text).ids, skip_special_tokens=False) == text  # byte-level: lossless
    assert read.token_to_id("<|endoftext|>") in read.encode("a<|endoftext|>b").ids


def test_vocab_txt_errors(tmp_path):
    p = tmp_path / "vocab.txt"
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(UserError, match=r"vocab\.txt: vocab lacks the special token\(s\) \[MASK\]"):
        tok.read_vocab_txt(p)
    p.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\nthe\n")
    with pytest.raises(UserError, match=r"vocab\.txt:7: token 'the' appears twice \(first on line 6\)"):
        tok.read_vocab_txt(p)
    p.write_text("[PAD]\n[UNK]\n\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(UserError, match="blank line inside"):
        tok.read_vocab_txt(p)
    with pytest.raises(UserError, match="missing.txt: no such vocab file"):
        tok.read_vocab_txt(tmp_path / "missing.txt")


def test_gpt2_and_tokenizer_json_errors(tmp_path, small_docs):
    trained = tok.train_byte_bpe(small_docs, vocab_size=300)
    enc_json, vocab_bpe = tok.write_gpt2(trained, tmp_path / "encoder.json", tmp_path / "vocab.bpe")
    vocab_bpe.write_text("#version: 0.2\nt h\nno_space_here\n")
    with pytest.raises(UserError, match=r"vocab\.bpe:3: expected two tokens"):
        tok.read_gpt2(enc_json, vocab_bpe)
    vocab_bpe.write_text("#version: 0.2\nq z\n")
    with pytest.raises(UserError, match=r"vocab\.bpe:2: merge 'q z' makes 'qz', which is not in encoder\.json"):
        tok.read_gpt2(enc_json, vocab_bpe)
    enc_json.write_text("{not json")
    with pytest.raises(UserError, match=r"encoder\.json: not valid JSON"):
        tok.read_gpt2(enc_json, vocab_bpe)
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": 3}')
    with pytest.raises(UserError, match=r"tokenizer\.json: not a tokenizer\.json"):
        tok.read_tokenizer_json(bad)
    trained.save(str(bad))  # a GPT tokenizer where BERT's specials are needed
    with pytest.raises(UserError, match=r"tokenizer\.json: vocab lacks the special token\(s\) \[PAD\] \[UNK\]"):
        tok.read_bert_tokenizer(bad)


# --- Google BERT's example generation ------------------------------------------------------

CLS, SEP, MASK = 2, 3, 4
IDS = SpecialIds(cls=CLS, sep=SEP, mask=MASK, vocab_size=5000)


def numbered_documents(num_docs=12, seed=0, sentences=(1, 9)):
    """Documents whose token ids say where they come from: 1000 + 100*doc + 10*sentence + position."""
    rng = random.Random(seed)
    return [[[1000 + 100 * d + 10 * s + p for p in range(rng.randint(2, 6))] for s in range(rng.randint(*sentences))]
            for d in range(num_docs)]


def unmasked(inst):
    tokens = list(inst.tokens)
    for p, label in zip(inst.masked_lm_positions, inst.masked_lm_labels):
        tokens[p] = label
    return tokens


def test_instances_follow_google_semantics():
    docs = numbered_documents()
    cfg = MaskingConfig(max_seq_length=24, max_predictions_per_seq=5, dupe_factor=1, short_seq_prob=0.2)
    rng = random.Random(7)
    instances = [i for _ in range(4) for d in range(len(docs))
                 for i in instances_from_document(docs, d, cfg, IDS, rng)]
    assert len(instances) > 100
    assert any(i.is_random_next for i in instances) and not all(i.is_random_next for i in instances)
    for inst in instances:
        t = unmasked(inst)
        n = len(t)
        assert n <= cfg.max_seq_length and t[0] == CLS and t[-1] == SEP and t.count(SEP) == 2
        sep = t.index(SEP)
        a, b = t[1:sep], t[sep + 1:-1]
        assert a and b
        assert inst.segment_ids == [0] * (sep + 1) + [1] * (len(b) + 1)
        # masking: min(max_predictions, max(1, round(15% of the length))) positions, never [CLS]/[SEP]
        assert len(inst.masked_lm_positions) == min(5, max(1, int(round(n * 0.15))))
        assert inst.masked_lm_positions == sorted(set(inst.masked_lm_positions))
        assert all(t[p] not in (CLS, SEP) for p in inst.masked_lm_positions)
        assert [t[p] for p in inst.masked_lm_positions] == inst.masked_lm_labels
        # where nothing was truncated, segments are whole sentences, B after A when "is next"
        doc_a, doc_b = (a[0] - 1000) // 100, (b[0] - 1000) // 100
        if n < cfg.max_seq_length:
            assert a[0] % 10 == 0 and b[0] % 10 == 0  # a sentence's first token
            assert len({(x - 1000) // 100 for x in a}) == 1
            if not inst.is_random_next:
                assert doc_b == doc_a and (b[0] // 10) == (a[-1] // 10) + 1
        if inst.is_random_next:
            assert doc_b != doc_a  # 12 documents: 10 draws never all hit the same one here


def test_masking_is_80_10_10_and_next_sentence_is_half():
    docs = numbered_documents(30, seed=1, sentences=(30, 30))
    cfg = MaskingConfig(max_seq_length=32, max_predictions_per_seq=10, dupe_factor=5)
    instances = make_shard(docs, range(len(docs)), cfg, IDS, "stats")
    arrays = to_arrays(instances, cfg)
    w = arrays["masked_lm_weights"] > 0
    shown = np.take_along_axis(arrays["input_ids"], arrays["masked_lm_positions"], 1)[w]
    labels = arrays["masked_lm_ids"][w]
    n = labels.size
    assert n > 3000
    assert abs((shown == MASK).mean() - 0.8) < 0.03
    assert abs((shown == labels).mean() - 0.1) < 0.02
    assert abs(((shown != MASK) & (shown != labels)).mean() - 0.1) < 0.02
    # half, plus the chunks of one sentence (always random next, as in Google's script): a
    # document's last chunk is often one, so the longer the documents, the closer to 0.5
    assert 0.48 < arrays["next_sentence_labels"].mean() < 0.57
    # padding: zeros past the end, weights only on real predictions
    lengths = arrays["input_mask"].sum(1)
    for k in range(len(instances)):
        assert arrays["input_ids"][k, lengths[k]:].sum() == 0 and arrays["input_mask"][k, :lengths[k]].all()
    assert (w.sum(1) == [len(i.masked_lm_positions) for i in instances]).all()


def test_make_shard_is_deterministic_per_seed():
    docs = numbered_documents()
    cfg = MaskingConfig(max_seq_length=16, max_predictions_per_seq=3, dupe_factor=2)
    a = to_arrays(make_shard(docs, [0, 3, 5], cfg, IDS, "1/train/0"), cfg)
    b = to_arrays(make_shard(docs, [0, 3, 5], cfg, IDS, "1/train/0"), cfg)
    c = to_arrays(make_shard(docs, [0, 3, 5], cfg, IDS, "2/train/0"), cfg)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["input_ids"], c["input_ids"])


def test_whole_word_masking_masks_every_piece_of_a_word():
    docs = numbered_documents(20, seed=2)
    # a "word" here is a sentence: its first token, then "##" pieces (positions 1..)
    ids = SpecialIds(cls=CLS, sep=SEP, mask=MASK, vocab_size=5000,
                     continuation=frozenset(t for d in docs for s in d for t in s[1:]))
    cfg = MaskingConfig(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=3, whole_word_mask=True)
    instances = make_shard(docs, range(len(docs)), cfg, ids, "wwm")
    assert len(instances) > 50
    for inst in instances:
        t = unmasked(inst)
        words = []  # positions of each word, grouped as Google groups them
        for i, token in enumerate(t):
            if token not in (CLS, SEP):
                if words and token in ids.continuation:
                    words[-1].append(i)
                else:
                    words.append([i])
        masked = set(inst.masked_lm_positions)
        assert all(set(w) <= masked or not (set(w) & masked) for w in words)
        assert len(masked) <= min(8, max(1, int(round(len(t) * 0.15))))
    # a word longer than the predictions left is skipped, so an example can have none (these
    # "words" have up to 6 pieces, and 15% of a short example is 2 or 3 predictions)
    assert sum(bool(i.masked_lm_positions) for i in instances) > 0.7 * len(instances)


@pytest.mark.parametrize("kwargs, message", [
    ({"max_seq_length": 7}, "max_seq_length 7: must be in 8..512"),
    ({"max_seq_length": 1024}, "max_seq_length 1024: must be in 8..512"),
    ({"max_seq_length": 16, "max_predictions_per_seq": 14}, "max_predictions_per_seq 14: must be in 1..13"),
    ({"masked_lm_prob": 0.0}, "masked_lm_prob 0.0"),
    ({"dupe_factor": 0}, "dupe_factor 0"),
])
def test_masking_config_limits(kwargs, message):
    with pytest.raises(UserError, match=message):
        MaskingConfig(**kwargs).validate()
