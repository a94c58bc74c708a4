"""A library that a module imports at its top but uses only in some of its functions, when it is not installed.

``optional_module(name, install)`` is the module where it is installed; where it is not, a stand-in, so
that the module importing it still imports (the vendor's TF bert's data.py imports its spaCy-based data
processors, which it trains without) and the first use of the library is one error naming it and
``install``, the command that installs it; ``optional_name(module, name, install)`` likewise for
``from module import name``. ``zoo port migrate`` writes the top-level imports of such a library (its
TO_INSTALL) as calls of these.
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


class AbsentName:
    """Stands for the name ``name`` of the library ``module``, not installed: calling it, or any attribute
    asked of it, is a UserError."""

    def __init__(self, module: str, name: str, install: str):
        self._what, self._module, self._install = f"{module}.{name}", module, install

    def _refuse(self):
        raise UserError(f"{self._what}: {self._module} is not installed here: {self._install}")

    def __call__(self, *args, **kwargs):
        self._refuse()

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._refuse()

    def __repr__(self) -> str:
        return f"<absent {self._what}>"


def optional_name(module: str, name: str, install: str):
    """``from module import name`` where ``module`` is installed; an AbsentName where it is not."""
    found = optional_module(module, install)
    if isinstance(found, AbsentModule):
        return AbsentName(module, name, install)
    try:
        return getattr(found, name)
    except AttributeError:  # a submodule not imported by its package
        return importlib.import_module(f"{module}.{name}")


def optional_module(name: str, install: str) -> ModuleType | AbsentModule:
    """The module ``name`` if it imports; an AbsentModule if it is not installed (an error inside it is raised)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.split(".")[0] and e.name != name:
            raise  # the library is there, and a module it imports is not
        return AbsentModule(name, install)
