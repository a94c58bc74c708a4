"""The compile report in model_dir/compile/: what a person reads after --compile_only.

    report.txt     validation summary, "Estimated overall performance", per-kernel table, memory per kernel
    report.json    the same data
    ir.json        the captured graph (Graph.to_dict())
    placement.svg  the fabric to scale with a scale bar, one coloured, numbered rectangle per kernel, and a
                   legend listing every kernel; in weight streaming, one iteration's time across the fabric
    systems.svg    weight streaming only: samples/s on 1 to 16 systems, beside linear scaling

Every file is rendered in memory first, then written atomically (zoo_base.io), so a failed
or interrupted compile never leaves a half-written report over a good one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from zoo_base.io import atomic_write_texts

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
    if result.cost.systems:
        contents["systems.svg"] = render_systems_svg(result.cost)
    out_dir = Path(out_dir)
    # all or none: a full disk midway keeps the previous compile's files, a consistent set
    atomic_write_texts({out_dir / name: text for name, text in contents.items()})
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


# what each bound means, as a kernel that is bound by it spends its time
_WAITS = {"compute": "computes (the PEs' arithmetic)", "memory": "waits on SRAM bandwidth",
          "fabric": "waits on the fabric links at its rectangle's edge",
          "weight streaming": "waits on its weights crossing the external link"}


def render_text(result) -> str:
    graph, cost, placement, profile = result.graph, result.cost, result.placement, result.profile
    lines = [
        "Device compile report: every figure below is an estimate of the emulator's cost model, not a measurement",
        f"  throughput  {_headline(cost.samples_per_s)} samples/s"
        + (f" ({cost.tokens_per_s:,.0f} tokens/s)" if cost.tokens_per_sample else "") + f", bound by {cost.bound_by}",
        f"  why         {_why(result)}",
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
    slowest = _slowest(cost)
    if result.execution_mode == "weight_streaming":
        pace = f"   (kernels one after another, plus the bubble; bound by {cost.compute_bound_by})"
    else:
        pace = f"   (slowest kernel: {slowest.name}, bound by {slowest.bound_by})" if slowest else ""
    peak = f"{cost.peak_flops / 1e12:,.1f} TFLOP/s {graph.precision} peak of the fabric"
    lines += [
        "",
        "Estimated overall performance",
        f"  samples/s                 {_num(cost.samples_per_s)}   "
        f"(the smaller of the two below; bound by {cost.bound_by})",
        f"  compute samples/s         {_num(cost.compute_samples_per_s)}" + pace,
        f"  transmission samples/s    {_num(cost.transmission_samples_per_s)}   "
        f"(system I/O {profile.system_io_bits_s / 1e12:g} Tb/s, {cost.input_bytes_per_sample:,.0f} bytes of input "
        "per sample)",
        f"  active PEs                {cost.active_pes_pct:.1f} %   ({cost.active_pes:,} of {cost.fabric_pes:,}"
        + ("; each kernel has them all, in turn)" if result.execution_mode == "weight_streaming" else ")"),
        f"  compute utilisation       {cost.compute_utilisation_pct:.1f} %   (of the {peak})",
        f"  flops per sample          {cost.flops_per_sample:,.0f}" + ("   (forward + backward)" if result.training
                                                                       else "   (forward)"),
    ]
    if cost.tokens_per_sample:
        lines.append(f"  tokens/s                  {_num(cost.tokens_per_s)}   ({cost.tokens_per_sample:,} tokens per "
                     "sample)")
    if result.execution_mode == "weight_streaming":
        crossing = ("the first kernel's weights and the last one's gradients cross" if result.training
                    else "the first kernel's weights cross")  # forward only: no gradients
        lines.append(f"  iteration bubble          {_si(cost.bubble_s)}s   ({crossing} the external link with "
                     "nothing to overlap)")
        if cost.micro_batches:
            passes = "pass" if cost.micro_batches == 1 else "passes"
            accumulate = ", the gradients accumulate in the external store" if result.training else ""
            lines.append(f"  micro-batch               {cost.micro_batch_size:,} samples x {cost.micro_batches:,} "
                         f"{passes} per batch of {cost.batch_size:,}   (device.micro_batch_size, or the largest whose "
                         f"activations fit beside a weight tile; every pass streams the weights again{accumulate})")
        if result.training:
            lines.append(_recompute_line(result.placement))
        lines += _external_memory(cost, result.training) + _systems_table(cost)
    free = sum(1 for c in cost.kernels if c.bound_by == "free")
    lines += ["", f"Kernels (estimates for one batch of {cost.batch_size}"
                  + (f"; {free} free layout kernels not listed)" if free else ")"),
              "  bound by: compute (the PEs' arithmetic), memory (SRAM bandwidth), fabric (links at the "
              "rectangle's edge)" + (", weight streaming (the external link)"
                                     if result.execution_mode == "weight_streaming" else "")]
    table = [("kernel", "kind", "PEs", "rectangle x,y,w,h", "flops", "SRAM bytes", "fabric bytes", "time",
              "bound by", "source")]
    for k, c in zip(result.kernels, cost.kernels):
        if c.bound_by == "free":
            continue
        rect = placement.get(k.name)
        table.append((k.name, k.kind, f"{c.pes:,}", f"{rect.x},{rect.y},{rect.w},{rect.h}", _si(c.flops),
                      _bytes(c.sram_bytes), _bytes(c.fabric_bytes), f"{_si(c.time_s)}s", c.bound_by, k.loc))
    lines += _table(table)
    lines += ["", f"Memory per kernel (SRAM, {_bytes(profile.sram_bytes_per_pe)} per PE; "
                  "activations: samples in flight x inputs per sample; per PE: the busiest PE, whole bytes)"]
    table = [("kernel", "weights", "gradients", "optimizer", "state", "activations", "in flight", "total",
              "per PE", "of PE SRAM")]
    for rect in placement.kernels:
        if not rect.pes:
            continue
        per_pe = math.ceil(rect.memory_per_pe)
        table.append((rect.name, _bytes(rect.weight_bytes), _bytes(rect.gradient_bytes),
                      _bytes(rect.optimizer_bytes), _bytes(rect.state_bytes), _bytes(rect.activation_bytes),
                      str(rect.inflight), _bytes(rect.memory_bytes), _bytes(per_pe),
                      f"{100 * per_pe / profile.sram_bytes_per_pe:.1f} %"))
    lines += _table(table)
    return "\n".join(lines) + "\n"


def _recompute_line(placement) -> str:
    """Weight streaming, training: whether activations are recomputed, with the bytes of one sample."""
    full = _mib(placement.full_activation_bytes_per_sample)
    if not placement.recompute:
        return (f"  activations               kept, not recomputed   ({full} a sample, from each kernel's forward to "
                "its backward)")
    inner = placement.activation_bytes_per_sample - placement.checkpoint_bytes_per_sample
    return (f"  activations               recomputed in the backward   (checkpoints at {placement.layers - 1:,} layer "
            f"boundaries, {_mib(placement.checkpoint_bytes_per_sample)} a sample, and the largest layer's inner "
            f"activations, {_mib(inner)}, against {full} to keep them all; each layer's forward runs again)")


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _external_memory(cost, training: bool) -> list[str]:
    if not cost.external_memory:
        return []
    memory = cost.external_memory
    parts = ", ".join(f"{name} {_bytes(n)}" for name, n in memory.items() if n)
    store = "holds the weights and runs the optimizer" if training else "holds the weights"
    return ["", f"External memory (weight streaming: the store that {store}, fp32)",
            f"  {_bytes(sum(memory.values()))} ({sum(memory.values()):,} bytes): {parts}"]


def _systems_table(cost) -> list[str]:
    """Data parallel on N systems through the broadcast-reduce tree, with a bar per row (the plot)."""
    if not cost.systems:
        return []
    one = cost.systems[0]["samples_per_s"]
    top = max(row["samples_per_s"] for row in cost.systems)
    table = [("systems", "batch per system", "micro-batches", "iteration", "samples/s", "tokens/s", "speed-up",
              "of linear", "")]
    for row in cost.systems:
        speedup = row["samples_per_s"] / one if one else 0.0
        bar = "#" * max(1, round(40 * row["samples_per_s"] / top)) if top else ""
        table.append((str(row["systems"]), f"{row['batch_per_system']:,}", str(row["micro_batches"]),
                      f"{_si(row['iteration_s'])}s", f"{row['samples_per_s']:,.1f}",
                      f"{row['tokens_per_s']:,.0f}" if cost.tokens_per_sample else "-", f"{speedup:.2f}x",
                      f"{100 * speedup / row['systems']:.0f} %", bar))
    return ["", f"Systems (weight streaming, data parallel: the batch of {cost.batch_size:,} shared by N systems "
                "through the broadcast-reduce tree; each tree level adds a bubble; estimates)"] + _table(table)


def _slowest(cost):
    return max((c for c in cost.kernels if c.bound_by != "free"), key=lambda c: c.time_s, default=None)


def _why(result) -> str:
    """One sentence on what bounds the estimate, in the figures of the table below it."""
    cost, profile = result.cost, result.profile
    if cost.bound_by == "input":
        could = (f"fewer than the {_rate(cost.compute_samples_per_s)} the compute could take"
                 if math.isfinite(cost.compute_samples_per_s) else "and no kernel computes")
        return (f"the system I/O ({profile.system_io_bits_s / 1e12:g} Tb/s) carries "
                f"{cost.input_bytes_per_sample:,.0f} bytes of input per sample, "
                f"{_rate(cost.transmission_samples_per_s)}, {could}")
    input_could = f"the input could carry {_rate(cost.transmission_samples_per_s)}"
    if not math.isfinite(cost.compute_samples_per_s):
        return f"the graph has no kernel that computes, and {input_could}"
    bound = cost.compute_bound_by
    if result.execution_mode == "weight_streaming":
        working = [c for c in cost.kernels if c.bound_by != "free"]
        share = cost.iteration_by_bound[bound]
        kernels = sum(1 for c in working if c.bound_by == bound)
        bubble = (f" and the {_si(cost.bubble_s)}s bubble" if bound == "weight streaming" and cost.bubble_s > 0
                  else "")
        link = (f" ({profile.external_link_bits_s / 1e12:g} Tb/s)" if bound == "weight streaming" else "")
        passes = (f"the batch runs as {cost.micro_batches} micro-batch passes of up to {cost.micro_batch_size} "
                  "samples, each streaming every weight again; " if cost.micro_batches > 1 else "")
        return (f"each kernel has the whole fabric in turn; {passes}of each {_si(cost.iteration_s)}s iteration, "
                f"{_si(share)}s ({100 * share / cost.iteration_s:.0f} %) goes to {kernels} of {len(working)} "
                f"kernels that are bound by {bound}{link}{bubble}; {input_could}")
    slowest = _slowest(cost)
    kernel = next(k for k in result.kernels if k.name == slowest.name)
    return (f"the slowest kernel, {slowest.name} at {kernel.loc}, {_WAITS[bound]} for {_si(slowest.time_s)}s per "
            f"batch of {cost.batch_size}, and in a pipeline the slowest stage paces them all; {input_could}")


def _headline(x: float) -> str:
    """A rate in the report's first line: whole numbers from 100 up, 3 significant digits below
    (a 70B model's 0.8 samples/s is not 1)."""
    return f"{x:,.0f}" if not math.isfinite(x) or x >= 100 else f"{x:.3g}"


def _rate(x: float) -> str:
    return f"{_si(x).rstrip()} samples/s"


def _num(x: float) -> str:
    return f"{x:>14,.1f}" if math.isfinite(x) else f"{'unbounded':>14}"


def _si(x: float) -> str:
    """3 significant digits with an SI prefix and a trailing space for the unit: "1.23 G", "456 u"."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g} "
    exponent = max(-4, min(4, int(math.floor(math.log10(abs(x)) / 3))))
    prefix = {-4: "p", -3: "n", -2: "u", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T"}[exponent]
    return f"{x / 1000.0**exponent:.3g} {prefix}"


def _bytes(n: float) -> str:
    """Bytes in the binary units memory is sized in: "48 B", "98.1 KiB", "1.5 MiB"; never a fraction of a byte."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{math.ceil(n):,} B"


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]


# -- placement.svg ------------------------------------------------------------------
#
# Pipelined: the fabric to scale (a scale bar gives PEs per pixel), one rectangle per kernel,
# drawn at least _MIN_PX on each side so that a kernel of one row of PEs stays visible; a
# kernel too small for its name carries its number, or a numbered callout beside the fabric.
# Weight streaming: each kernel has the whole fabric in turn, so the fabric is drawn as one
# iteration's time, left to right, a band per kernel as wide as its time (at least _MIN_PX),
# then the bubble; a scale bar gives the time. Both list every kernel in a legend.

_MAX_PX = 900  # longest side of the drawn fabric
_MIN_PX = 3.0  # the smallest side a kernel is drawn with
_LEGEND_ROW = 18
_CALLOUT_PX = 40  # the strip for callouts between the fabric and the legend
_FONT_MIN = 8.0  # smaller text is not read


def render_svg(result) -> str:
    placement, profile, cost = result.placement, result.profile, result.cost
    scale = _MAX_PX / max(placement.width, placement.height)
    fw, fh = placement.width * scale, placement.height * scale
    top, left = 60, 20  # room above the fabric for the callouts of narrow bands
    placed = [r for r in placement.kernels if r.pes]
    streaming = result.execution_mode == "weight_streaming"
    if streaming:
        title = (f"{profile.name}: {placement.width} x {placement.height} PEs, weight streaming: each of the "
                 f"{len(placed)} kernels has all {placement.fabric_pes:,} PEs in turn (estimate)")
        body, legend = _streaming_body(result, left, top, fw, fh)
    else:
        title = (f"{profile.name}: {placement.width} x {placement.height} PEs, pipelined: {len(placed)} kernels on "
                 f"{cost.active_pes:,} PEs, {cost.active_pes_pct:.1f} % of the fabric (estimate)")
        body, legend = _pipelined_body(result, left, top, scale)
    x = left + fw + _CALLOUT_PX
    legend_px = 40 + 7 * max((len(text) for _, text in legend), default=0)
    width = x + legend_px
    height = max(top + fh + 70, top + 30 + _LEGEND_ROW * (len(legend) + 1))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="30" font-size="16">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{fw:.2f}" height="{fh:.2f}" fill="#f4f4f4" stroke="#555"/>']
    out += body
    out.append(f'<text x="{x}" y="{top + 14}" font-size="14">'
               f'{"kernels in run order" if streaming else "kernels in pipeline order"}</text>')
    for j, (colour, text) in enumerate(legend):
        y = top + 30 + _LEGEND_ROW * j
        if colour:
            out.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{colour}" stroke="#333"/>')
        out.append(f'<text x="{x + 20}" y="{y + 12}" font-size="12">{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _pipelined_body(result, left: float, top: float, scale: float):
    """The kernels' rectangles, their labels and callouts, the scale bar; and the legend rows."""
    placement, cost = result.placement, result.cost
    bounds = {c.name: c.bound_by for c in cost.kernels}
    fw, fh = placement.width * scale, placement.height * scale
    placed = [r for r in placement.kernels if r.pes]
    number = {r.name: i + 1 for i, r in enumerate(placed)}
    shapes, labels, callouts = [], [], []
    # the largest first, so that no small kernel lies under a large one
    for rect in sorted(placed, key=lambda r: -r.pes):
        x, y, w, h = _drawn(rect, scale, left, top, fw, fh)
        colour = KIND_COLOURS.get(rect.kind, "#999999")
        shapes += [f'<g><title>{number[rect.name]}. {escape(rect.name)} ({escape(rect.kind)}): {rect.pes:,} PEs, '
                   f'{rect.w} x {rect.h} at x={rect.x} y={rect.y}, {_bytes(math.ceil(rect.memory_per_pe))} per PE, '
                   f'bound by {bounds.get(rect.name, "")}</title>',
                   f'<rect x="{x:.2f}" y="{y:.2f}" width="{w:.2f}" height="{h:.2f}" fill="{colour}" '
                   'stroke="#222" stroke-width="0.5"/></g>']
        for text in (rect.name, str(number[rect.name])):
            font = min(12.0, h * 0.7, w / (0.62 * len(text) + 0.5))
            if font >= _FONT_MIN:
                labels.append(f'<text x="{x + w / 2:.2f}" y="{y + h / 2 + font / 3:.2f}" font-size="{font:.1f}" '
                              f'text-anchor="middle" fill="black">{escape(text)}</text>')
                break
        else:
            callouts.append((y + h / 2, x + w, number[rect.name]))
    # callouts: numbered in the strip right of the fabric, at their kernel's height, 14 px apart
    callouts.sort()
    floor = top
    for y, x_end, n in callouts:
        at = max(y, floor)
        floor = at + 14
        labels += [f'<line x1="{x_end:.2f}" y1="{y:.2f}" x2="{left + fw + 6:.2f}" y2="{at:.2f}" stroke="#888" '
                   'stroke-width="0.4"/>',
                   f'<text x="{left + fw + 8:.2f}" y="{at + 4:.2f}" font-size="11">{n}</text>']
    # scale bar: a round number of PEs, about a fifth of the fabric's width
    pes = _round_down(placement.width / 5)
    bar_y = top + fh + 24
    labels += [f'<line x1="{left}" y1="{bar_y}" x2="{left + pes * scale:.2f}" y2="{bar_y}" stroke="black" '
               'stroke-width="2"/>',
               f'<text x="{left}" y="{bar_y + 16}" font-size="12">scale: {pes:,} PEs; the fabric is '
               f'{placement.width} x {placement.height} PEs; kernels are drawn at least {_MIN_PX:g} px a side</text>']
    legend = [(KIND_COLOURS.get(r.kind, "#999999"),
               f"{number[r.name]}. {r.name} ({r.kind}): {r.pes:,} PEs, {r.w} x {r.h} at ({r.x}, {r.y}), "
               f"bound by {bounds.get(r.name, '')}") for r in placed]
    idle = placement.fabric_pes - cost.active_pes
    legend.append(("#f4f4f4", f"idle: {idle:,} PEs of {placement.fabric_pes:,}"))
    return shapes + labels, legend


def _drawn(rect, scale: float, left: float, top: float, fw: float, fh: float) -> tuple[float, float, float, float]:
    """(x, y, w, h) in pixels of a kernel's rectangle: to scale, at least _MIN_PX a side, inside the fabric."""
    w, h = max(rect.w * scale, _MIN_PX), max(rect.h * scale, _MIN_PX)
    x = min(left + rect.x * scale, left + fw - w)
    y = min(top + rect.y * scale, top + fh - h)
    return x, y, w, h


def _round_down(x: float) -> int:
    """The largest of 1, 2, 5 x 10^k not above x (at least 1)."""
    if x < 1:
        return 1
    power = 10 ** int(math.floor(math.log10(x)))
    return max(m * power for m in (1, 2, 5) if m * power <= x)


def _streaming_body(result, left: float, top: float, fw: float, fh: float):
    """One iteration's time across the fabric, a band per kernel, then the bubble; and the legend rows."""
    cost, placement = result.cost, result.placement
    placed = [r for r in placement.kernels if r.pes]
    times = {c.name: c for c in cost.kernels}
    spans = [(r, times[r.name].time_s) for r in placed] + [(None, cost.bubble_s)]
    widths = _band_widths([t for _, t in spans], fw)
    px_per_s = _px_per_s([t for _, t in spans], widths)
    out, labels, x, floor = [], [], left, left
    for i, ((rect, seconds), w) in enumerate(zip(spans, widths)):
        if w <= 0:
            continue
        if rect is None:  # the bubble
            out.append(f'<g><title>bubble: {_si(seconds)}s (estimate)</title><rect x="{x:.2f}" y="{top}" '
                       f'width="{w:.2f}" height="{fh:.2f}" fill="#d0d0d0" stroke="#222" stroke-width="0.5"/></g>')
            text = "bubble"
        else:
            cost_row = times[rect.name]
            out.append(f'<g><title>{i + 1}. {escape(rect.name)} ({escape(rect.kind)}): all {rect.pes:,} PEs for '
                       f'{_si(seconds)}s, bound by {cost_row.bound_by}</title><rect x="{x:.2f}" y="{top}" '
                       f'width="{w:.2f}" height="{fh:.2f}" fill="{KIND_COLOURS.get(rect.kind, "#999999")}" '
                       'stroke="#222" stroke-width="0.5"/></g>')
            text = f"{i + 1}. {rect.name}"
        if w >= 14:  # the name, written up the band
            labels.append(f'<text transform="translate({x + w / 2 + 4:.2f},{top + fh - 8:.2f}) rotate(-90)" '
                          f'font-size="12">{escape(text)}</text>')
        elif rect is not None:  # its number above the fabric, 14 px from the previous one
            at = max(x + w / 2, floor)
            floor = at + 14
            labels += [f'<line x1="{x + w / 2:.2f}" y1="{top}" x2="{at:.2f}" y2="{top - 8}" stroke="#555" '
                       'stroke-width="0.6"/>',
                       f'<text x="{at:.2f}" y="{top - 10}" font-size="11" text-anchor="middle">{i + 1}</text>']
        x += w
    seconds = _round_down_s(cost.iteration_s / 5)
    bar_y = top + fh + 24
    labels += [f'<line x1="{left}" y1="{bar_y}" x2="{left + seconds * px_per_s:.2f}" y2="{bar_y}" stroke="black" '
               'stroke-width="2"/>',
               f'<text x="{left}" y="{bar_y + 16}" font-size="12">scale: {_si(seconds)}s; left to right: one '
               f'{_si(cost.iteration_s)}s iteration; bands are drawn at least {_MIN_PX:g} px wide</text>']
    legend = [(KIND_COLOURS.get(r.kind, "#999999"),
               f"{i + 1}. {r.name} ({r.kind}): all {r.pes:,} PEs for {_si(times[r.name].time_s)}s, "
               f"bound by {times[r.name].bound_by}") for i, r in enumerate(placed)]
    crossing = "weights and gradients" if result.training else "weights"  # forward only: no gradients
    legend.append(("#d0d0d0", f"bubble: {_si(cost.bubble_s)}s, {crossing} on the external link"))
    return out + labels, legend


def _band_widths(seconds: list[float], total: float) -> list[float]:
    """Widths proportional to ``seconds``, each at least _MIN_PX (zero stays zero), summing to ``total``."""
    widths = [0.0] * len(seconds)
    fixed: set[int] = set()
    while True:  # bands that would be narrower than _MIN_PX get it, the rest share what is left
        free = [i for i, t in enumerate(seconds) if t > 0 and i not in fixed]
        room = total - _MIN_PX * len(fixed)
        share = sum(seconds[i] for i in free)
        small = {i for i in free if share and seconds[i] / share * room < _MIN_PX}
        if not small:
            break
        fixed |= small
    for i in fixed:
        widths[i] = _MIN_PX
    for i in free:
        widths[i] = seconds[i] / share * room
    return widths


def _px_per_s(seconds: list[float], widths: list[float]) -> float:
    """Pixels per second of the bands drawn to scale (those wider than the minimum)."""
    scaled = [(t, w) for t, w in zip(seconds, widths) if w > _MIN_PX]
    return sum(w for _, w in scaled) / sum(t for t, _ in scaled) if scaled else 0.0


def _round_down_s(x: float) -> float:
    """The largest of 1, 2, 5 x 10^k seconds not above x."""
    if x <= 0:
        return 0.0
    power = 10.0 ** math.floor(math.log10(x))
    return max(m * power for m in (1, 2, 5) if m * power <= x * (1 + 1e-9))


# -- systems.svg ---------------------------------------------------------------------
# Weight streaming on N systems: a bar per row of the report's systems table, samples/s to
# scale, and a dashed line where linear scaling from one system would put them.

def render_systems_svg(cost) -> str:
    rows = cost.systems
    one = rows[0]["samples_per_s"]
    top = max(max(r["samples_per_s"] for r in rows), rows[-1]["systems"] * one) or 1.0
    left, base, plot_h, bar_w, gap = 70, 260, 200, 60, 30
    width = left + len(rows) * (bar_w + gap) + 20

    def y(v: float) -> float:
        return base - plot_h * v / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{base + 60}" font-family="sans-serif">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="20" font-size="13">{escape(cost.profile)}, weight streaming, batch '
           f'{cost.batch_size:,} shared by N systems: samples/s (estimates); dashed: linear</text>',
           f'<line x1="{left}" y1="{base}" x2="{width - 10}" y2="{base}" stroke="#333"/>',
           f'<text x="{left - 6}" y="{y(top) + 4:.1f}" font-size="10" text-anchor="end">{top:,.0f}</text>',
           f'<text x="{left - 6}" y="{base + 4}" font-size="10" text-anchor="end">0</text>']
    linear = []
    for i, row in enumerate(rows):
        x = left + gap / 2 + i * (bar_w + gap)
        v = row["samples_per_s"]
        out.append(f'<rect class="systems" x="{x:.1f}" y="{y(v):.1f}" width="{bar_w}" height="{base - y(v):.1f}" '
                   f'fill="#4e79a7"><title>{row["systems"]} systems: {v:,.1f} samples/s</title></rect>')
        out.append(f'<text x="{x + bar_w / 2:.1f}" y="{y(v) - 4:.1f}" font-size="10" text-anchor="middle">'
                   f'{v:,.1f}</text>')
        out.append(f'<text x="{x + bar_w / 2:.1f}" y="{base + 16}" font-size="11" text-anchor="middle">'
                   f'{row["systems"]}</text>')
        linear.append(f"{x + bar_w / 2:.1f},{y(row['systems'] * one):.1f}")
    out.append(f'<polyline points="{" ".join(linear)}" fill="none" stroke="#e15759" stroke-dasharray="5,4"/>')
    out.append(f'<text x="{left + (width - left) / 2:.0f}" y="{base + 40}" font-size="12" text-anchor="middle">'
               'systems</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
