"""Text corpora as documents of sentences: the default one shipped with Python, and readers.

A corpus is ``list[list[str]]``: documents, each a list of sentences, the shape BERT's
next-sentence prediction needs (segments A and B are whole sentences of one document).

- ``default_corpus()``: the prose of the Python documentation that ships with CPython as
  ``pydoc_data.topics`` (the text ``help("if")`` prints), one document per topic, so every
  fresh clone has real English text with no download. Grammar rules, code examples and
  headings are dropped; what stays is split into sentences. Deterministic for a given
  Python version (the topics change slightly between CPython releases: the prepare
  command records ``corpus_fingerprint`` so that a change is visible).
- ``read_text_file(path)``: BERT's input convention, one sentence per line and a blank
  line between documents.
- ``read_jsonl(path, field="text")``: one JSON object per line; its ``field`` is one
  document, split into sentences here.
- ``read_corpus(paths)``: any mix of the two, chosen by extension (``.jsonl``/``.json``
  are JSON lines, anything else plain text).

Bad input (a missing or empty file, a JSON line that does not parse or lacks the field)
raises ``UserError`` naming the file and, where it applies, the line.
"""

import hashlib
import json
import re
from pathlib import Path

from common.errors import UserError

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed by space
# and a capital, a quote or a bracket. "e.g. the" and "i.e. a" stay whole (lowercase next).
_SENTENCE_END = re.compile(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s+(?=[\"'(A-Z])")
_UNDERLINE = re.compile(r"^\s*([*=\-~^])\1{2,}\s*$")  # ****, ====, ---- under a heading
_LIST_MARKER = re.compile(r"^(\d+\.|\*|-|•)\s+")
# "Note:", "See also:", "Changed in version 3.1:" and their like introduce indented prose,
# not a literal block of code as any other paragraph ending in ":" does in pydoc's text.
_DIRECTIVE = re.compile(r"^(Note|Warning|See also|Important|Caution|Tip|Hint|Attention|"
                        r"Danger|Error|Deprecated|Added|Changed|Deprecated since).*:$")


def split_sentences(text: str) -> list[str]:
    """Sentences of one paragraph (whitespace collapsed); empty pieces dropped."""
    text = " ".join(text.split())
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def _paragraphs(text: str) -> list[tuple[int, list[str]]]:
    """(indent, lines) for each blank-line-separated block of ``text``."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.rstrip())
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return [(min(len(l) - len(l.lstrip()) for l in b), b) for b in blocks]


def _is_prose(lines: list[str]) -> bool:
    joined = " ".join(l.strip() for l in lines)
    if "::=" in joined or ">>>" in joined or "..." == joined[:3]:
        return False
    words = _LIST_MARKER.sub("", joined).split()
    if len(words) < 4 or joined[-1] not in ".?!:":
        return False
    alphabetic = sum(w.strip("\"'“”‘’(),.;:!?").isalpha() for w in words)
    return alphabetic >= 0.6 * len(words)


def topic_sentences(text: str) -> list[str]:
    """The prose sentences of one pydoc topic: headings, grammar and code blocks dropped."""
    sentences = []
    code_above = None  # indent of the paragraph that introduced a literal block, while in it
    for indent, lines in _paragraphs(text):
        if code_above is not None:
            if indent > code_above:
                continue  # still inside the literal block
            code_above = None
        # a heading is a paragraph whose last line is an underline
        if _UNDERLINE.match(lines[-1]):
            continue
        joined = " ".join(l.strip() for l in lines)
        if joined.endswith(":") and not _DIRECTIVE.match(joined):
            code_above = indent
        if _is_prose(lines):
            body = _LIST_MARKER.sub("", joined)
            sentences.extend(s for s in split_sentences(body) if not _DIRECTIVE.match(s))
    return sentences


def default_corpus() -> list[list[str]]:
    """The Python documentation's topics as documents of sentences (sorted by topic name)."""
    from pydoc_data.topics import topics  # ships with CPython

    documents = [topic_sentences(topics[name]) for name in sorted(topics)]
    return [d for d in documents if d]


def corpus_fingerprint(documents: list[list[str]]) -> str:
    """A short hash of the text, to tell whether two corpora are the same."""
    h = hashlib.sha256()
    for document in documents:
        for sentence in document:
            h.update(sentence.encode() + b"\n")
        h.update(b"\n")
    return h.hexdigest()[:16]


def _read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise UserError(f"{path}: no such corpus file")
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def read_text_file(path) -> list[list[str]]:
    """BERT's convention: one sentence per line, a blank line between documents."""
    path = Path(path)
    documents, current = [], []
    for line in _read_lines(path):
        if line.strip():
            current.append(line.strip())
        elif current:
            documents.append(current)
            current = []
    if current:
        documents.append(current)
    if not documents:
        raise UserError(f"{path}: empty corpus file (no sentence in it)")
    return documents


def read_jsonl(path, field: str = "text") -> list[list[str]]:
    """One JSON object per line; ``obj[field]`` is a document, split into sentences here."""
    path = Path(path)
    documents = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: not valid JSON ({e.msg}, column {e.colno})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get(field), str):
            raise UserError(f"{path}:{number}: expected an object with a string field {field!r}")
        # paragraphs (blank lines) and sentences alike become sentences of this document
        sentences = [s for paragraph in obj[field].split("\n\n") for s in split_sentences(paragraph)]
        if sentences:
            documents.append(sentences)
    if not documents:
        raise UserError(f"{path}: empty corpus file (no line with text in field {field!r})")
    return documents


def read_corpus(paths, field: str = "text") -> list[list[str]]:
    """Documents of every file in ``paths``, in order: ``.jsonl``/``.json`` as JSON lines, else text."""
    documents = []
    for path in map(Path, paths):
        if path.suffix in (".jsonl", ".json"):
            documents.extend(read_jsonl(path, field))
        else:
            documents.extend(read_text_file(path))
    return documents
