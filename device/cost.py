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
external link: per kernel max(compute, SRAM, fabric, weight bytes / external link rate),
summed, plus a bubble per iteration (wafer-facts.md). Weight bytes per kernel and
iteration in training: fp32 weights in for the forward, again for the backward, fp32
gradients out (3x); forward only: 1x. The bubble: at the iteration boundary the external
store must finish the update before the next iteration's first weights leave, so the
last kernel's gradients and the first kernel's weights cross the link with no compute to
hide behind.

Input transmission: samples/s = system I/O / bytes of one sample's inputs (as fed, at
their dtypes). The estimate is the smaller of compute and transmission samples/s.

What bounds the estimate: "input" where transmission is the smaller; otherwise the bound
that takes most of an iteration's time: pipelined, the slowest kernel's (it paces every
stage); weight streaming, the bound under which the kernels, run one after another, spend
the most time, the bubble counting as weight streaming.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from device.dtypes import BYTES
from device.ir import Graph
from device.passes.match import Kernel, batch_size
from device.profiles import Profile

# what can bound a kernel's time, in the words the report uses; "input" can bound the whole estimate
BOUNDS = ("compute", "memory", "fabric", "weight streaming")


def pe_cycles(kernel: Kernel, profile: Profile, precision: str, training: bool) -> tuple[float, float]:
    """(compute cycles, SRAM cycles) of the kernel's work for one batch on a single PE."""
    compute = kernel.flops(training) / profile.flops_per_cycle(precision)
    sram = kernel.sram_bytes(training) / profile.sram_bytes_per_cycle
    return compute, sram


@dataclass
class KernelCost:
    name: str
    kind: str
    pes: int
    flops: float  # for one batch, forward (+ backward when training)
    sram_bytes: float
    fabric_bytes: float
    stream_bytes: float  # weight streaming: bytes over the external link
    compute_s: float
    sram_s: float
    fabric_s: float
    stream_s: float
    time_s: float
    bound_by: str  # one of BOUNDS, or free (a layout kernel: no PEs, no time)


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
        data.update(estimate=True, active_pes_pct=self.active_pes_pct,
                    compute_utilisation_pct=self.compute_utilisation_pct, bound_by=self.bound_by,
                    compute_bound_by=self.compute_bound_by, iteration_by_bound=self.iteration_by_bound,
                    kernels=[asdict(k) for k in self.kernels])
        return data


def estimate(graph: Graph, kernels: list[Kernel], placement, profile: Profile, *, training: bool) -> CostReport:
    """The performance estimate of ``kernels`` placed by ``placement`` (device.place.Placement)."""
    precision = graph.precision
    batch = batch_size(graph)
    streaming = placement.mode == "weight_streaming"
    rows = []
    for kernel in kernels:
        rect = placement.get(kernel.name)
        rows.append(_kernel_cost(kernel, rect, profile, precision, training, streaming))

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

    return CostReport(
        execution_mode=placement.mode, profile=profile.name, precision=precision, training=training,
        batch_size=batch, samples_per_s=min(compute_rate, transmission_rate),
        compute_samples_per_s=compute_rate, transmission_samples_per_s=transmission_rate,
        iteration_s=iteration, bubble_s=bubble, active_pes=placement.active_pes, fabric_pes=profile.pes,
        flops_per_sample=sum(k.flops(training) for k in kernels) / batch,
        input_bytes_per_sample=input_bytes, peak_flops=profile.peak_flops(precision), kernels=rows)


def roofline(kernel: Kernel, w: int, h: int, profile: Profile, precision: str, training: bool,
             streaming: bool = False) -> dict[str, float]:
    """Seconds of one batch of ``kernel`` on a w x h rectangle, per bound (BOUNDS)."""
    compute_cycles, sram_cycles = pe_cycles(kernel, profile, precision, training)
    pes = w * h
    boundary_links = 2 * (w + h)  # one outward link per edge PE (4 links per PE, wafer-facts.md)
    return {
        "compute": compute_cycles / (pes * profile.clock_hz),
        "memory": sram_cycles / (pes * profile.clock_hz),  # SRAM bandwidth
        "fabric": _fabric_bytes(kernel, training) / (boundary_links * profile.link_bytes_s),
        "weight streaming": _stream_bytes(kernel, training, streaming) / profile.external_link_bytes_s,
    }


def _fabric_bytes(kernel: Kernel, training: bool) -> float:
    """Activations in and out; when training the gradients cross the same boundary back."""
    return (kernel.input_bytes + kernel.activation_bytes) * (2 if training else 1)


def _stream_bytes(kernel: Kernel, training: bool, streaming: bool) -> float:
    if not streaming:
        return 0.0
    return kernel.weight_bytes * (3 if training else 1)


def _kernel_cost(kernel: Kernel, rect, profile: Profile, precision: str, training: bool,
                 streaming: bool) -> KernelCost:
    flops = kernel.flops(training)
    sram_bytes = kernel.sram_bytes(training)
    fabric_bytes = _fabric_bytes(kernel, training)
    stream_bytes = _stream_bytes(kernel, training, streaming)
    if kernel.free or rect.pes == 0:
        return KernelCost(kernel.name, kernel.kind, 0, flops, sram_bytes, fabric_bytes, 0.0,
                          0.0, 0.0, 0.0, 0.0, 0.0, "free")
    times = roofline(kernel, rect.w, rect.h, profile, precision, training, streaming)
    bound_by = max(times, key=times.get)
    return KernelCost(kernel.name, kernel.kind, rect.pes, flops, sram_bytes, fabric_bytes, stream_bytes,
                      times["compute"], times["memory"], times["fabric"], times["weight streaming"], times[bound_by],
                      bound_by)


def _numel(graph: Graph, value: str) -> int:
    n = 1
    for d in graph.values[value].shape:
        n *= d or 0
    return n
