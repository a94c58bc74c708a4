"""The layers below the runners, read from the import statements (nothing is imported here).

device/ imports nothing from common/ (the runners) or tests/, zoo_base/ imports nothing of
the zoo, and no stage after capture imports a framework: the compiled program runs on
numpy alone (device/README.md, "Rooms and doors"). No two modules of device/ or of common/
import each other in a cycle, counting every import: at module level, in a function, or
type-only (under ``if TYPE_CHECKING:``).
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


# --- the runners' side: one door into device/, no import cycle among common/ ------------------

RUNNER_FOLDERS = ("common", "pytorch", "tf")


def module_name(path: str) -> str:
    parts = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: str, known: set[str]) -> set[str]:
    """The modules of ``known`` the file imports, at module level or inside a function alike:
    ``from package import name`` counts as an import of ``package.name`` where that is a module."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module_name(path) if path.endswith("__init__.py") else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the file's package up level - 1 folders
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {name for name in found if name in known}


def device_modules_named(path: str) -> set[str]:
    """The device modules the file imports (``from device import capture`` names device.capture)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if top_level(alias.name) == "device")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "device":
            names.update(f"device.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and top_level(node.module or "") == "device":
            names.add(node.module)
    return names


def test_the_runners_reach_device_only_through_device_api():
    offenders = {os.path.relpath(path, ROOT): sorted(device_modules_named(path) - {"device.api"})
                 for folder in RUNNER_FOLDERS for path in python_files(folder)}
    assert {path: modules for path, modules in offenders.items() if modules} == {}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def import_graph(folder: str) -> dict[str, set[str]]:
    """Each module of the folder -> the modules of the folder it imports."""
    paths = python_files(folder)
    known = {module_name(path) for path in paths}
    return {module_name(path): imports_of(path, known) - {module_name(path)} for path in paths}


def test_import_cycles_are_found():
    # the finder itself, on a made-up graph: a <-> b is a cycle, c -> a is not part of it
    assert import_cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_a_type_only_import_is_an_import(tmp_path):
    # annotations alone still tie two modules together: an import under TYPE_CHECKING is an edge
    source = tmp_path / "module.py"
    source.write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.other import Thing\n")
    assert imports_of(str(source), {"pkg.other", "pkg.unused"}) == {"pkg.other"}



def test_no_import_cycle_among_the_runners_modules():
    graph = import_graph("common")
    assert "common.tf.device_run" in graph["common.tf.estimator.cs_estimator"]  # a function-level import counts
    assert import_cycles(graph) == []


def test_no_import_cycle_in_the_pytorch_frontend():
    # its modules import one way: export -> table -> the handlers -> lowering -> step -> source;
    # the lowering is handed the table, so that the handlers can import the lowering
    graph = import_graph("device")
    assert "device.capture.torch.table" in graph["device.capture.torch.export"]
    assert "device.capture.torch.lowering" in graph["device.capture.torch.elementwise"]
    torch_cycles = [cycle for cycle in import_cycles(graph) if any(m.startswith("device.capture.torch") for m in cycle)]
    assert torch_cycles == []


def test_the_tf_lowering_imports_none_of_its_rules():
    # as the PyTorch frontend's: the package's capture hands the lowering its rules (table.py's
    # MAPPINGS, patterns.py, loops.py), so that their modules import the lowering at module level
    graph = import_graph("device")
    assert {"device.capture.tf.table", "device.capture.tf.patterns", "device.capture.tf.loops"} <= \
        graph["device.capture.tf"]
    assert "device.capture.tf.lowering" in graph["device.capture.tf.elementwise"]
    assert "device.capture.tf.lowering" in graph["device.capture.tf.loops"]
    assert graph["device.capture.tf.lowering"] & {"device.capture.tf.table", "device.capture.tf.patterns",
                                                   "device.capture.tf.loops"} == set()


def test_no_import_cycle_in_device():
    # type-only imports included (imports_of reads them): the TF frontend's lowering and its
    # mappings, patterns and loops were one such cycle
    assert import_cycles(import_graph("device")) == []
