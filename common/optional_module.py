"""A library that a module imports at its top but uses only in some of its functions, when it is not installed.

``optional_module(name, install)`` is the module where it is installed; where it is not, a stand-in, so
that the module importing it still imports (the vendor's TF bert's data.py imports its spaCy-based data
processors, which it trains without) and the first use of the library is one error naming it and
``install``, the command that installs it. ``zoo port migrate`` writes the top-level ``import`` of such a
library (its TO_INSTALL) as a call of this.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from common.errors import UserError


class AbsentModule:
    """Stands for the library ``name``, not installed: any attribute asked of it is a UserError."""

    def __init__(self, name: str, install: str):
        self._name, self._install = name, install

    def __getattr__(self, attr: str):
        if attr.startswith("__"):  # copy, pickle and inspect probe dunders: those are plain AttributeErrors
            raise AttributeError(attr)
        raise UserError(f"{self._name}.{attr}: {self._name} is not installed here: {self._install}")

    def __repr__(self) -> str:
        return f"<absent module {self._name!r}>"


def optional_module(name: str, install: str) -> ModuleType | AbsentModule:
    """The module ``name`` if it imports; an AbsentModule if it is not installed (an error inside it is raised)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] and e.name != name:
            raise  # the library is there, and a module it imports is not
        return AbsentModule(name, install)
