"""A family's tensor names in both frameworks, both ways: one table of (TF template, PyTorch
template, transpose) rows, ``{i}`` standing for a layer's number in either template.

bert_names, gpt2_names and llama_names each hold one ``NameTable`` of their rows; the
conversions (``zoo convert``, the Hugging Face readers) go through it. A name that no row
matches is one ``UserError`` line saying what the family's names look like.
"""

from __future__ import annotations

import re

from common.errors import UserError


def _pattern(template: str) -> re.Pattern:
    return re.compile("".join(r"(\d+)" if part == "{i}" else re.escape(part)
                              for part in re.split(r"(\{i\})", template)))


class NameTable:
    """``rows``: (TF template, PyTorch template, transpose); ``tf_kind`` / ``torch_kind`` say in
    an error what the family's names are ("TF GPT-2 variable name (transformer/..., lm_head/...)")."""

    def __init__(self, rows, tf_kind: str, torch_kind: str):
        self.rows = tuple(rows)
        self._tf = [(_pattern(tf), torch, transpose) for tf, torch, transpose in self.rows]
        self._torch = [(_pattern(torch), tf, transpose) for tf, torch, transpose in self.rows]
        self.tf_kind, self.torch_kind = tf_kind, torch_kind

    @staticmethod
    def _convert(name: str, table) -> tuple[str, bool] | None:
        for pattern, other, transpose in table:
            if m := pattern.fullmatch(name):
                return other.replace("{i}", m.group(1)) if "{i}" in other else other, transpose
        return None

    def tf_to_torch(self, name: str) -> tuple[str, bool]:
        """(PyTorch name, transpose) of a TF variable name."""
        found = self._convert(name, self._tf)
        if found is None:
            raise UserError(f"{name}: not a {self.tf_kind}")
        return found

    def torch_to_tf(self, name: str) -> tuple[str, bool]:
        """(TF name, transpose) of a PyTorch weight name."""
        found = self._convert(name, self._torch)
        if found is None:
            raise UserError(f"{name}: not a {self.torch_kind}")
        return found

    def tf_match(self, name: str) -> tuple[str, bool] | None:
        """tf_to_torch's answer, or None for a name that is not the family's (an optimizer slot)."""
        return self._convert(name, self._tf)

    def is_torch_name(self, name: str) -> bool:
        return self._convert(name, self._torch) is not None
