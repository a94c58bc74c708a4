"""The API the runners call: validate_graph, validate_and_match, compile_graph, render_report, build_program."""

import numpy as np
import pytest

from common.errors import UserError
from device.api import (DeviceCompileError, build_program, compile_graph, render_report, validate_and_match,
                        validate_graph)
from device.graphs import GraphBuilder
from tests.device.graphs import mlp_graph


def _graph_with_two_unsupported_ops():
    b = GraphBuilder(file="net.py")
    x = b.input("x", (4, 8))
    labels = b.input("labels", (4,), "int32")
    y = b.op("sort", [x], (4, 8), framework_op="aten.sort.default", line=21)
    y = b.op("topk", [y], (4, 8), framework_op="aten.topk.default", line=22)
    logits = b.dense(y, 3, name="fc")
    b.cross_entropy(logits, labels)
    return b.graph


def test_validate_graph_raises_nothing():
    report = validate_graph(mlp_graph(), mode="train_and_eval", profile_name="wse9")
    assert not report.ok
    assert {f.kind for f in report.errors} == {"mode", "profile"}
    assert "valid profiles" in report.to_text()


def test_validate_graph_reports_unsupported_ops():
    report = validate_graph(_graph_with_two_unsupported_ops(), mode="train", profile_name="tiny")
    assert [(f.file, f.line) for f in report.errors] == [("net.py", 21), ("net.py", 22)]


def test_compile_raises_with_the_summary_and_every_line_and_writes_nothing(tmp_path):
    out_dir = tmp_path / "compile"
    with pytest.raises(DeviceCompileError) as info:
        compile_graph(_graph_with_two_unsupported_ops(), mode="train", profile_name="tiny", out_dir=out_dir)
    lines = str(info.value).splitlines()
    assert lines[0].startswith("validation failed: 2 error(s)")
    assert lines[1].startswith("net.py:21: aten.sort.default: ")
    assert lines[2].startswith("net.py:22: aten.topk.default: ")
    assert isinstance(info.value, UserError)
    assert not out_dir.exists()  # created only after success


def test_a_failed_compile_keeps_the_last_good_report(tmp_path):
    compile_graph(mlp_graph(), mode="train", profile_name="tiny", out_dir=tmp_path)
    good = (tmp_path / "report.txt").read_text()
    with pytest.raises(DeviceCompileError):
        compile_graph(mlp_graph(sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny", out_dir=tmp_path)
    assert (tmp_path / "report.txt").read_text() == good


def test_compile_result():
    graph = mlp_graph()
    result = compile_graph(graph, mode="train", profile_name="tiny")
    assert result.out_dir is None and result.validation.ok
    assert [k.kind for k in result.kernels] == ["dense", "dense", "dense", "softmax_loss"]
    assert result.placement.profile == "tiny" and result.cost.samples_per_s > 0
    assert result.to_dict()["num_params"] == graph.num_params()


def test_eval_compiles_without_backward_memory():
    result = compile_graph(mlp_graph(), mode="eval", profile_name="tiny")
    assert all(r.gradient_bytes == 0 for r in result.placement.kernels)
    assert result.placement.optimizer == "none"


def test_unknown_profile_and_execution_mode_are_user_errors():
    with pytest.raises(UserError, match="unknown device profile 'cs9'"):
        compile_graph(mlp_graph(), mode="train", profile_name="cs9")
    with pytest.raises(UserError, match="valid modes: pipelined, weight_streaming"):
        compile_graph(mlp_graph(), mode="train", profile_name="tiny", execution_mode="pipeline")


def test_too_large_for_pipelined_compiles_with_weight_streaming():
    graph = mlp_graph(sizes=(784, 2048, 2048, 10))
    with pytest.raises(DeviceCompileError, match="device.execution_mode=weight_streaming"):
        compile_graph(graph, mode="train", profile_name="tiny")
    result = compile_graph(graph, mode="train", profile_name="tiny", execution_mode="weight_streaming")
    assert result.cost.samples_per_s > 0


def test_validate_and_match_matches_only_a_valid_graph():
    report, kernels = validate_and_match(mlp_graph(), mode="train", profile_name="tiny")
    assert report.ok and [k.kind for k in kernels] == ["dense", "dense", "dense", "softmax_loss"]
    report, kernels = validate_and_match(_graph_with_two_unsupported_ops(), mode="train", profile_name="tiny")
    assert not report.ok and kernels == []


def test_render_report_and_build_program():
    graph = mlp_graph(batch=4, sizes=(6, 5, 3))
    assert render_report(compile_graph(graph, mode="train", profile_name="tiny")).startswith("Device compile report")
    rng = np.random.default_rng(0)
    weights = {fw: rng.standard_normal(graph.values[v].shape).astype(np.float32) for v, fw in graph.params.items()}
    program = build_program(graph, weights, seed=1)
    batch = [rng.standard_normal((4, 6)).astype(np.float32), np.array([0, 2, 1, 0], np.int32)]
    first = program.train_step(batch, lr=0.01)
    assert np.isfinite(first) and program.eval_step(batch)["loss"] < first
