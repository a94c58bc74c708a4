"""The compile report in model_dir/compile/: what a person reads after --compile_only.

    report.txt     validation summary, "Estimated overall performance", per-kernel table, memory per kernel
    report.json    the same data
    ir.json        the captured graph (Graph.to_dict())
    placement.svg  the fabric to scale, one coloured, labelled rectangle per kernel, a legend

Every file is rendered in memory first, then written atomically (common.io), so a failed
or interrupted compile never leaves a half-written report over a good one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from common.io import atomic_write_text

# colour per kernel kind (layout kernels take no PEs and are not drawn)
KIND_COLOURS = {
    "dense": "#4e79a7", "conv": "#f28e2b", "attention": "#e15759", "matmul": "#86bcb6", "pool": "#76b7b2",
    "layer_norm": "#59a14f", "batch_norm": "#edc948", "embedding": "#b07aa1", "softmax_loss": "#ff9da7",
    "softmax": "#9c755f", "elementwise": "#bab0ac", "reduce": "#8cd17d", "unsupported": "#333333",
}


def write_report(result, out_dir: str | Path) -> dict[str, Path]:
    """Write the four report files of ``result`` (a device.api.CompileResult) into ``out_dir``."""
    contents = {
        "report.txt": render_text(result),
        "report.json": json.dumps(_finite(result.to_dict()), indent=2) + "\n",
        "ir.json": json.dumps(_finite(result.graph.to_dict()), indent=2) + "\n",
        "placement.svg": render_svg(result),
    }
    out_dir = Path(out_dir)
    for name, text in contents.items():
        atomic_write_text(out_dir / name, text)
    return {name: out_dir / name for name in contents}


def _finite(obj: Any) -> Any:
    """JSON has no inf or nan: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


# -- report.txt ---------------------------------------------------------------------


def render_text(result) -> str:
    graph, cost, placement, profile = result.graph, result.cost, result.placement, result.profile
    lines = [
        "Device compile report: every figure below is an estimate of the emulator's cost model, not a measurement",
        f"  model       {graph.frontend} graph, {len(graph.nodes)} nodes, {graph.num_params():,} parameters, "
        f"compute {graph.precision}, batch {cost.batch_size}",
        f"  target      {profile.name} ({profile.description}; {profile.width} x {profile.height} PEs, "
        f"{profile.clock_hz / 1e9:.3f} GHz), {result.execution_mode}, mode {result.mode}, "
        f"optimizer {placement.optimizer}",
        "",
        "Validation",
        f"  {result.validation.summary()}",
    ]
    lines += [f"  {line}" for line in result.validation.to_text().splitlines()]
    slowest = max(cost.kernels, key=lambda k: k.time_s, default=None)
    peak = f"{cost.peak_flops / 1e12:,.1f} TFLOP/s {graph.precision} peak of the fabric"
    lines += [
        "",
        "Estimated overall performance",
        f"  samples/s                 {_num(cost.samples_per_s)}   "
        f"(the smaller of the two below; bound by {cost.bound_by})",
        f"  compute samples/s         {_num(cost.compute_samples_per_s)}"
        + (f"   (slowest kernel: {slowest.name}, bound by {slowest.bound_by})"
           if slowest and slowest.time_s > 0 and result.execution_mode == "pipelined" else ""),
        f"  transmission samples/s    {_num(cost.transmission_samples_per_s)}   "
        f"(system I/O {profile.system_io_bits_s / 1e12:g} Tb/s, {cost.input_bytes_per_sample:,.0f} bytes of input "
        "per sample)",
        f"  active PEs                {cost.active_pes_pct:.1f} %   ({cost.active_pes:,} of {cost.fabric_pes:,})",
        f"  compute utilisation       {cost.compute_utilisation_pct:.1f} %   (of the {peak})",
        f"  flops per sample          {cost.flops_per_sample:,.0f}" + ("   (forward + backward)" if result.training
                                                                       else "   (forward)"),
    ]
    if result.execution_mode == "weight_streaming":
        lines.append(f"  iteration bubble          {cost.bubble_s * 1e6:,.1f} us")
    free = sum(1 for c in cost.kernels if c.bound_by == "free")
    lines += ["", f"Kernels (estimates for one batch of {cost.batch_size}"
                  + (f"; {free} free layout kernels not listed)" if free else ")")]
    table = [("kernel", "kind", "PEs", "rectangle x,y,w,h", "flops", "SRAM bytes", "fabric bytes", "time",
              "bound by", "source")]
    for k, c in zip(result.kernels, cost.kernels):
        if c.bound_by == "free":
            continue
        rect = placement.get(k.name)
        table.append((k.name, k.kind, f"{c.pes:,}", f"{rect.x},{rect.y},{rect.w},{rect.h}", _si(c.flops),
                      _si(c.sram_bytes), _si(c.fabric_bytes), f"{_si(c.time_s)}s", c.bound_by, k.loc))
    lines += _table(table)
    lines += ["", f"Memory per kernel (SRAM, {profile.sram_bytes_per_pe:,} bytes per PE; "
                  "activations: samples in flight x inputs per sample)"]
    table = [("kernel", "weights", "gradients", "optimizer", "state", "activations", "in flight", "total",
              "per PE", "of PE SRAM")]
    for rect in placement.kernels:
        if not rect.pes:
            continue
        table.append((rect.name, _bytes(rect.weight_bytes), _bytes(rect.gradient_bytes),
                      _bytes(rect.optimizer_bytes), _bytes(rect.state_bytes), _bytes(rect.activation_bytes),
                      str(rect.inflight), _bytes(rect.memory_bytes), _bytes(rect.memory_per_pe),
                      f"{100 * rect.memory_per_pe / profile.sram_bytes_per_pe:.0f} %"))
    lines += _table(table)
    return "\n".join(lines) + "\n"


def _num(x: float) -> str:
    return f"{x:>14,.1f}" if math.isfinite(x) else f"{'unbounded':>14}"


def _si(x: float) -> str:
    """3 significant digits with an SI prefix: 1.23 G, 456 u."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} "
    exponent = max(-4, min(4, int(math.floor(math.log10(abs(x)) / 3))))
    prefix = {-4: "p", -3: "n", -2: "u", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T"}[exponent]
    return f"{x / 1000.0**exponent:.3g} {prefix}"


def _bytes(n: float) -> str:
    return f"{_si(n)}B"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


# -- placement.svg ------------------------------------------------------------------

_MAX_PX = 900  # longest side of the drawn fabric
_LEGEND_PX = 260


def render_svg(result) -> str:
    placement, profile = result.placement, result.profile
    scale = _MAX_PX / max(placement.width, placement.height)
    fw, fh = placement.width * scale, placement.height * scale
    top, left = 50, 20
    kinds = [k for k in KIND_COLOURS if any(r.kind == k and r.pes for r in placement.kernels)]
    width = left + fw + 20 + _LEGEND_PX
    height = max(top + fh + 40, top + 30 + 22 * (len(kinds) + 2))
    title = (f"{profile.name}: {placement.width} x {placement.height} PEs, {result.execution_mode}, "
             f"active PEs {result.cost.active_pes_pct:.1f} % (estimate)")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="30" font-size="16">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{fw:.2f}" height="{fh:.2f}" fill="#f4f4f4" stroke="#555"/>']
    if result.execution_mode == "weight_streaming":
        out += _streaming_body(result, left, top, fw, fh)
    else:
        for i, rect in enumerate(r for r in placement.kernels if r.pes):
            out += _kernel_rect(rect, i, left, top, scale)
    # legend: one swatch per kind, with how many kernels and PEs it holds
    x = left + fw + 20
    out.append(f'<text x="{x}" y="{top + 14}" font-size="14">kernel kinds</text>')
    for j, kind in enumerate(kinds):
        rows = [r for r in placement.kernels if r.kind == kind and r.pes]
        y = top + 30 + 22 * j
        out.append(f'<rect x="{x}" y="{y}" width="16" height="16" fill="{KIND_COLOURS[kind]}" stroke="#333"/>')
        out.append(f'<text x="{x + 22}" y="{y + 13}" font-size="12">{escape(kind)}: {len(rows)} kernel(s), '
                   f'{sum(r.pes for r in rows):,} PEs</text>')
    y = top + 30 + 22 * len(kinds) + 8
    out.append(f'<text x="{x}" y="{y + 13}" font-size="11" fill="#555">grey: idle PEs; hover a '
               'rectangle for its figures</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _kernel_rect(rect, index: int, left: float, top: float, scale: float) -> list[str]:
    x, y, w, h = left + rect.x * scale, top + rect.y * scale, rect.w * scale, rect.h * scale
    colour = KIND_COLOURS.get(rect.kind, "#999999")
    # alternate the stroke weight so that neighbours of one kind stay apart
    parts = [f'<g><title>{escape(rect.name)} ({escape(rect.kind)}): {rect.pes:,} PEs at x={rect.x} y={rect.y}, '
             f'{rect.memory_per_pe / 1024:.1f} KiB per PE</title>',
             f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{colour}" '
             f'fill-opacity="{0.95 if index % 2 else 0.75}" stroke="white" stroke-width="0.5"/>']
    font = min(12.0, h * 0.6, w / max(1, 0.62 * len(rect.name)))
    if font >= 4:
        parts.append(f'<text x="{x + w / 2:.2f}" y="{y + h / 2 + font / 3:.2f}" font-size="{font:.1f}" '
                     f'text-anchor="middle" fill="black">{escape(rect.name)}</text>')
    parts.append("</g>")
    return parts


def _streaming_body(result, left: float, top: float, fw: float, fh: float) -> list[str]:
    """Weight streaming: every kernel takes the whole fabric in turn; list them in run order."""
    rows = [r for r in result.placement.kernels if r.pes]
    shown = rows[:40]
    out = [f'<text x="{left + 10}" y="{top + 24}" font-size="14">weight streaming: each kernel below takes '
           'the whole fabric in turn</text>']
    for i, rect in enumerate(shown):
        y = top + 44 + i * min(20, (fh - 60) / max(1, len(shown)))
        colour = KIND_COLOURS.get(rect.kind, "#999999")
        out.append(f'<rect x="{left + 10}" y="{y:.1f}" width="12" height="12" fill="{colour}"/>')
        out.append(f'<text x="{left + 28}" y="{y + 10:.1f}" font-size="11">{i + 1}. {escape(rect.name)} '
                   f'({escape(rect.kind)}), {rect.memory_per_pe / 1024:.1f} KiB per PE</text>')
    if len(rows) > len(shown):
        out.append(f'<text x="{left + 10}" y="{top + fh - 10:.1f}" font-size="11">... and {len(rows) - len(shown)} '
                   'more (report.txt lists them all)</text>')
    return out
