"""Tokenizers trained here with Hugging Face ``tokenizers``, and readers of the files users bring.

- BERT: WordPiece, uncased (lowercase, accents stripped), special tokens ``[PAD] [UNK]
  [CLS] [SEP] [MASK]`` at ids 0..4 (``[PAD]`` is 0 because the examples pad with 0).
  ``train_wordpiece`` trains one; ``read_vocab_txt`` reads a BERT ``vocab.txt`` (one token
  a line, the id is the line number) such as Google's ``uncased_L-12_H-768_A-12/vocab.txt``;
  ``write_vocab_txt`` writes one.
- GPT: byte-level BPE as GPT-2's, with ``<|endoftext|>``. ``train_byte_bpe`` trains one;
  ``read_gpt2`` reads GPT-2's ``encoder.json`` + ``vocab.bpe``; ``write_gpt2`` writes them.
- ``read_tokenizer_json``: any ``tokenizer.json`` of the ``tokenizers`` library (what
  ``Tokenizer.save`` and Hugging Face's fast tokenizers write).

Every reader raises ``UserError`` with one line naming the file (and the line or the
missing token) on a file it cannot use.
"""

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from common.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
BERT_SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
END_OF_TEXT = "<|endoftext|>"
# Unicode plane 15, private use: stands for the characters inside words while training WordPiece
_PRIVATE_BASE, _PRIVATE_CODES = 0xF0000, 0xFFFFD - 0xF0000


def _bert_pipeline(tokenizer: Tokenizer, lowercase: bool) -> Tokenizer:
    """BERT's normalisation, pre-tokenisation, [CLS] A [SEP] B [SEP] and decoding."""
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    vocab = tokenizer.get_vocab()
    if CLS in vocab and SEP in vocab:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}",
            pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, vocab[CLS]), (SEP, vocab[SEP])],
        )
    return tokenizer


def train_wordpiece(documents: list[list[str]], vocab_size: int = 8192, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer trained on the sentences of ``documents``; deterministic.

    ``tokenizers``' WordPieceTrainer is not deterministic: it breaks ties between equally
    frequent pairs by the ids of the "##x" pieces, which it numbers in hash-map order. So
    this trains its BPE trainer (what WordPieceTrainer runs inside) on words spelled so
    that every piece is one character: a character inside a word is replaced by a private
    code point standing for "##" + it. The alphabet is then sorted, the ties fall the same
    way on every run, and the learnt pieces are spelled back.
    """
    template = _bert_pipeline(Tokenizer(models.WordPiece(unk_token=UNK)), lowercase)
    words = [
        w for d in documents for s in d
        for w, _ in template.pre_tokenizer.pre_tokenize_str(template.normalizer.normalize_str(s))
    ]
    inner = sorted({c for w in words for c in w[1:]})
    if len(inner) > _PRIVATE_CODES:
        raise UserError(f"the corpus has {len(inner):,} distinct characters; at most {_PRIVATE_CODES:,} can be trained")
    to_private = {c: chr(_PRIVATE_BASE + i) for i, c in enumerate(inner)}
    from_private = {p: c for c, p in to_private.items()}

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(BERT_SPECIAL_TOKENS))
    bpe.train_from_iterator((w[0] + "".join(to_private[c] for c in w[1:]) for w in words), trainer=trainer)

    vocab = {}
    for piece, _ in sorted(bpe.get_vocab().items(), key=lambda kv: kv[1]):
        if piece in BERT_SPECIAL_TOKENS:
            spelled = piece
        elif piece[0] in from_private:  # a piece from inside a word
            spelled = "##" + "".join(from_private[c] for c in piece)
        else:
            spelled = piece[0] + "".join(from_private[c] for c in piece[1:])
        vocab.setdefault(spelled, len(vocab))
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK, max_input_chars_per_word=100))
    return _bert_pipeline(tokenizer, lowercase)


def train_byte_bpe(documents: list[list[str]], vocab_size: int = 8192) -> Tokenizer:
    """A GPT-2-style byte-level BPE tokenizer trained on ``documents`` (one text per document)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator((" ".join(d) for d in documents), trainer=trainer)
    return tokenizer


def train_bpe_with_specials(texts: list[str], vocab_size: int, specials: tuple[str, ...]) -> Tokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer and decoder) whose first ids are ``specials``:
    the shared source/target vocab of an encoder-decoder (e.g. <pad>, <s>, </s> = 0, 1, 2)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def train_unigram(texts: list[str], vocab_size: int, specials: tuple[str, ...], unk: str,
                  sentinels: int = 0) -> Tokenizer:
    """A SentencePiece-style unigram tokenizer (``▁`` marks a word start, as T5's), its first
    ids ``specials``, then the trained pieces, then ``sentinels`` tokens <extra_id_K> with
    <extra_id_0> the last id (T5's order)."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size - sentinels, special_tokens=list(specials),
                                      unk_token=unk, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer = _canonical_unigram(tokenizer, len(specials))
    tokenizer.add_special_tokens([f"<extra_id_{k}>" for k in reversed(range(sentinels))])
    return tokenizer


# The unigram trainer of ``tokenizers`` sums its scores in an order that varies from process to
# process (its hash maps are seeded at random), so two runs on the same text give scores that
# differ in the last bits, and equal pieces at other ids. The characters the text needs but
# training dropped are put back at the bottom with scores 1e-4 apart, handed out in hash order.
# The same text must give the same tokenizer (a README's figures are rerun from scratch), so the
# scores are rounded to 1e-6 (the segmentation a score decides is unchanged at that size), ties
# are ordered by the piece, and the bottom run of characters gets its scores in character order.
_SCORE_DECIMALS = 6
_REQUIRED_CHAR_STEP = 1e-4


def _canonical_unigram(tokenizer: Tokenizer, n_specials: int) -> Tokenizer:
    """``tokenizer`` (a trained Unigram) with its pieces in a canonical order and its scores
    rounded: the same for every run on the same text."""
    data = json.loads(tokenizer.to_str())
    vocab = data["model"]["vocab"]
    specials, pieces = vocab[:n_specials], [list(ps) for ps in vocab[n_specials:]]
    # the bottom run of single characters: from the lowest score up, steps of 0 or 1e-4
    chars = sorted((ps for ps in pieces if len(ps[0]) == 1), key=lambda ps: ps[1])
    run = chars[:1]
    for lower, higher in zip(chars, chars[1:]):
        step = higher[1] - lower[1]
        if abs(step) > 1e-9 and abs(step - _REQUIRED_CHAR_STEP) > 1e-9:
            break
        run.append(higher)
    if len(run) > 1:
        for ps, piece, score in zip(run, sorted(p for p, _ in run), [s for _, s in run]):
            ps[0], ps[1] = piece, score
    pieces = sorted(([piece, round(score, _SCORE_DECIMALS)] for piece, score in pieces), key=lambda ps: (-ps[1], ps[0]))
    data["model"]["vocab"] = specials + pieces  # the specials keep their ids, <unk>'s with them
    return Tokenizer.from_str(json.dumps(data))


def vocab_in_id_order(tokenizer: Tokenizer) -> list[str]:
    """Tokens by id, 0 first; the ids must be 0..n-1 with no gap."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise UserError("the tokenizer's ids are not 0..n-1 without gaps; it cannot be written as a vocab file")
    return [t for t, _ in by_id]


def write_vocab_txt(tokenizer: Tokenizer, path) -> Path:
    """BERT's vocab.txt: token of id i on line i+1."""
    path = Path(path)
    path.write_text("".join(t + "\n" for t in vocab_in_id_order(tokenizer)), encoding="utf-8")
    return path


def read_vocab_txt(path, lowercase: bool = True) -> Tokenizer:
    """A BERT WordPiece tokenizer from a vocab.txt; it must hold the five special tokens."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such vocab file")
    vocab = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        token = line.rstrip("\r")
        if not token:
            continue  # the trailing newline; Google's files have no blank line inside
        if token in vocab:
            raise UserError(f"{path}:{number}: token {token!r} appears twice (first on line {vocab[token] + 1})")
        vocab[token] = number - 1
    if not vocab:
        raise UserError(f"{path}: empty vocab file")
    missing = [t for t in BERT_SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(f"{path}: vocab lacks the special token(s) {' '.join(missing)} that BERT needs")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise UserError(f"{path}: blank line inside the vocab (ids would skip); remove it")
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token=UNK, max_input_chars_per_word=100))
    return _bert_pipeline(tokenizer, lowercase)


def _merges(tokenizer: Tokenizer) -> list[tuple[str, str]]:
    model = json.loads(tokenizer.to_str())["model"]
    if model.get("type") != "BPE":
        raise UserError(f"a {model.get('type')} tokenizer has no BPE merges to write")
    # tokenizers >= 0.20 writes merges as pairs; older versions as "a b" strings
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]


def write_gpt2(tokenizer: Tokenizer, encoder_json, vocab_bpe) -> tuple[Path, Path]:
    """GPT-2's two files: encoder.json (token -> id) and vocab.bpe (the merges, in order)."""
    encoder_json, vocab_bpe = Path(encoder_json), Path(vocab_bpe)
    vocab = {t: i for i, t in enumerate(vocab_in_id_order(tokenizer))}
    encoder_json.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    vocab_bpe.write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in _merges(tokenizer)), encoding="utf-8")
    return encoder_json, vocab_bpe


def read_gpt2(encoder_json, vocab_bpe) -> Tokenizer:
    """GPT-2's byte-level BPE from encoder.json + vocab.bpe (as OpenAI and Hugging Face ship them)."""
    encoder_json, vocab_bpe = Path(encoder_json), Path(vocab_bpe)
    for p in (encoder_json, vocab_bpe):
        if not p.is_file():
            raise UserError(f"{p}: no such file")
    try:
        vocab = json.loads(encoder_json.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UserError(f"{encoder_json}: not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise UserError(f"{encoder_json}: expected one JSON object mapping tokens to integer ids")
    merges = []
    for number, line in enumerate(vocab_bpe.read_text(encoding="utf-8").splitlines(), start=1):
        if line.startswith("#version") or not line.strip():
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise UserError(f"{vocab_bpe}:{number}: expected two tokens separated by one space, got {line!r}")
        if pair[0] + pair[1] not in vocab:
            raise UserError(f"{vocab_bpe}:{number}: merge {line!r} makes {pair[0] + pair[1]!r}, "
                            f"which is not in {encoder_json.name}")
        merges.append((pair[0], pair[1]))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    if END_OF_TEXT in vocab:
        tokenizer.add_special_tokens([END_OF_TEXT])
    return tokenizer


def read_tokenizer_json(path) -> Tokenizer:
    """Any ``tokenizers`` library file (``tokenizer.json``)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such tokenizer file")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception with serde's message
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: not a tokenizer.json the tokenizers library can read ({first})") from None


def read_bert_tokenizer(path, lowercase: bool = True) -> Tokenizer:
    """A BERT tokenizer from a vocab.txt or a tokenizer.json, checked for the special tokens."""
    path = Path(path)
    if path.suffix == ".json":
        tokenizer = read_tokenizer_json(path)
        missing = [t for t in BERT_SPECIAL_TOKENS if tokenizer.token_to_id(t) is None]
        if missing:
            raise UserError(f"{path}: vocab lacks the special token(s) {' '.join(missing)} that BERT needs")
        return tokenizer
    return read_vocab_txt(path, lowercase)
