"""The performance estimate: a roofline per kernel, plain arithmetic. Estimates, not measurements.

Every constant comes from the profile (device/profiles.py, which cites
/work/shared/reference/wafer-facts.md). Per kernel, on its P PEs:

    compute time = flops / (P x flops per cycle per PE x clock)
    SRAM time    = SRAM bytes / (P x SRAM bytes per cycle per PE x clock)
    fabric time  = bytes in and out of the kernel / (links on its rectangle's boundary x link rate)

and the kernel's time is the largest of them: what it is "bound by", one of BOUNDS (compute,
memory: SRAM bandwidth, fabric, and in weight streaming the external link).

Layer-pipelined: every kernel works at once on its own rectangle, so one batch takes the
slowest kernel's time: compute samples/s = batch / slowest kernel time (wafer-facts.md:
"throughput is set by the slowest stage").

Weight streaming: one layer at a time on the whole fabric, its weights arriving over the
external link (wafer-facts.md: per layer max(compute time, weight bytes / external link
rate), plus a bubble at each iteration boundary). The batch runs as P micro-batch passes
(device/place.py picks the micro-batch: the largest whose activations fit beside a weight
tile), the gradients accumulating in the external store, so each pass streams every
layer's weights again: per kernel and pass max(its compute, SRAM and fabric time for the
pass's samples, weight bytes / external link rate), summed over kernels and passes, plus
the bubble once per iteration. Weight bytes per kernel and pass in training: fp32 weights
in for the forward, again for the backward, fp32 gradients out (3x); forward only: 1x.
Recompute (activation checkpointing, device/place.py): where the placement keeps only the
checkpoints at layer boundaries, each layer's forward runs again in the backward before its
gradients, so a kernel's compute, SRAM and fabric work per pass are those of two forwards and
one backward; its weights are already on the wafer for the backward, so the external link
carries no more bytes.
The bubble: at the iteration boundary the external store must finish the update before
the next iteration's first weights leave, so the last kernel's gradients and the first
kernel's weights cross the link with no compute to hide behind.

Weight streaming on N systems (wafer-facts.md: a broadcast-reduce tree sends the weights to
N systems and sums their gradients: data parallel): each system runs ceil(batch / N) samples
of the batch in micro-batch passes of at most the same micro-batch (recomputing activations
only where its share does not fit one pass keeping them all); each system's link
carries the whole weight stream, the tree adding no bandwidth limit of its own (the facts
give no figure for it); at the iteration boundary each of the tree's ceil(log2 N) levels
adds one more bubble (the last gradients reduced, the first weights broadcast, a level at a
time). Input transmission scales with N (each system has its own I/O).

Input transmission: samples/s = system I/O / bytes of one sample's inputs (as fed, at
their dtypes). The estimate is the smaller of compute and transmission samples/s.

What bounds the estimate: "input" where transmission is the smaller; otherwise the bound
that takes most of an iteration's time: pipelined, the slowest kernel's (it paces every
stage); weight streaming, the bound under which the kernels, run one after another, spend
the most time, the bubble counting as weight streaming.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from device.dtypes import BYTES
from device.ir import Graph
from device.optimizer import SLOTS
from device.passes.match import Kernel, batch_size
from device.profiles import Profile

# what can bound a kernel's time, in the words the report uses; "input" can bound the whole estimate
BOUNDS = ("compute", "memory", "fabric", "weight streaming")
# weight streaming: the systems of the multi-system table (data parallel through the broadcast-reduce tree)
SYSTEMS = (1, 2, 4, 8, 16)


def pe_cycles(kernel: Kernel, profile: Profile, precision: str, training: bool,
              recompute: bool = False) -> tuple[float, float]:
    """(compute cycles, SRAM cycles) of the kernel's work for one batch on a single PE; ``recompute``
    adds the forward run again in the backward."""
    again = recompute and training
    compute = (kernel.flops(training) + (kernel.flops_fwd if again else 0.0)) / profile.flops_per_cycle(precision)
    sram = (kernel.sram_bytes(training) + (kernel.sram_bytes_fwd if again else 0.0)) / profile.sram_bytes_per_cycle
    return compute, sram


@dataclass
class KernelCost:
    name: str
    kind: str
    pes: int
    flops: float  # for one batch, forward (+ backward when training)
    sram_bytes: float
    fabric_bytes: float
    stream_bytes: float  # weight streaming: bytes over the external link, every micro-batch pass
    compute_s: float
    sram_s: float
    fabric_s: float
    stream_s: float  # weight streaming: over every micro-batch pass of the batch
    time_s: float  # weight streaming: summed over the passes, max(compute share, weight transfer) each
    bound_by: str  # one of BOUNDS, or free (a layout kernel: no PEs, no time)
    passes: int = 0  # weight streaming: micro-batch passes, each streaming the kernel's weights
    recompute_flops: float = 0.0  # weight streaming with recompute: the forward run again in the backward


@dataclass
class CostReport:
    """Estimated performance of one compiled graph (every figure is an estimate)."""

    execution_mode: str
    profile: str
    precision: str
    training: bool
    batch_size: int
    samples_per_s: float
    compute_samples_per_s: float
    transmission_samples_per_s: float
    iteration_s: float  # one batch through the compute (pipelined: the slowest kernel)
    bubble_s: float
    active_pes: int
    fabric_pes: int
    flops_per_sample: float
    input_bytes_per_sample: float
    peak_flops: float  # whole fabric, in the compute format
    kernels: list[KernelCost] = field(default_factory=list)
    tokens_per_sample: int = 0  # sequence length of a token input ((B, T) integers); 0 if none
    # weight streaming only: the micro-batches, the external store's bytes, the multi-system table
    micro_batch_size: int = 0
    micro_batches: int = 0
    recompute: bool = False  # each layer's activations recomputed from checkpoints in the backward
    external_memory: dict[str, int] = field(default_factory=dict)  # weights, optimizer state, gradients (fp32)
    systems: list[dict[str, float]] = field(default_factory=list)  # per N systems (SYSTEMS)

    @property
    def tokens_per_s(self) -> float:
        return self.samples_per_s * self.tokens_per_sample

    @property
    def active_pes_pct(self) -> float:
        return 100.0 * self.active_pes / self.fabric_pes

    @property
    def compute_utilisation_pct(self) -> float:
        """Achieved flop/s over the whole fabric's peak."""
        if self.flops_per_sample == 0:  # nothing but layout: no compute to use
            return 0.0
        return 100.0 * self.flops_per_sample * self.samples_per_s / self.peak_flops

    @property
    def iteration_by_bound(self) -> dict[str, float]:
        """Seconds of one iteration (iteration_s) per bound, largest first.

        Pipelined: the slowest kernel paces every stage, so the whole iteration is its bound's.
        Weight streaming: the kernels run one after another, so each adds its time under its own
        bound, and the bubble (weights and gradients crossing the external link) is weight streaming.
        """
        working = [k for k in self.kernels if k.bound_by != "free"]
        if not working:
            return {}
        if self.execution_mode != "weight_streaming":
            return {max(working, key=lambda k: k.time_s).bound_by: self.iteration_s}
        seconds = dict.fromkeys(BOUNDS, 0.0)
        for k in working:
            seconds[k.bound_by] += k.time_s
        seconds["weight streaming"] += self.bubble_s
        return dict(sorted(((b, t) for b, t in seconds.items() if t > 0), key=lambda bt: -bt[1]))

    @property
    def compute_bound_by(self) -> str:
        """What bounds compute samples/s: the bound with the largest share of the iteration."""
        return next(iter(self.iteration_by_bound), "compute")

    @property
    def bound_by(self) -> str:
        """What bounds the estimate: "input" (system I/O) or what bounds the compute."""
        return "input" if self.transmission_samples_per_s < self.compute_samples_per_s else self.compute_bound_by

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "kernels"}
        data.update(estimate=True, active_pes_pct=self.active_pes_pct, tokens_per_s=self.tokens_per_s,
                    compute_utilisation_pct=self.compute_utilisation_pct, bound_by=self.bound_by,
                    compute_bound_by=self.compute_bound_by, iteration_by_bound=self.iteration_by_bound,
                    kernels=[asdict(k) for k in self.kernels])
        return data


def estimate(graph: Graph, kernels: list[Kernel], placement, profile: Profile, *, training: bool) -> CostReport:
    """The performance estimate of ``kernels`` placed by ``placement`` (device.place.Placement)."""
    precision = graph.precision
    batch = batch_size(graph)
    streaming = placement.mode == "weight_streaming"
    passes = _passes(batch, placement.micro_batch) if streaming else []
    rows = []
    for kernel in kernels:
        rect = placement.get(kernel.name)
        rows.append(_kernel_cost(kernel, rect, profile, precision, training, passes,
                                 recompute=streaming and training and placement.recompute))

    working = [(k, r) for k, r in zip(kernels, rows) if not k.free]
    bubble = 0.0
    if not working:
        iteration = 0.0
    elif streaming:
        first_weights = working[0][0].weight_bytes
        last_gradients = working[-1][0].weight_bytes if training else 0
        bubble = (first_weights + last_gradients) / profile.external_link_bytes_s
        iteration = sum(r.time_s for _, r in working) + bubble
    else:
        iteration = max(r.time_s for _, r in working)
    compute_rate = batch / iteration if iteration > 0 else float("inf")

    # input transmission: system I/O over the bytes of one sample as fed (wafer-facts.md: 1.2 Tb/s)
    input_bytes = sum(_numel(graph, v) * BYTES.get(graph.values[v].dtype, 4) for v in graph.inputs) / batch
    transmission_rate = profile.system_io_bytes_s / input_bytes if input_bytes else float("inf")

    report = CostReport(
        execution_mode=placement.mode, profile=profile.name, precision=precision, training=training,
        batch_size=batch, samples_per_s=min(compute_rate, transmission_rate),
        compute_samples_per_s=compute_rate, transmission_samples_per_s=transmission_rate,
        iteration_s=iteration, bubble_s=bubble, active_pes=placement.active_pes, fabric_pes=profile.pes,
        flops_per_sample=sum(k.flops(training) for k in kernels) / batch,
        input_bytes_per_sample=input_bytes, peak_flops=profile.peak_flops(precision), kernels=rows,
        tokens_per_sample=_tokens_per_sample(graph))
    if streaming and working:
        report.micro_batch_size, report.micro_batches = placement.micro_batch, placement.micro_batches
        report.recompute = training and placement.recompute
        weights = 4 * sum(_numel(graph, v) for v in graph.params)  # fp32 master weights
        report.external_memory = {
            "weights": weights,
            "optimizer": len(SLOTS.get(placement.optimizer, ())) * weights,  # fp32 slots (adam: 2)
            "gradients": weights if training else 0,  # fp32 accumulators of the micro-batches' gradients
        }
        # a system whose share of the batch fits one pass keeping every activation recomputes nothing
        kept = working
        if report.recompute:
            kept = [(k, _kernel_cost(k, placement.get(k.name), profile, precision, training, passes))
                    for k, _ in working]
        report.systems = [_on_systems(n, batch, placement.micro_batch,
                                      kept if math.ceil(batch / n) <= placement.kept_micro_batch else working,
                                      bubble, transmission_rate, report.tokens_per_sample) for n in SYSTEMS]
    return report


def _passes(batch: int, micro_batch: int) -> list[int]:
    """Samples per micro-batch pass: as many full micro-batches as the batch holds, then the rest."""
    if micro_batch <= 0 or batch <= 0:
        return [batch]
    full, rest = divmod(batch, micro_batch)
    return [micro_batch] * full + ([rest] if rest else [])


def _streamed_time(cost: KernelCost, batch: int, passes: list[int]) -> float:
    """A streamed kernel's seconds over ``passes``: per pass the larger of its work on the pass's samples
    (compute, SRAM or fabric; ``cost`` holds them for ``batch`` samples) and its weights' transfer."""
    work = max(cost.compute_s, cost.sram_s, cost.fabric_s) / batch
    per_pass = cost.stream_s / cost.passes if cost.passes else 0.0
    return sum(max(work * n, per_pass) for n in passes)


def _on_systems(n: int, batch: int, micro_batch: int, working, bubble: float, transmission_rate: float,
                tokens_per_sample: int) -> dict[str, float]:
    """One row of the multi-system table: the batch shared by ``n`` systems (see the module docstring)."""
    per_system = math.ceil(batch / n)
    passes = _passes(per_system, min(micro_batch, per_system))
    levels = math.ceil(math.log2(n)) if n > 1 else 0
    iteration = sum(_streamed_time(r, batch, passes) for _, r in working) + bubble * (1 + levels)
    samples = min(batch / iteration if iteration > 0 else float("inf"), n * transmission_rate)
    return {"systems": n, "batch_per_system": per_system, "micro_batches": len(passes), "iteration_s": iteration,
            "samples_per_s": samples, "tokens_per_s": samples * tokens_per_sample}


def _tokens_per_sample(graph: Graph) -> int:
    """The sequence length of a token input: the second axis of a (B, T) integer input (0 if none)."""
    lengths = [graph.values[v].shape[1] for v in graph.inputs
               if len(graph.values[v].shape) == 2 and graph.values[v].dtype.startswith(("int", "uint"))]
    return max(lengths, default=0)


def roofline(kernel: Kernel, w: int, h: int, profile: Profile, precision: str, training: bool,
             streaming: bool = False, recompute: bool = False) -> dict[str, float]:
    """Seconds of one batch of ``kernel`` on a w x h rectangle, per bound (BOUNDS); ``recompute``:
    its forward runs again in the backward (weight streaming with activation checkpointing)."""
    compute_cycles, sram_cycles = pe_cycles(kernel, profile, precision, training, recompute)
    pes = w * h
    boundary_links = 2 * (w + h)  # one outward link per edge PE (4 links per PE, wafer-facts.md)
    return {
        "compute": compute_cycles / (pes * profile.clock_hz),
        "memory": sram_cycles / (pes * profile.clock_hz),  # SRAM bandwidth
        "fabric": _fabric_bytes(kernel, training, recompute) / (boundary_links * profile.link_bytes_s),
        "weight streaming": _stream_bytes(kernel, training, streaming) / profile.external_link_bytes_s,
    }


def _fabric_bytes(kernel: Kernel, training: bool, recompute: bool = False) -> float:
    """Activations in and out; when training the gradients cross the same boundary back, and a
    recomputed forward moves its activations again."""
    return (kernel.input_bytes + kernel.activation_bytes) * ((3 if recompute else 2) if training else 1)


def _stream_bytes(kernel: Kernel, training: bool, streaming: bool) -> float:
    if not streaming:
        return 0.0
    return kernel.weight_bytes * (3 if training else 1)


def _kernel_cost(kernel: Kernel, rect, profile: Profile, precision: str, training: bool,
                 passes: list[int], recompute: bool = False) -> KernelCost:
    """The kernel's cost for one batch; ``passes``: weight streaming's micro-batch sizes (empty: pipelined);
    ``recompute``: its forward runs again in the backward (in flops, SRAM and fabric bytes, and time)."""
    streaming = bool(passes)
    again = recompute and training
    flops = kernel.flops(training) + (kernel.flops_fwd if again else 0.0)
    sram_bytes = kernel.sram_bytes(training) + (kernel.sram_bytes_fwd if again else 0.0)
    fabric_bytes = _fabric_bytes(kernel, training, again)
    stream_bytes = _stream_bytes(kernel, training, streaming) * len(passes)
    if kernel.free or rect.pes == 0:
        return KernelCost(kernel.name, kernel.kind, 0, flops, sram_bytes, fabric_bytes, 0.0,
                          0.0, 0.0, 0.0, 0.0, 0.0, "free")
    times = roofline(kernel, rect.w, rect.h, profile, kernel.precision or precision, training, streaming, again)
    times["weight streaming"] *= len(passes)  # once per micro-batch pass
    bound_by = max(times, key=times.get)
    cost = KernelCost(kernel.name, kernel.kind, rect.pes, flops, sram_bytes, fabric_bytes, stream_bytes,
                      times["compute"], times["memory"], times["fabric"], times["weight streaming"], times[bound_by],
                      bound_by, passes=len(passes), recompute_flops=kernel.flops_fwd if again else 0.0)
    if streaming:  # the passes' sum; equal to the bound's seconds when the micro-batches are equal
        cost.time_s = _streamed_time(cost, sum(passes), passes)
    return cost


def _numel(graph: Graph, value: str) -> int:
    n = 1
    for d in graph.values[value].shape:
        n *= d or 0
    return n
