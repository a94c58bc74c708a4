"""Device profiles: every hardware number the compiler and the cost model use.

Each figure comes from /work/shared/reference/wafer-facts.md ("facts" below) or is
derived from it here, with the derivation in a comment. Nothing else in device/ holds a
hardware constant: the passes read them from a ``Profile``.

Derivations shared by every profile:

- clock: the facts give 0.85-1.1 GHz as a parameter; we take the midpoint, 0.975 GHz.
  It is also what the published totals imply: memory bandwidth / PEs / 24 B per cycle
  is 0.94 GHz (WSE-1), 0.98 GHz (WSE-2), 0.97 GHz (WSE-3); fabric bandwidth / PEs /
  (4 links x 32 bit x 2 directions) is 0.98, 1.01 and 0.93 GHz.
- SRAM: 48 KB per PE, read as 48 KiB (x 850k PEs = 41.8 GB, the facts say 40 GB).
- SRAM bandwidth per PE: 2 reads + 1 write of 64 bit per cycle = 24 B/cycle (facts).
- fabric: one 32-bit word per cycle per link per direction, 4 links per PE (facts).
- flops per cycle per PE (an assumption; the facts give no compute figure): the
  datapath is sized to the SRAM ports. An FMAC in the device's dataflow reads a weight
  and a partial sum and writes the partial sum back, i.e. 2 reads + 1 write, which is
  exactly the port set; a 64-bit port carries 4 fp16 or 2 fp32 values, so the ports
  feed 4 fp16 FMACs (8 flops) or 2 fp32 FMACs (4 flops) per cycle. Whether a given
  kernel reaches that rate is the cost model's SRAM roofline (device/cost.py).
- external link for weight streaming (an assumption; the facts give no MemoryX rate):
  weights reach the wafer through the system I/O, 12 x 100 GbE = 1.2 Tb/s (facts).
- fabric size: the facts' "fabric the SDK addresses" (WSE-2 757 x 996 = 754k PEs,
  WSE-3 762 x 1172 = 893k PEs): the compiler places kernels on that rectangle; the
  marketed PE count (850k, 900k) is kept for the published totals only. WSE-1 has no
  published fabric size; we assume 600 x 633 = 380k PEs, the facts' usable count.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoo_base.errors import UserError

KIB = 1024

@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    width: int  # PEs across the fabric the compiler places on
    height: int  # PEs down
    marketed_pes: int  # the facts' PE count (includes PEs the SDK does not address)
    sram_bytes_per_pe: int
    sram_total_bytes: float  # published on-chip SRAM, for the consistency check only
    memory_bandwidth_bytes_s: float  # published total, for the consistency check only
    fabric_bandwidth_bits_s: float  # published total, for the consistency check only
    clock_hz: float
    system_io_bits_s: float
    external_link_bits_s: float  # weight streaming: external store <-> wafer
    flops_per_cycle_fp16: int  # any 16-bit format: fp16, bf16, cb16
    flops_per_cycle_fp32: int
    sram_bytes_per_cycle: int  # per PE
    fabric_links: int = 4  # per PE
    fabric_words_per_cycle_per_link: int = 1  # per direction
    fabric_word_bytes: int = 4

    @property
    def pes(self) -> int:
        """PEs of the fabric the compiler places kernels on."""
        return self.width * self.height

    @property
    def sram_bytes(self) -> int:
        return self.pes * self.sram_bytes_per_pe

    def flops_per_cycle(self, precision: str) -> int:
        return self.flops_per_cycle_fp32 if precision == "float32" else self.flops_per_cycle_fp16

    def peak_flops(self, precision: str) -> float:
        """Peak flop/s of the whole placeable fabric in one compute format."""
        return self.pes * self.flops_per_cycle(precision) * self.clock_hz

    @property
    def link_bytes_s(self) -> float:
        """One fabric link, one direction."""
        return self.fabric_words_per_cycle_per_link * self.fabric_word_bytes * self.clock_hz

    @property
    def system_io_bytes_s(self) -> float:
        return self.system_io_bits_s / 8

    @property
    def external_link_bytes_s(self) -> float:
        return self.external_link_bits_s / 8


# per-PE figures shared by every generation (facts: "the same" per PE; see the module docstring)
_PER_PE = dict(
    sram_bytes_per_pe=48 * KIB,
    clock_hz=0.975e9,
    system_io_bits_s=1.2e12,
    external_link_bits_s=1.2e12,
    flops_per_cycle_fp16=8,
    flops_per_cycle_fp32=4,
    sram_bytes_per_cycle=24,
)


def _test_fabric(name: str, side: int) -> Profile:
    """A side x side fabric whose totals follow from the per-PE figures (4 links of 32-bit words, both ways)."""
    pes = side * side
    return Profile(
        name=name, description=f"test fabric, {side} x {side} PEs with WSE per-PE figures",
        width=side, height=side, marketed_pes=pes,
        sram_total_bytes=pes * _PER_PE["sram_bytes_per_pe"],
        memory_bandwidth_bytes_s=pes * _PER_PE["sram_bytes_per_cycle"] * _PER_PE["clock_hz"],
        fabric_bandwidth_bits_s=pes * 4 * 32 * 2 * _PER_PE["clock_hz"], **_PER_PE)


PROFILES: dict[str, Profile] = {
    "wse1": Profile(
        name="wse1", description="WSE-1 (CS-1); fabric size assumed, not published",
        width=600, height=633, marketed_pes=400_000,
        sram_total_bytes=18e9, memory_bandwidth_bytes_s=9e15, fabric_bandwidth_bits_s=100e15, **_PER_PE),
    "wse2": Profile(
        name="wse2", description="WSE-2 (CS-2)",
        width=757, height=996, marketed_pes=850_000,
        sram_total_bytes=40e9, memory_bandwidth_bytes_s=20e15, fabric_bandwidth_bits_s=220e15, **_PER_PE),
    "wse3": Profile(
        name="wse3", description="WSE-3 (CS-3)",
        width=762, height=1172, marketed_pes=900_000,
        sram_total_bytes=44e9, memory_bandwidth_bytes_s=21e15, fabric_bandwidth_bits_s=214e15, **_PER_PE),
    # small fabrics for tests and quick looks: the per-PE figures of a real wafer, fewer PEs
    "tiny": _test_fabric("tiny", 32),
    "small": _test_fabric("small", 128),
}


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise UserError(f"unknown device profile {name!r}; valid profiles: {', '.join(sorted(PROFILES))}") from None
