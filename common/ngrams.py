"""``nltk.ngrams``, the one name of NLTK the vendor's code calls (its TF ROUGE metric, its BERTSUM data
processing), written here from NLTK's documented behaviour (``nltk.util.ngrams``), so that a migrated folder
needs no NLTK (not a dependency of this zoo): ``zoo port migrate`` rewrites ``from nltk import ngrams`` to it.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator


def ngrams(sequence: Iterable, n: int, pad_left: bool = False, pad_right: bool = False,
           left_pad_symbol: Any = None, right_pad_symbol: Any = None) -> Iterator[tuple]:
    """The n-grams of ``sequence``, in order, as tuples; with ``pad_left``/``pad_right`` it is first padded
    with n - 1 pad symbols on that side. ``ngrams([1, 2, 3], 2)`` yields (1, 2), (2, 3)."""
    items = list(sequence)
    if pad_left:
        items = [left_pad_symbol] * (n - 1) + items
    if pad_right:
        items = items + [right_pad_symbol] * (n - 1)
    return zip(*(items[i:] for i in range(n)))
