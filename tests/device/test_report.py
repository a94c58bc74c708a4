"""The report files in model_dir/compile/."""

import json
import re
from xml.etree import ElementTree

import pytest

from device import report as report_module
from device.api import compile_graph
from tests.device.graphs import attention_graph, mlp_graph

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
    for i, row in enumerate(placed):
        assert any(t.startswith(f"{i + 1}. {row.name} ({row.kind}): {row.pes:,} PEs") for t in titles)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "dense_0" in texts  # big enough to be labelled
    fabric = [r for r in root.iter(f"{SVG}rect") if r.get("fill") == "#f4f4f4"][0]
    assert float(fabric.get("width")) == pytest.approx(float(fabric.get("height")))  # 32 x 32 stays square


def _svg(result):
    root = ElementTree.parse(result.out_dir / "placement.svg").getroot()
    fabric = next(r for r in root.iter(f"{SVG}rect") if r.get("fill") == "#f4f4f4")  # the legend's idle swatch is later
    return root, [t.text or "" for t in root.iter(f"{SVG}text")], fabric


def _kernel_rects(root):
    """{kernel name: (x, y, w, h)} of the rectangles that carry a kernel's tooltip."""
    out = {}
    for group in root.iter(f"{SVG}g"):
        title, rect = group.find(f"{SVG}title"), group.find(f"{SVG}rect")
        name = title.text.split(" ")[1]  # "3. dense_2 (dense): ..."
        out[name] = tuple(float(rect.get(k)) for k in ("x", "y", "width", "height"))
    return out


@pytest.fixture
def mnist_sized(tmp_path):
    """784-64-32-10 on wse2: the last kernels are a row or a few tall, under 3 pixels at the drawing's scale."""
    return compile_graph(mlp_graph(), mode="train", profile_name="wse2", out_dir=tmp_path / "compile")


def test_placement_svg_draws_small_kernels_with_a_scale_and_lists_every_kernel(mnist_sized):
    root, texts, fabric = _svg(mnist_sized)
    placement = mnist_sized.placement
    px_per_pe = float(fabric.get("width")) / placement.width
    loss = placement.get("softmax_loss_0")
    assert min(loss.w, loss.h) * px_per_pe < 3  # to scale it would be drawn under 3 px
    rects = _kernel_rects(root)
    placed = [r for r in placement.kernels if r.pes]
    assert sorted(rects) == sorted(r.name for r in placed)
    for name, (x, y, w, h) in rects.items():
        assert w >= 3 and h >= 3, name  # the minimum drawn size
        row = placement.get(name)
        if row.w * px_per_pe >= 3:
            assert w == pytest.approx(row.w * px_per_pe, abs=0.01)  # otherwise to scale
    # the scale bar: a line as long as the PEs its label names
    (label,) = [t for t in texts if t.startswith("scale: ")]
    pes = int(re.match(r"scale: ([\d,]+) PEs", label).group(1).replace(",", ""))
    (bar,) = [line for line in root.iter(f"{SVG}line") if line.get("stroke-width") == "2"]
    assert float(bar.get("x2")) - float(bar.get("x1")) == pytest.approx(pes * px_per_pe, abs=0.01)
    # the legend: every kernel with its PEs and its bound, as in report.txt
    bounds = {c.name: c.bound_by for c in mnist_sized.cost.kernels}
    for i, row in enumerate(placed):
        assert any(t.startswith(f"{i + 1}. {row.name} ({row.kind}): {row.pes:,} PEs, ")
                   and t.endswith(f"bound by {bounds[row.name]}") for t in texts)
    # a kernel too small for its name carries its number, inside or beside the fabric
    assert {str(i + 1) for i, row in enumerate(placed) if row.name not in texts} <= set(texts)


def test_weight_streaming_svg_is_the_whole_fabric_in_turn(tmp_path):
    result = compile_graph(mlp_graph(sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                           execution_mode="weight_streaming", out_dir=tmp_path)
    root, texts, fabric = _svg(result)
    fabric_pes = result.placement.fabric_pes
    # no text adds up PEs across kernels: each kernel has all of them, in turn
    counts = [int(n.replace(",", "")) for t in texts for n in re.findall(r"([\d,]+) PEs", t)]
    assert counts and max(counts) == fabric_pes
    legend = [t for t in texts if re.match(r"\d+\. .* PEs", t)]
    assert legend == [f"{i + 1}. {c.name} ({c.kind}): all {fabric_pes:,} PEs for {report_module._si(c.time_s)}s, "
                      f"bound by {c.bound_by}" for i, c in enumerate(c for c in result.cost.kernels if c.pes)]
    # the fabric is covered, not idle: bands of one iteration's time, left to right, then the bubble
    bands = [r for r in root.iter(f"{SVG}rect") if r.get("height") == fabric.get("height") and r is not fabric]
    assert len(bands) == len(legend) + 1
    assert sum(float(b.get("width")) for b in bands) == pytest.approx(float(fabric.get("width")))
    assert min(float(b.get("width")) for b in bands) >= 3
    assert "iteration bubble" in (tmp_path / "report.txt").read_text()


def test_weight_streaming_summary_agrees_with_its_rows(tmp_path):
    """Was "bound by compute" above rows that all said "weight stream"."""
    result = compile_graph(mlp_graph(sizes=(784, 2048, 2048, 10)), mode="train", profile_name="tiny",
                           execution_mode="weight_streaming", out_dir=tmp_path)
    text = (tmp_path / "report.txt").read_text()
    lines = text.splitlines()
    assert lines[1].endswith("samples/s, bound by weight streaming")
    assert lines[2].startswith("  why         each kernel has the whole fabric in turn; of each ")
    assert "3 of 4 kernels that are bound by weight streaming" in lines[2] and "bubble" in lines[2]
    assert "(the smaller of the two below; bound by weight streaming)" in text
    rows = _table_rows(text, "Kernels (")
    assert [row["bound by"] for row in rows] == [c.bound_by for c in result.cost.kernels if c.pes]
    assert [row["bound by"] for row in rows].count("weight streaming") == 3


def _table_rows(text: str, heading: str) -> list[dict[str, str]]:
    """The rows of the table under ``heading`` in report.txt, split at the header's column starts."""
    lines = text[text.index(heading):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  kernel "))
    header = lines[start]
    starts = [m.start() for m in re.finditer(r"(?<=  )\S", header)] + [None]
    names = [header[a:b].strip() for a, b in zip(starts, starts[1:])]
    rows = []
    for line in lines[start + 1:]:
        if not line.strip():
            break
        rows.append({n: line[a:b].strip() for n, a, b in zip(names, starts, starts[1:])})
    return rows


def test_first_lines_say_what_bounds_and_why_as_the_table_does(tmp_path, mnist_sized):
    text = (mnist_sized.out_dir / "report.txt").read_text().splitlines()
    cost = mnist_sized.cost
    assert text[1] == f"  throughput  {cost.samples_per_s:,.0f} samples/s, bound by input"
    assert text[2].startswith("  why         the system I/O (1.2 Tb/s) carries 3,140 bytes of input per sample")
    # bound by a kernel: the slowest, named with its line and the same bound as its row
    result = compile_graph(attention_graph(), mode="train", profile_name="tiny", out_dir=tmp_path / "attention")
    text = (tmp_path / "attention" / "report.txt").read_text()
    rows = _table_rows(text, "Kernels (")
    slowest = max(rows, key=lambda row: _seconds(row["time"]))
    bound = slowest["bound by"]
    assert result.cost.bound_by == bound != "input"
    assert text.splitlines()[1].endswith(f"bound by {bound}")
    assert text.splitlines()[2].startswith(f"  why         the slowest kernel, {slowest['kernel']} at model.py:")
    assert f"(slowest kernel: {slowest['kernel']}, bound by {bound})" in text


def _seconds(text: str) -> float:
    value, unit = text.split(" ")
    return float(value) * {"ps": 1e-12, "ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


def test_memory_is_in_bytes_and_binary_units_never_millibytes(mnist_sized):
    text = (mnist_sized.out_dir / "report.txt").read_text()
    assert not re.search(r"\d (mB|kB|MB)\b", text)
    rows = _table_rows(text, "Memory per kernel")
    per_pe = {row["kernel"]: row["per PE"] for row in rows}
    assert per_pe["softmax_loss_0"] == "1 B"  # 44 bytes over 96 PEs: the busiest PE holds whole bytes
    assert per_pe["dense_0"] == "17 B"  # 825,792 bytes over 50,304 PEs, rounded up
    assert [report_module._bytes(n) for n in (0, 0.09, 48, 1023, 1024, 100_480, 3 * 2**20, 2**31)] == [
        "0 B", "1 B", "48 B", "1,023 B", "1 KiB", "98.1 KiB", "3 MiB", "2 GiB"]


def test_a_failure_while_rendering_leaves_the_old_report_untouched(tmp_path, monkeypatch):
    compile_graph(mlp_graph(), mode="train", profile_name="tiny", out_dir=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def broken(result):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(report_module, "render_svg", broken)
    with pytest.raises(RuntimeError):
        compile_graph(attention_graph(), mode="train", profile_name="tiny", out_dir=tmp_path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no partial files, no temp files


def test_the_first_line_gives_a_slow_rate_in_significant_digits():
    from device.report import _headline

    # a 70B model's 0.8 samples/s must not read "1 samples/s"; large rates stay whole numbers
    assert [_headline(x) for x in (0.8123, 12.37, 99.4, 1234.4, 47_709_924.2)] == \
        ["0.812", "12.4", "99.4", "1,234", "47,709,924"]
