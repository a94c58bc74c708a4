"""The layers below the runners, read from the import statements (nothing is imported here).

device/ imports nothing from common/ (the runners) or tests/, zoo_base/ imports nothing of
the zoo, and no stage after capture imports a framework: the compiled program runs on
numpy alone (device/README.md, "Rooms and doors").
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FRAMEWORKS = ("torch", "tensorflow", "keras")


def imported_modules(path: str) -> set[str]:
    """Every module an ``import`` or ``from ... import`` of the file names (absolute imports only)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def python_files(folder: str) -> list[str]:
    found = []
    for directory, _, files in os.walk(os.path.join(ROOT, folder)):
        found += [os.path.join(directory, f) for f in files if f.endswith(".py")]
    return sorted(found)


def top_level(module: str) -> str:
    return module.split(".")[0]


def test_device_imports_neither_the_runners_nor_the_tests():
    offenders = {os.path.relpath(path, ROOT): sorted(m for m in imported_modules(path)
                                                     if top_level(m) in ("common", "tests"))
                 for path in python_files("device")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_zoo_base_imports_nothing_of_the_zoo():
    offenders = {os.path.relpath(path, ROOT): sorted(m for m in imported_modules(path)
                                                     if top_level(m) in ("common", "device", "tests"))
                 for path in python_files("zoo_base")}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def test_only_the_capture_frontends_import_a_framework():
    capture = os.path.join(ROOT, "device", "capture") + os.sep
    offenders = {os.path.relpath(path, ROOT): sorted(m for m in imported_modules(path)
                                                     if top_level(m) in FRAMEWORKS)
                 for path in python_files("device") if not path.startswith(capture)}
    assert {path: modules for path, modules in offenders.items() if modules} == {}
