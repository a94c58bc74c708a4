"""python -m tests.gallery.conditioning [ENTRY ...]: how far fp32 itself is from the exact
gradients of a torchvision gallery entry, beside how far the emulator is.

The gallery's floor (harness.py) is the gap between two fp32 runs that add their sums in
another order. In an ill-conditioned setting (deep batch norm over maps of 2x2 or 4x4, a
batch of 4) both runs can be far from the exact gradients while close to each other, so a
gap to torch's fp32 says little on its own. Here each is measured against torch in float64
(the same weights and batch as harness.py's first step):

    torch fp32 -> float64    the worst weight's max |fp32 - fp64| / max |fp64| (harness.grad_gap)
    emulator   -> float64    the same for the emulator's first-step gradients

An emulator within a small factor of torch's own fp32 error computes what fp32 can; one far
beyond it has an error of its own. Prints one line per entry (torchvision entries only).
"""

from __future__ import annotations

import copy
import sys

import torch  # noqa: F401  (before anything that imports tensorflow)

from tests.gallery.harness import batches, grad_gap
from tests.gallery.registry import ENTRIES


def measure(entry) -> tuple[float, str, float, str]:
    """(torch fp32 gap, its worst weight, emulator gap, its worst weight), both to float64."""
    import torch.nn.functional as F

    from device.capture.torch import capture, state_of, weights_of
    from device.runtime.program import Program

    torch.manual_seed(0)
    model = entry.build(False)
    exact = copy.deepcopy(model).double()
    images, labels = (torch.from_numpy(a) for a in batches(entry, "NCHW", 1)[0])

    def loss_of(m, x):
        out = m(x)
        return F.cross_entropy(out["out"] if entry.task == "segment" else out, labels)

    graph = capture(lambda batch: loss_of(model, batch[0]), model, (images, labels),
                    optimizer=torch.optim.SGD(model.parameters(), lr=1e-3))
    weights = {k: v.copy() for k, v in weights_of(model, graph).items()}
    state = {k: v.copy() for k, v in state_of(model, graph).items()}
    _, emulator = Program(graph, weights, state, seed=0).gradients([images.numpy(), labels.numpy()])
    loss_of(model, images).backward()
    fp32 = {k: p.grad.numpy().copy() for k, p in model.named_parameters() if p.grad is not None}
    loss_of(exact, images.double()).backward()
    fp64 = {k: p.grad.numpy() for k, p in exact.named_parameters() if p.grad is not None}
    return (*grad_gap(fp32, fp64), *grad_gap(emulator, fp64))


def main(names: list[str]) -> int:
    entries = [e for e in ENTRIES.values()
               if e.library == "torchvision" and (not names or e.id in names or e.name in names)]
    if not entries:
        print(f"error: no torchvision gallery entry among {names}", file=sys.stderr)
        return 2
    for entry in entries:
        torch_gap, torch_worst, emulator_gap, emulator_worst = measure(entry)
        print(f"{entry.id}: torch fp32 -> float64 {torch_gap:.1e} ({torch_worst}); emulator -> float64 "
              f"{emulator_gap:.1e} ({emulator_worst}); ratio {emulator_gap / max(torch_gap, 1e-30):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
