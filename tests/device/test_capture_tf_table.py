"""The TF frontend's op type -> mapping table (device/capture/tf/table.py): one literal, the one
place an op is added, each key an op TF has; and no module of device/capture over 600 lines
(the mappings live by family, as the PyTorch frontend's handlers do).

The first and last tests read the source only (no framework); the second imports TensorFlow.
"""

from __future__ import annotations

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPTURE = os.path.join(ROOT, "device", "capture")
MAX_LINES = 600


def capture_sources() -> dict[str, str]:
    sources = {}
    for directory, _, files in os.walk(CAPTURE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    sources[os.path.relpath(path, ROOT)] = f.read()
    return sources


def test_the_mapping_table_is_one_literal_in_table_py():
    assigned, changed = [], []
    for path, source in capture_sources().items():
        for node in ast.walk(ast.parse(source, path)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id == "MAPPINGS":
                    assigned.append((path, node.value))
                elif isinstance(target, ast.Subscript) and ast.unparse(target.value) == "MAPPINGS":
                    changed.append(f"{path}:{node.lineno}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func.value) == "MAPPINGS" and node.func.attr in ("update", "setdefault"):
                changed.append(f"{path}:{node.lineno}")
    assert [path for path, _ in assigned] == [os.path.join("device", "capture", "tf", "table.py")]
    assert changed == []
    table = assigned[0][1]
    assert isinstance(table, ast.Dict)
    keys = [key.value if isinstance(key, ast.Constant) else None for key in table.keys]
    assert None not in keys  # no ** splat, no computed key: every op is a line of its own
    assert len(keys) == len(set(keys))


def test_every_key_is_an_op_tf_has():
    tf = pytest.importorskip("tensorflow")
    from device.capture.tf.table import MAPPINGS

    assert [key for key in MAPPINGS if not hasattr(tf.raw_ops, key)] == []
    assert "AddV2" in MAPPINGS and "TruncateMod" in MAPPINGS and "StatefulPartitionedCall" in MAPPINGS


def test_no_capture_module_is_over_600_lines():
    lengths = {path: source.count("\n") for path, source in capture_sources().items()}
    assert {path: n for path, n in lengths.items() if n > MAX_LINES} == {}
    assert lengths[os.path.join("device", "capture", "tf", "table.py")] > 0
