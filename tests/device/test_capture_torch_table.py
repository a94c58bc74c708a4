"""The PyTorch frontend's aten op -> handler table (device/capture/torch/table.py): one literal,
the one place an op is added, each key an op torch has.

The first test reads the source only (no framework); the second imports torch.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURE = os.path.join(ROOT, "device", "capture")


def capture_sources() -> dict[str, ast.Module]:
    trees = {}
    for directory, _, files in os.walk(CAPTURE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    trees[os.path.relpath(path, ROOT)] = ast.parse(f.read(), path)
    return trees


def test_the_lowering_table_is_one_literal_in_table_py():
    assigned, changed = [], []
    for path, tree in capture_sources().items():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id == "_LOWERINGS":
                    assigned.append((path, node.value))
                elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "_LOWERINGS":
                    changed.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) == "_LOWERINGS" and node.func.attr in ("update", "setdefault"):
                changed.append(f"{path}:{node.lineno}")
    assert [path for path, _ in assigned] == [os.path.join("device", "capture", "torch", "table.py")]
    assert changed == []
    table = assigned[0][1]
    assert isinstance(table, ast.Dict)
    keys = [key.value if isinstance(key, ast.Constant) else None for key in table.keys]
    assert None not in keys  # no ** splat, no computed key: every op is a line of its own
    assert len(keys) == len(set(keys))


def test_every_key_is_an_op_overload_torch_has():
    torch = pytest.importorskip("torch")
    from device.capture.torch.table import _LOWERINGS

    missing = []
    for key in _LOWERINGS:
        namespace, op, overload = key.split(".")
        if not hasattr(getattr(getattr(torch.ops, namespace), op, None), overload):
            missing.append(key)
    assert missing == []
    assert "aten.lstm.input" in _LOWERINGS and "zoo_device.ctc_loss.default" in _LOWERINGS
