"""The lowered graph of every zoo model has a golden snapshot: the kernels its compile gives
(kind, ops, parameters, flops, weight bytes, source line). A change to capture, matching or
a model shows up here as a diff; `pytest tests/test_zoo_golden.py --update-golden` rewrites
the snapshots after a deliberate change."""

import importlib.util
import json
import os

import pytest

from common import zoo

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
FRAMEWORK_MODULE = {"tf": "tensorflow", "pytorch": "torch"}


def snapshot(report: dict) -> dict:
    def relative(loc: str) -> str:  # "/abs/repo/tf/mnist/model.py:29 (MatMul)" -> "tf/mnist/model.py:29 (MatMul)"
        return loc.replace(zoo.ROOT + os.sep, "")

    return {
        "frontend": report["frontend"],
        "num_params": report["num_params"],
        "kernels": [{"name": k["name"], "kind": k["kind"], "ops": k["ops"], "params": k["params"],
                     "flops_fwd": k["flops_fwd"], "weight_bytes": k["weight_bytes"], "loc": relative(k["loc"])}
                    for k in report["kernels"]],
    }


@pytest.mark.parametrize("folder", zoo.model_folders(), ids=lambda f: os.path.relpath(f, zoo.ROOT))
def test_lowered_graph_matches_its_golden_snapshot(folder, tmp_path, request):
    framework = os.path.basename(os.path.dirname(folder))
    if importlib.util.find_spec(FRAMEWORK_MODULE[framework]) is None:
        pytest.skip(f"{framework} not installed")
    result = zoo.run_folder(folder, ["--compile_only"], str(tmp_path / "md"))
    assert result.returncode == 0, result.stderr[-2000:]
    with open(tmp_path / "md" / "compile" / "report.json") as f:
        got = snapshot(json.load(f))
    path = os.path.join(GOLDEN, os.path.relpath(folder, zoo.ROOT).replace(os.sep, "_") + ".json")
    if request.config.getoption("--update-golden"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            json.dump(got, f, indent=1)
            f.write("\n")
    with open(path) as f:
        assert got == json.load(f), "the lowered graph changed; if deliberately, rerun with --update-golden"
