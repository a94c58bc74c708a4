"""The report files in model_dir/compile/."""

import json
from xml.etree import ElementTree

import pytest

from device import report as report_module
from device.api import compile_graph
from device.testing import attention_graph, mlp_graph

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def compiled(tmp_path):
    return compile_graph(attention_graph(), mode="train", profile_name="tiny", out_dir=tmp_path / "compile")


def test_writes_the_four_files_and_nothing_else(compiled):
    out = compiled.out_dir
    assert sorted(p.name for p in out.iterdir()) == ["ir.json", "placement.svg", "report.json", "report.txt"]


def test_report_txt_has_the_performance_block_table_and_memory(compiled):
    text = (compiled.out_dir / "report.txt").read_text()
    assert "estimate" in text.splitlines()[0]
    assert "validation passed" in text
    block = text[text.index("Estimated overall performance"):]
    for label in ("samples/s", "compute samples/s", "transmission samples/s", "active PEs", "compute utilisation"):
        assert label in block
    assert "Kernels (estimates" in text and "bound by" in text and "Memory per kernel" in text
    for kernel in compiled.kernels:
        if not kernel.free:
            assert kernel.name in text
    assert "model.py:" in text  # each kernel's source line


def test_report_json_holds_the_same_data(compiled):
    data = json.loads((compiled.out_dir / "report.json").read_text())
    performance = data["performance"]
    assert performance["estimate"] is True
    assert performance["samples_per_s"] == pytest.approx(compiled.cost.samples_per_s)
    assert performance["active_pes_pct"] == pytest.approx(compiled.cost.active_pes_pct)
    assert data["validation"]["ok"] is True
    assert [k["name"] for k in data["kernels"]] == [k.name for k in compiled.kernels]
    assert len(data["placement"]["kernels"]) == len(compiled.kernels)


def test_ir_json_is_the_graph(compiled):
    assert json.loads((compiled.out_dir / "ir.json").read_text()) == json.loads(json.dumps(compiled.graph.to_dict()))


def test_placement_svg_draws_every_placed_kernel_to_scale_with_a_legend(compiled):
    root = ElementTree.parse(compiled.out_dir / "placement.svg").getroot()
    titles = [t.text for t in root.iter(f"{SVG}title")]
    placed = [r for r in compiled.placement.kernels if r.pes]
    assert len(titles) == len(placed)
    for row in placed:
        assert any(t.startswith(f"{row.name} ({row.kind})") for t in titles)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "dense_0" in texts  # big enough to be labelled
    assert any(t and t.startswith("dense: 5 kernel(s)") for t in texts)  # the legend
    fabric = [r for r in root.iter(f"{SVG}rect") if r.get("fill") == "#f4f4f4"][0]
    assert float(fabric.get("width")) == pytest.approx(float(fabric.get("height")))  # 32 x 32 stays square


def test_weight_streaming_svg_lists_the_kernels(tmp_path):
    result = compile_graph(mlp_graph(sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                           execution_mode="weight_streaming", out_dir=tmp_path)
    svg = (tmp_path / "placement.svg").read_text()
    assert "weight streaming" in svg and "1. dense_0 (dense)" in svg
    assert result.cost.execution_mode == "weight_streaming"
    assert "iteration bubble" in (tmp_path / "report.txt").read_text()


def test_a_failure_while_rendering_leaves_the_old_report_untouched(tmp_path, monkeypatch):
    compile_graph(mlp_graph(), mode="train", profile_name="tiny", out_dir=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(result):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(report_module, "render_svg", broken)
    with pytest.raises(RuntimeError):
        compile_graph(attention_graph(), mode="train", profile_name="tiny", out_dir=tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no partial files, no temp files
