"""python -m tests.gallery [ENTRY ...]: run gallery entries in full and write their rows of the table in
tests/gallery/README.md (every entry by default; rows of entries not run are kept as they are).

Each row: ops captured (IR nodes, distinct ops), what validation refuses in the model as the library
builds it (dropout and stochastic depth on), validate and compile time, the emulator / eager step-time
ratio, the compile estimate on wse2 and wse3, and the gaps to the framework (harness.py).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import time
import traceback
from pathlib import Path

if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401  (torch before tensorflow in one process)

from tests.gallery.harness import DEFAULTS, RUNNERS  # noqa: E402
from tests.gallery.registry import ENTRIES, LIBRARY_MODULES  # noqa: E402

README = Path(__file__).resolve().parent / "README.md"
BEGIN, END = "<!-- table: written by python -m tests.gallery -->", "<!-- end of table -->"
HEADER = ("| model | ops (kinds) | refused as built (dropout on) | validate s | compile s | emulator / eager "
          "| samples/s wse2 | samples/s wse3 | first loss (floor: batch reversed; fp32 to float64, emulator's after /) "
          "| worst gradient (floor: batch reversed; fp32 to float64, emulator's after /) "
          "| 3 steps (floor: batch reversed; fp32 to float64, emulator's after /) "
          "| bf16 first / 3 steps (framework's bf16 first; emulator's to it) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")


def _e(value) -> str:
    return "-" if value is None else f"{value:.1e}"


def row(entry) -> str:
    try:
        refused_defaults = DEFAULTS[entry.library](entry)
        result = RUNNERS[entry.library](entry, full=True)
    except Exception as error:  # noqa: BLE001 - a row that says what broke, not a stopped table
        traceback.print_exc()
        return f"| {entry.id} | failed: {type(error).__name__}: {str(error).splitlines()[0][:160]} |"
    refused = "; ".join(sorted({r.split(":")[0] for r in refused_defaults})) or "none"
    if result.unsupported:
        return (f"| {entry.id} | {result.ops} ({result.op_kinds}) | {refused}; with dropout off: "
                f"{'; '.join(result.unsupported)[:300]} | {result.validate_s:.1f} | | | | | | | | |")
    exact = "" if result.exact_floor is None else f"; {_e(result.exact_floor)} / {_e(result.exact_err)}"
    first = _e(result.loss_err) if result.exact_loss_floor is None else (
        f"{_e(result.loss_err)} ({_e(result.loss_floor)}; {_e(result.exact_loss_floor)} / {_e(result.exact_loss_err)})")
    steps = f"{_e(result.steps_err)} ({_e(result.steps_floor)}" + (
        ")" if result.exact_steps_floor is None
        else f"; {_e(result.exact_steps_floor)} / {_e(result.exact_steps_err)})")
    worst = f"{_e(result.grad_err)} `{result.grad_worst}` ({_e(result.grad_floor)}{exact})"
    mixed = "-" if result.mixed_err is None else (
        f"{_e(result.mixed_err)} / {_e(result.mixed_steps_err)} "
        f"({_e(result.framework_mixed_err)}; {_e(result.mixed_to_framework)})")
    return (f"| {entry.id} | {result.ops} ({result.op_kinds}) | {refused} | {result.validate_s:.1f} "
            f"| {result.compile_s:.2f} | {result.ratio:.1f} | {result.samples_per_s['wse2']} "
            f"| {result.samples_per_s['wse3']} | {first} | {worst} | {steps} | {mixed} |")


def write(rows: dict[str, str]) -> None:
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    old = {m.group(1): m.group(0) for m in re.finditer(r"^\| (\S+) \|.*$", text[start:end], re.M)
           if m.group(1) in ENTRIES}
    old.update(rows)
    body = "\n".join(old[k] for k in ENTRIES if k in old)
    README.write_text(f"{text[:start]}\n{HEADER}\n{body}\n{text[end:]}")


def main(argv: list[str]) -> int:
    unknown = [a for a in argv if a not in ENTRIES]
    if unknown:
        print(f"unknown gallery entries {unknown}; known: {', '.join(ENTRIES)}", file=sys.stderr)
        return 2
    for key in argv or list(ENTRIES):
        entry = ENTRIES[key]
        if any(importlib.util.find_spec(m) is None for m in LIBRARY_MODULES[entry.library]):
            print(f"{key}: skipped, its library is not installed")
            continue
        start = time.perf_counter()
        line = row(entry)
        write({key: line})  # row by row: an interrupted run keeps what it measured
        print(f"{key} ({time.perf_counter() - start:.0f} s): {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
