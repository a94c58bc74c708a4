"""Placement: give each kernel PEs and memory on the 2-D fabric.

Layer-pipelined (the whole network on the wafer at once, wafer-facts.md): every kernel
that does work gets its own rectangle. Its area is its share of the work (PE-cycles of
its roofline, see ``device.cost.pe_cycles``), at most one PE per multiply-add of a sample
(more PEs would idle), raised where needed to the area whose SRAM holds what the kernel
keeps:

    weights (fp32) + gradients (fp32) + optimizer slots (fp32; 2 adam/adamw, 1 momentum, 0 sgd)
    + state (batch-norm statistics) + in-flight activations.

In-flight activations (an assumption about the pipeline depth): samples stream through
the kernels one after another and a kernel keeps each sample's input until that sample's
gradient comes back. With S kernels doing work, kernel i (0-based, in pipeline order)
sees its sample's forward go through the S-1-i kernels after it and the backward come
back through them, one new sample entering per stage time, so it holds
2 * (S - 1 - i) + 1 samples, at most one batch (the depth analysis of pipelined
backpropagation, Kosson et al. 2020). A kernel keeps only the inputs its backward reads
(``Kernel.stash_bytes``: not those of additions, layout ops, dropout); values inside a
kernel are recomputed from them. Forward-only runs hold 2 samples (one arriving, one in
work).

Rectangles are packed by a deterministic column packer: kernels in pipeline order fill
a column top-down, then the next one bottom-up (a snake, so neighbours in the pipeline
stay neighbours on the fabric); a column takes kernels up to a target width's worth of
area and is then made as narrow as holds them, so the packing wastes little whatever
the order of the kernels; a kernel larger than a column gets its own block of full
columns. For each column width of a fixed set, the largest fraction of the fabric handed out by work share that still packs is found (a
coarse scan, then bisection to 1/1024 of the fabric); of those packings the one whose
slowest kernel is fastest wins. (A search that stopped at the first coarse fraction any
width could pack let one extra 1-PE kernel change the column width and starve the
feed-forward kernels of BERT-Large: 2,323 against 2,997 samples/s for the same work.)

Weight streaming (wafer-facts.md): one layer at a time gets the whole fabric; weights
and optimizer state live in the external store, which also runs the optimizer. The batch
is split into micro-batches whose gradients accumulate (the vendor's compiler picks the
micro-batch; here the largest that fits, or device.micro_batch_size): on the wafer stay
the activations of one micro-batch (from each kernel's forward until its backward) and
the tile of weights in flight (assumed double-buffered: at most half the SRAM), and the
weights cross the external link once per micro-batch pass (device/cost.py).

Activation checkpointing (recompute) in weight streaming: where the batch's activations do
not fit on the wafer in one pass, only the values at each layer boundary (the checkpoints)
are kept from the forward to the backward, and each layer's inner activations are computed
again from its checkpoint during the backward (one more forward of every kernel,
device/cost.py). A layer boundary is a narrow point of the kernel order: a cut crossed by
fewer bytes of activations than the cuts beside it (``checkpoint_cuts``: in a stack of
layers, the residual stream between them). A sample then holds the checkpoints of every
boundary plus the largest layer's inner activations; it is used when it lets a larger
micro-batch fit than keeping every activation does.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from device.cost import pe_cycles, roofline
from device.dtypes import BYTES
from device.errors import DeviceCompileError
from device.optimizer import SLOTS, OptimizerSpec
from device.passes.match import Kernel
from device.profiles import Profile
from zoo_base.errors import UserError

EXECUTION_MODES = ("pipelined", "weight_streaming")

# fp32 slots of optimizer state per weight
OPTIMIZER_SLOTS = {kind: len(slots) for kind, slots in SLOTS.items()}

# fractions of the fabric handed out by work share, tried from the largest down for each column
# width; between the largest that packs and the one above it, bisection down to FILL_STEP
FILLS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.0)
FILL_STEP = 1 / 1024
COLUMN_WIDTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)


@dataclass
class KernelPlacement:
    name: str
    kind: str
    x: int  # left column
    y: int  # top row
    w: int
    h: int
    weight_bytes: int = 0
    gradient_bytes: int = 0
    optimizer_bytes: int = 0
    state_bytes: int = 0
    activation_bytes: int = 0
    inflight: int = 0  # samples whose activations the kernel holds

    @property
    def pes(self) -> int:
        return self.w * self.h

    @property
    def memory_bytes(self) -> int:
        return (self.weight_bytes + self.gradient_bytes + self.optimizer_bytes + self.state_bytes
                + self.activation_bytes)

    @property
    def memory_per_pe(self) -> float:
        return self.memory_bytes / self.pes if self.pes else 0.0


@dataclass
class Placement:
    mode: str
    profile: str
    width: int
    height: int
    sram_bytes_per_pe: int
    optimizer: str
    training: bool
    kernels: list[KernelPlacement] = field(default_factory=list)  # every kernel; free ones have w = h = 0
    # weight streaming: samples per pass over the layers, and passes per batch (gradients accumulate)
    micro_batch: int = 0
    micro_batches: int = 0
    # weight streaming: layers' inner activations recomputed in the backward from checkpoints at the
    # layer boundaries; bytes of one sample kept (recomputing: checkpoints + the largest layer's
    # inner activations), and what keeping every activation would need
    recompute: bool = False
    activation_bytes_per_sample: int = 0
    full_activation_bytes_per_sample: int = 0
    checkpoint_bytes_per_sample: int = 0
    layers: int = 0  # recomputed segments between checkpoints
    kept_micro_batch: int = 0  # the largest micro-batch that fits keeping every activation

    @property
    def fabric_pes(self) -> int:
        return self.width * self.height

    @property
    def active_pes(self) -> int:
        """PEs that hold a kernel (weight streaming: all of them, one layer at a time)."""
        if self.mode == "weight_streaming":
            return self.fabric_pes if any(k.pes for k in self.kernels) else 0
        return sum(k.pes for k in self.kernels)

    def get(self, name: str) -> KernelPlacement:
        return next(k for k in self.kernels if k.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "profile": self.profile, "width": self.width, "height": self.height,
                "sram_bytes_per_pe": self.sram_bytes_per_pe, "optimizer": self.optimizer,
                "training": self.training, "active_pes": self.active_pes, "fabric_pes": self.fabric_pes,
                "micro_batch": self.micro_batch, "micro_batches": self.micro_batches,
                "recompute": self.recompute, "activation_bytes_per_sample": self.activation_bytes_per_sample,
                "full_activation_bytes_per_sample": self.full_activation_bytes_per_sample,
                "checkpoint_bytes_per_sample": self.checkpoint_bytes_per_sample, "layers": self.layers,
                "kept_micro_batch": self.kept_micro_batch,
                "kernels": [{**asdict(k), "pes": k.pes, "memory_bytes": k.memory_bytes,
                             "memory_per_pe": k.memory_per_pe} for k in self.kernels]}


def optimizer_slots(optimizer: OptimizerSpec | str | None) -> tuple[str, int]:
    """(name, fp32 slots per weight) of the optimizer; None is plain SGD."""
    if optimizer is None:
        return "sgd", 0
    kind = optimizer if isinstance(optimizer, str) else optimizer.kind
    if kind not in OPTIMIZER_SLOTS:
        raise UserError(f"unknown optimizer {kind!r}; valid optimizers: {', '.join(OPTIMIZER_SLOTS)}")
    if kind == "sgd" and not isinstance(optimizer, str) and optimizer.hyper.get("momentum"):
        return "momentum", OPTIMIZER_SLOTS["momentum"]
    return kind, OPTIMIZER_SLOTS[kind]


def place(kernels: list[Kernel], profile: Profile, mode: str = "pipelined",
          optimizer: OptimizerSpec | str | None = None, *, training: bool = True,
          precision: str = "float32", micro_batch_size: int | None = None,
          value_bytes: dict[str, int] | None = None) -> Placement:
    """Place ``kernels`` (from device.passes.match) on ``profile``'s fabric.

    ``micro_batch_size`` (weight streaming only): samples per pass; None takes the largest that fits.
    ``value_bytes`` (weight streaming only): bytes of each activation value for the batch
    (``activation_sizes``), which find the layer boundaries for recompute; without it no recompute.
    """
    if mode not in EXECUTION_MODES:
        raise UserError(f"unknown device.execution_mode {mode!r}; valid modes: {', '.join(EXECUTION_MODES)}")
    check_micro_batch_size(micro_batch_size, mode)
    opt_name, slots = optimizer_slots(optimizer) if training else ("none", 0)
    placement = Placement(mode, profile.name, profile.width, profile.height, profile.sram_bytes_per_pe,
                          opt_name, training)
    if mode == "pipelined":
        _place_pipelined(placement, kernels, profile, slots, precision)
    else:
        _place_streaming(placement, kernels, profile, micro_batch_size, value_bytes or {})
    return placement


def check_micro_batch_size(micro_batch_size: object, mode: str) -> None:
    """device.micro_batch_size: None (the largest that fits) or a whole number of samples >= 1,
    and only in weight streaming (a pipeline streams samples one by one: it has no micro-batch)."""
    if micro_batch_size is None:
        return
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise UserError(f"device.micro_batch_size must be a whole number of samples >= 1 or null (the largest "
                        f"that fits), got {micro_batch_size!r}")
    if mode != "weight_streaming":
        raise UserError(f"device.micro_batch_size {micro_batch_size} applies to device.execution_mode="
                        f"weight_streaming only; this compile is {mode} (set it to null)")


def _place_pipelined(placement: Placement, kernels: list[Kernel], profile: Profile, slots: int,
                     precision: str) -> None:
    working = [k for k in kernels if not k.free]
    rows = {k.name: KernelPlacement(k.name, k.kind, 0, 0, 0, 0) for k in kernels}
    stages = len(working)
    for i, k in enumerate(working):
        row = rows[k.name]
        row.weight_bytes = k.weight_bytes
        row.state_bytes = k.state_bytes
        if placement.training:
            row.gradient_bytes = k.weight_bytes
            row.optimizer_bytes = slots * k.weight_bytes
            row.inflight = min(k.batch, 2 * (stages - 1 - i) + 1)
        else:
            row.inflight = min(k.batch, 2)
        row.activation_bytes = math.ceil(row.inflight * k.stash_bytes / max(k.batch, 1))
    placement.kernels = list(rows.values())
    if not working:
        return

    sram = profile.sram_bytes_per_pe
    min_areas = [max(1, math.ceil(rows[k.name].memory_bytes / sram)) for k in working]
    if sum(min_areas) > profile.pes:
        raise _too_large(working, rows, profile, placement.optimizer)
    work = [max(pe_cycles(k, profile, precision, placement.training)) for k in working]
    # a kernel cannot use more PEs than it has multiply-adds per sample (its weights, for a dense
    # layer): beyond that a PE would have less than one operation per sample to do
    max_areas = [max(m, math.ceil(k.flops_fwd / max(k.batch, 1) / 2)) for m, k in zip(min_areas, working)]

    fills: dict[float, list[int]] = {}  # water-filled areas per fill, shared by every column width

    def areas_at(fill: float) -> list[int]:
        if fill not in fills:
            fills[fill] = _water_fill(min_areas, max_areas, work, profile.pes * fill)
        return fills[fill]

    best = None
    for width in COLUMN_WIDTHS:
        if width > profile.width:
            break
        for narrow in (True, False):
            rects = _largest_packing(areas_at, width, profile.width, profile.height, narrow)
            if rects is None:
                continue
            slowest = max(max(roofline(k, w, h, profile, precision, placement.training).values())
                          for k, (_, _, w, h) in zip(working, rects))
            if best is None or slowest < best[0]:
                best = (slowest, rects)
    if best is None:
        raise _too_large(working, rows, profile, placement.optimizer, packing=True)
    for k, (x, y, w, h) in zip(working, best[1]):
        row = rows[k.name]
        row.x, row.y, row.w, row.h = x, y, w, h


def _largest_packing(areas_at, column: int, width: int, height: int,
                     narrow: bool = True) -> list[tuple[int, int, int, int]] | None:
    """The packing in columns of ``column`` PEs of the largest fill that packs, to within FILL_STEP.

    The coarse FILLS first, from the largest down; then bisection between the largest that packs
    and the one above it. Areas only grow with the fill, so for one column width the largest fill
    that packs has the fastest slowest kernel (up to rounding to whole rows).
    """
    above = None
    for fill in FILLS:
        rects = _pack(areas_at(fill), column, width, height, narrow)
        if rects is not None:
            break
        above = fill
    else:
        return None
    lo, hi = fill, above if above is not None else fill
    while hi - lo > FILL_STEP:
        mid = (lo + hi) / 2
        packed = _pack(areas_at(mid), column, width, height, narrow)
        if packed is None:
            hi = mid
        else:
            lo, rects = mid, packed
    return rects


def _water_fill(min_areas: list[int], max_areas: list[int], work: list[float], total: float) -> list[int]:
    """Areas clamp(lam * work_i, min_i, max_i), with lam as large as keeps their sum within ``total``."""
    def areas(lam: float) -> list[float]:
        return [min(max(m, lam * w), cap) for m, cap, w in zip(min_areas, max_areas, work)]

    if sum(min_areas) >= total or sum(work) == 0:
        return list(min_areas)
    lo, hi = 0.0, total / min(w for w in work if w > 0) + 1  # at hi every kernel is at its cap or past total
    for _ in range(60):
        lam = (lo + hi) / 2
        if sum(areas(lam)) > total:
            hi = lam
        else:
            lo = lam
    return [math.floor(a) if a > m else m for a, m in zip(areas(lo), min_areas)]


def _pack(areas: list[int], column: int, width: int, height: int,
          narrow: bool = True) -> list[tuple[int, int, int, int]] | None:
    """Rectangles (x, y, w, h) of at least each area, in columns of at most about ``column`` PEs; None if
    they overflow the fabric.

    Kernels in pipeline order go into a column while their areas add up to at most ``column`` x
    ``height``; with ``narrow`` the column is then made as narrow as holds them stacked (whole rows
    each), so a column wastes at most a strip of width 1 and a row per kernel, whatever the order of
    the areas. Without it the column keeps ``column`` PEs across (wider, if its kernels' rows overflow
    the height; narrower, if its largest kernel is), so the rectangles' shapes are the column's and
    not the fabric's height: narrowed, the same kernels go into fewer, narrower columns on a taller
    fabric, with fewer boundary links for a fabric-bound kernel (device/cost.py's fabric time).
    """
    rects = []
    x, col_index, i = 0, 0, 0
    while i < len(areas):
        if areas[i] > column * height:  # taller than a column: a block of full columns of its own
            w = math.ceil(areas[i] / height)
            if x + w > width:
                return None
            rects.append((x, 0, w, math.ceil(areas[i] / w)))
            x, col_index, i = x + w, col_index + 1, i + 1
            continue
        j, total = i, 0
        while j < len(areas) and j - i < height and total + areas[j] <= column * height:
            total, j = total + areas[j], j + 1
        # narrowed: as narrow as holds the column's kernels; kept: the column's width, or its largest
        # kernel's area if that is less (no kernel is spread thinner than one row for want of work)
        w = max(1, math.ceil(total / height)) if narrow else min(column, max(areas[i:j]))
        while sum(math.ceil(a / w) for a in areas[i:j]) > height:
            w += 1
        if not narrow:  # as narrow as keeps each kernel's rows: less than a row spare
            w = max(math.ceil(a / math.ceil(a / w)) for a in areas[i:j])
        if x + w > width:
            return None
        used = 0
        for area in areas[i:j]:
            h = math.ceil(area / w)
            # snake: odd columns fill bottom-up, so the pipeline continues next door
            y = used if col_index % 2 == 0 else height - used - h
            rects.append((x, y, w, h))
            used += h
        x, col_index, i = x + w, col_index + 1, j
    return rects


def _too_large(working: list[Kernel], rows: dict[str, KernelPlacement], profile: Profile, optimizer: str,
               packing: bool = False) -> DeviceCompileError:
    largest = max(working, key=lambda k: rows[k.name].memory_bytes)
    need = sum(rows[k.name].memory_bytes for k in working)
    verb = "cannot be packed onto" if packing else "does not fit"
    return DeviceCompileError(
        f"the model {verb} the {profile.name} fabric in pipelined mode: its kernels need {_b(need)} of SRAM "
        f"(fp32 weights, gradients, {optimizer} state, in-flight activations), {_b(profile.sram_bytes)} are "
        f"available ({profile.width} x {profile.height} PEs x {profile.sram_bytes_per_pe:,} bytes); the largest "
        f"kernel {largest.name!r} ({largest.kind}, {largest.loc}) needs {_b(rows[largest.name].memory_bytes)}; "
        "stream the weights instead: device.execution_mode=weight_streaming")


def _b(n: float) -> str:
    return f"{int(n):,} bytes ({n / 2**20:,.1f} MiB)"


def activation_sizes(graph) -> dict[str, int]:
    """Bytes of each value of ``graph`` (a device.ir.Graph) for the captured batch: floating-point
    values in the compute format (device.dtypes.BYTES of the graph's precision), others at their own
    dtype. What recompute's layer boundaries are found with (``checkpoint_cuts``)."""
    elem = BYTES.get(graph.precision, 4)
    sizes = {}
    for name, value in graph.values.items():
        n = 1
        for d in value.shape:
            n *= d or 0
        sizes[name] = n * (elem if value.dtype.startswith(("float", "bfloat")) else BYTES.get(value.dtype, 4))
    return sizes


def checkpoint_cuts(kernels: list[Kernel], value_bytes: dict[str, int]) -> tuple[list[int], int, int]:
    """The layer boundaries of ``kernels`` (in order, free ones included), the bytes of their checkpoints
    and the largest stash between two of them (the inner activations of the largest layer).

    A cut before kernel i (0 < i < len) is crossed by every activation that a kernel before it (or
    the feed: a graph input) made and a kernel at or after it reads; its bytes are theirs. Values made
    from weights and constants alone (a transposed weight, rotary tables) are no activations: they
    cross nothing. The boundaries are the narrow points: cuts crossed by fewer bytes than the cuts on
    either side of them (in a stack of layers the residual stream between them, with whatever every
    layer reads; equal cuts in a row count as one), of which those are kept whose checkpoints and
    largest layer together are the fewest bytes (``_fewest_bytes``); the checkpoints are the values
    crossing any boundary, each counted once. One pass over the kernels' inputs: a value's span (made, last read)
    marks the cuts it crosses, summed by a running total.
    """
    produced = {v for k in kernels for v in k.outputs}
    made: dict[str, int] = {}  # activation -> the kernel that made it
    for i, k in enumerate(kernels):
        if any(v in made or v not in produced for v in k.inputs):  # reads the batch: makes activations
            made.update(dict.fromkeys(k.outputs, i))
    last_read: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for v in k.inputs:
            if v in made or v not in produced:  # an activation, or fed (a graph input)
                last_read[v] = i
    n = len(kernels)
    delta = [0] * (n + 1)
    for v, last in last_read.items():
        first = made.get(v, -1) + 1  # the first cut it crosses; graph inputs cross from the start
        if max(first, 1) <= last:
            delta[max(first, 1)] += value_bytes.get(v, 0)
            delta[last + 1] -= value_bytes.get(v, 0)
    crossing, running = {}, 0
    for i in range(1, n):
        running += delta[i]
        crossing[i] = running
    if not crossing:
        return [], 0
    # narrow points: a run of equal cuts (a layout kernel between them moves nothing) with more bytes on
    # either side; the run's first cut is the boundary
    values = [crossing[i] for i in range(1, n)]
    cuts = []
    for i, c in enumerate(values):
        if i > 0 and values[i - 1] == c:
            continue
        j = i
        while j + 1 < len(values) and values[j + 1] == c:
            j += 1
        if (i == 0 or values[i - 1] > c) and (j + 1 == len(values) or values[j + 1] > c):
            cuts.append(i + 1)
    cuts = _fewest_bytes(cuts, [crossing[c] for c in cuts],
                         [sum(k.stash_bytes for k in kernels[a:b] if not k.free)
                          for a, b in zip([0, *cuts], [*cuts, n])])
    kept = [v for v, last in last_read.items() if _crosses_one(cuts, made.get(v, -1) + 1, last)]
    bounds = [0, *cuts, n]
    inner = max(sum(k.stash_bytes for k in kernels[a:b] if not k.free) for a, b in zip(bounds, bounds[1:]))
    return cuts, sum(value_bytes.get(v, 0) for v in kept), inner


def _fewest_bytes(cuts: list[int], crossing: list[int], stash: list[int]) -> list[int]:
    """Of the narrow points ``cuts`` (each crossed by ``crossing`` bytes; ``stash``: the kernels' stash
    between consecutive ones, len(cuts) + 1 parts), those whose checkpoints plus the largest segment
    between them are the fewest bytes (Chen et al. 2016, "Training Deep Nets with Sublinear Memory
    Cost": about the square root of the layers). For each number of segments s, a greedy pass cuts
    where the next part would take a segment past the larger of total / s and the largest part;
    the checkpoints are counted as the sum of the chosen cuts' bytes (a value crossing several
    counted each time: the few that every layer reads)."""
    total, largest = sum(stash), max(stash)
    best = (total, [])  # no checkpoint: every activation kept
    for segments in range(2, len(stash) + 1):
        budget = max(largest, total / segments)
        chosen, run, peak = [], stash[0], 0
        for cut, over, part in zip(cuts, crossing, stash[1:]):
            if run + part > budget:
                chosen.append((cut, over))
                peak, run = max(peak, run), part
            else:
                run += part
        need = sum(over for _, over in chosen) + max(peak, run)
        if need < best[0]:
            best = (need, [cut for cut, _ in chosen])
    return best[1]


def _crosses_one(cuts: list[int], first: int, last: int) -> bool:
    """Does a value crossing cuts first..last cross one of ``cuts`` (sorted)? The first at or after ``first``."""
    j = bisect.bisect_left(cuts, first)
    return j < len(cuts) and cuts[j] <= last


def _place_streaming(placement: Placement, kernels: list[Kernel], profile: Profile,
                     micro_batch_size: int | None, value_bytes: dict[str, int]) -> None:
    """Every working kernel on the whole fabric in turn, the batch split into micro-batches.

    On the wafer at once: the weight tile in flight of the kernel at work (its weights in, its
    gradients out, double-buffered: at most half the SRAM) and the activations of one
    micro-batch (training: every kernel's stash, from its forward to its backward, or, recomputing,
    the checkpoints of every layer boundary and the largest layer's stash; forward only: the
    largest kernel's inputs and outputs). The micro-batch is the largest that fits, or
    ``micro_batch_size`` (device.micro_batch_size); the batch is split into as few passes as
    that allows, of sizes as equal as whole samples allow. Recompute is used where keeping every
    activation would split the batch into more passes than keeping the checkpoints
    (or into any, for a chosen micro-batch too large to keep them all).
    """
    working = [k for k in kernels if not k.free]
    batch = working[0].batch if working else 0
    if placement.training:
        stash = sum(k.stash_bytes for k in working)  # whole batch, from each kernel's forward to its backward
    else:
        stash = max((k.input_bytes + k.activation_bytes for k in working), default=0)
    tile = profile.sram_bytes // 2  # double-buffered weight tiles: at most half the SRAM
    rows = {}
    for k in kernels:
        row = KernelPlacement(k.name, k.kind, 0, 0, 0, 0)
        if not k.free:
            row.w, row.h = profile.width, profile.height
            row.weight_bytes = min(k.weight_bytes, tile // 2)  # weights in ...
            row.gradient_bytes = min(k.weight_bytes, tile // 2) if placement.training else 0  # ... gradients out
            row.state_bytes = k.state_bytes
        rows[k.name] = row
        placement.kernels.append(row)
    if not working:
        return
    worst = max((rows[k.name] for k in working), key=lambda r: r.memory_bytes)  # the largest tile beside the activations
    room = profile.sram_bytes - worst.memory_bytes

    def fitting(need: int) -> int:
        # micro samples fit where micro * need / batch <= room: in integers (bytes are whole), since
        # float division undercounts an exact fit by one (1 // 0.1 is 9.0) and rounds a product past it
        return batch if need == 0 else max(0, min(batch, room * batch // need))

    full_fits = fitting(stash)
    kept, cuts, checkpoints = stash, [], 0
    if placement.training and value_bytes and full_fits < batch:
        cuts, checkpoints, inner = checkpoint_cuts(kernels, value_bytes)
        if cuts and checkpoints + inner < stash:
            kept = checkpoints + inner
    recompute_fits = fitting(kept)
    wanted = micro_batch_size if micro_batch_size is not None else batch
    # recompute where it lets more samples fit a pass than keeping every activation, and the batch
    # (or the chosen micro-batch) needs more; where neither fits one sample, the refusal names its figures
    recompute = kept < stash and wanted > full_fits and (recompute_fits > full_fits or full_fits < 1)
    need, fits = (kept, recompute_fits) if recompute else (stash, full_fits)
    placement.recompute, placement.kept_micro_batch = recompute, full_fits
    placement.full_activation_bytes_per_sample = -(-stash // max(batch, 1))
    placement.activation_bytes_per_sample = -(-need // max(batch, 1))
    if kept < stash:
        placement.checkpoint_bytes_per_sample = -(-checkpoints // max(batch, 1))
        placement.layers = len(cuts) + 1
    per_sample = need / max(batch, 1)
    if micro_batch_size is None:
        if fits < 1:
            raise DeviceCompileError(
                f"in weight streaming the activations of one sample need {_b(per_sample)} of SRAM next to the "
                f"weight tile of {worst.name!r} ({_b(worst.memory_bytes)}), {_b(profile.sram_bytes)} are available "
                f"on {profile.name}{_recompute_figures(placement)}; shorten the sequence or the image, or use a "
                "profile with more SRAM")
        passes = math.ceil(batch / fits)
        micro = math.ceil(batch / passes)  # as few passes as fit, as even as whole samples allow
    else:
        if micro_batch_size > batch:
            raise DeviceCompileError(
                f"device.micro_batch_size {micro_batch_size} is larger than the batch of {batch}; "
                f"use at most {batch}, or leave it unset (null) to take the largest that fits ({max(fits, 1)})")
        if micro_batch_size > fits:
            raise DeviceCompileError(
                f"device.micro_batch_size {micro_batch_size}: the activations of a micro-batch of {micro_batch_size} "
                f"need {_b(micro_batch_size * per_sample)} of SRAM next to the weight tile of {worst.name!r} "
                f"({_b(worst.memory_bytes)}), {_b(profile.sram_bytes)} are available on {profile.name}"
                f"{_recompute_figures(placement)}; "
                + (f"the largest that fits is {fits}" if fits >= 1 else "not even one sample fits"))
        micro, passes = micro_batch_size, math.ceil(batch / micro_batch_size)
    placement.micro_batch, placement.micro_batches = micro, passes
    for k in working:
        rows[k.name].activation_bytes = -(-micro * need // max(batch, 1))  # ceil, in integers
        rows[k.name].inflight = micro


def _recompute_figures(placement: Placement) -> str:
    """The refusal's account of recompute: the checkpoints, the largest layer, and keeping every activation."""
    if not placement.recompute:
        return ""
    inner = placement.activation_bytes_per_sample - placement.checkpoint_bytes_per_sample
    return (f" (recomputing each layer's activations in the backward: the checkpoints of {placement.layers} layers, "
            f"{_b(placement.checkpoint_bytes_per_sample)}, and the largest layer's inner activations, {_b(inner)}; "
            f"keeping every activation would need {_b(placement.full_activation_bytes_per_sample)})")
