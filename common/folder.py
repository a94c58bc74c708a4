"""Import a model folder's modules by path, each folder under a package name of its own.

A model folder (``pytorch/mnist``) is not an installed package: users copy it anywhere and
run its ``run.py``. Its ``run.py`` imports the modules beside it with ``import_beside``,
which loads the folder as a package whose name comes from its absolute path. So
``model``/``data``/``utils`` of two folders never clash in one process (the test suite
imports every folder), and a copied folder works without editing imports. Inside a folder,
modules import each other relatively (``from .utils import ...``).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import re
import sys
from types import ModuleType


def folder_package(folder: str) -> str:
    """Import the folder as a package (once) and return its name."""
    folder = os.path.realpath(folder)
    slug = re.sub(r"\W", "_", os.path.basename(folder)) or "model"
    name = f"zoo_folder_{slug}_{hashlib.sha1(folder.encode()).hexdigest()[:10]}"
    if name not in sys.modules:
        init = os.path.join(folder, "__init__.py")
        if os.path.exists(init):
            spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[folder])
        else:  # a folder without __init__.py: a package with no code of its own
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [folder]
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        if spec.loader is not None:
            spec.loader.exec_module(package)
    return name


def import_beside(file: str, *names: str) -> tuple[ModuleType, ...] | ModuleType:
    """``model, data, utils = import_beside(__file__, "model", "data", "utils")``."""
    package = folder_package(os.path.dirname(os.path.abspath(file)))
    modules = tuple(importlib.import_module(f"{package}.{n}") for n in names)
    return modules[0] if len(modules) == 1 else modules


def load_run_module(folder: str) -> ModuleType:
    """The ``run`` module of a model folder (tests and tox use it to run every folder in one process)."""
    return importlib.import_module(f"{folder_package(folder)}.run")
