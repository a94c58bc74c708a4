"""The names of Keras-Preprocessing's ``keras_preprocessing.text`` that the vendor's zoo calls,
written here from that package's documented behaviour (Keras 3 has no Tokenizer, and the
package itself is unmaintained since 2020).

``zoo port migrate`` rewrites ``from keras_preprocessing.text import Tokenizer`` (the vendor's
``transformers/data_processing/Tokenization.py``) and ``text_to_word_sequence`` (its
``data_processing/utils.py``) to this module. Promised as Keras-Preprocessing 1.1 did: a word's
index is its rank by count, ties in the order first seen, counting from 1 (0 is padding);
``oov_token`` takes index 1 when given; ``num_words`` keeps the indices below it.
"""

from __future__ import annotations

from collections import OrderedDict

FILTERS = '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'  # Keras-Preprocessing's default: punctuation, tabs, line breaks


def text_to_word_sequence(text: str, filters: str = FILTERS, lower: bool = True, split: str = " ") -> list[str]:
    """The words of ``text``: lower-cased if ``lower``, each character of ``filters`` read as ``split``,
    split on ``split``, empty pieces dropped."""
    if lower:
        text = text.lower()
    text = text.translate(str.maketrans({c: split for c in filters}))
    return [word for word in text.split(split) if word]


class Tokenizer:
    """Words to indices, learnt from texts by ``fit_on_texts``.

    A text is a string (split by ``text_to_word_sequence``, or into characters if ``char_level``)
    or a list of words taken as they are (lower-cased if ``lower``)."""

    def __init__(self, num_words: int | None = None, filters: str = FILTERS, lower: bool = True,
                 split: str = " ", char_level: bool = False, oov_token: str | None = None):
        self.num_words, self.filters, self.lower = num_words, filters, lower
        self.split, self.char_level, self.oov_token = split, char_level, oov_token
        self.word_counts: OrderedDict[str, int] = OrderedDict()  # in the order first seen
        self.document_count = 0
        self.word_index: dict[str, int] = {}
        self.index_word: dict[int, str] = {}

    def _words(self, text: str | list[str]) -> list[str]:
        if self.char_level or isinstance(text, list):
            if self.lower:
                text = [t.lower() for t in text] if isinstance(text, list) else text.lower()
            return list(text)
        return text_to_word_sequence(text, self.filters, self.lower, self.split)

    def fit_on_texts(self, texts) -> None:
        """Count the words of ``texts`` and index them: the most frequent first, ties in the order seen."""
        for text in texts:
            self.document_count += 1
            for word in self._words(text):
                self.word_counts[word] = self.word_counts.get(word, 0) + 1
        # sorted() is stable: equal counts keep the order first seen
        ranked = [w for w, _ in sorted(self.word_counts.items(), key=lambda item: item[1], reverse=True)]
        if self.oov_token is not None:
            ranked = [self.oov_token] + ranked
        self.word_index = {word: i for i, word in enumerate(ranked, 1)}
        self.index_word = {i: word for word, i in self.word_index.items()}

    def texts_to_sequences(self, texts) -> list[list[int]]:
        """Each text's words as indices; an unknown word (or one at or past ``num_words``) is dropped,
        or is ``oov_token``'s index when there is one."""
        oov = self.word_index.get(self.oov_token) if self.oov_token is not None else None
        sequences = []
        for text in texts:
            sequence = []
            for word in self._words(text):
                i = self.word_index.get(word)
                if i is not None and (not self.num_words or i < self.num_words):
                    sequence.append(i)
                elif oov is not None:
                    sequence.append(oov)
            sequences.append(sequence)
        return sequences
