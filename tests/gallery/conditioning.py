"""python -m tests.gallery.conditioning [ENTRY ...]: how far fp32 itself is from the exact
gradients and losses of a gallery entry, beside how far the emulator is.

The gallery's batch-reversal floor (harness.py) is the gap between two fp32 runs that add their
sums in another order. In an ill-conditioned setting (deep batch norm over maps of 2x2 or 4x4, a
batch of 4) both runs can be far from the exact values while close to each other, so a gap to the
framework's fp32 says little on its own. The harness's full run measures each against the
framework in float64 (the same weights and batches); this prints those figures:

    fp32 -> float64       the worst weight's max |fp32 - fp64| / max |fp64| (harness.grad_gap), the
                          first loss and the worst of the STEPS losses, relative
    emulator -> float64   the same for the emulator

An emulator within a small factor of the framework's own fp32 error computes what fp32 can; one
far beyond it has an error of its own. Prints one line per entry (one library per process: torch
and TensorFlow are imported by the entries' runners).
"""

from __future__ import annotations

import importlib.util
import sys

if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401  (before anything that imports tensorflow)

from tests.gallery.harness import RUNNERS  # noqa: E402
from tests.gallery.registry import ENTRIES  # noqa: E402


def line(result) -> str:
    def pair(framework: float, emulator: float) -> str:
        return f"{framework:.1e} / {emulator:.1e} (ratio {emulator / max(framework, 1e-30):.1f})"

    return (f"{result.entry.id}: fp32 -> float64 / emulator -> float64: gradients "
            f"{pair(result.exact_floor, result.exact_err)}, worst {result.exact_worst}; first loss "
            f"{pair(result.exact_loss_floor, result.exact_loss_err)}; steps "
            f"{pair(result.exact_steps_floor, result.exact_steps_err)}")


def main(names: list[str]) -> int:
    entries = [e for e in ENTRIES.values() if not names or e.id in names or e.name in names]
    if not entries:
        print(f"error: no gallery entry among {names}", file=sys.stderr)
        return 2
    for entry in entries:
        print(line(RUNNERS[entry.library](entry, full=True)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
