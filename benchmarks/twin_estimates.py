"""The compile estimates of the twin models side by side: pytorch/<family> and tf/<family> with
the same config should compile to the same estimate (the same math costs the same).

    python benchmarks/twin_estimates.py                          # every shared config, wse2 and wse3
    python benchmarks/twin_estimates.py --families t5 --configs params_tiny t5_base --profiles wse2

Each compile is the folder's own `run.py --params CONFIG --compile_only device.profile=PROFILE`
in a subprocess (the two frameworks never share a process), its report.json read back. The table
gives samples/s of each, their ratio (pytorch / tf), the micro-batch passes and what bounds each;
for a pair whose ratio is off by more than --tolerance, the kernels per kind of each (count,
forward FLOPs, weight bytes, activation and stash bytes). Every figure is the emulator's estimate.
A compile that fails prints its last line instead of a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("mnist", "resnet", "unet", "bert", "gpt2", "transformer", "t5")
FRAMEWORKS = ("pytorch", "tf")
KERNEL_FIGURES = ("flops_fwd", "weight_bytes", "activation_bytes", "stash_bytes")


def shared_configs(family: str) -> list[str]:
    """The config files both twins have, by name (params_tiny first: the fast one)."""
    names = [set(os.listdir(os.path.join(ROOT, fw, family, "configs"))) for fw in FRAMEWORKS]
    shared = sorted(n[:-len(".yaml")] for n in set.intersection(*names) if n.endswith(".yaml"))
    return sorted(shared, key=lambda n: ("tiny" not in n, n))


def compile_one(framework: str, family: str, config: str, profile: str, work_dir: str, timeout: int) -> dict:
    """report.json of one --compile_only, or {"error": its last line}."""
    model_dir = os.path.join(work_dir, f"{framework}_{family}_{config}_{profile}")
    command = [sys.executable, os.path.join(framework, family, "run.py"),
               "--params", os.path.join(framework, family, "configs", f"{config}.yaml"),
               "--compile_only", "--model_dir", model_dir, f"device.profile={profile}"]
    env = dict(os.environ, PYTHONPATH=ROOT)
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    report = os.path.join(model_dir, "compile", "report.json")
    if done.returncode != 0 or not os.path.exists(report):
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        return {"error": lines[-1][:160] if lines else f"exit status {done.returncode}"}
    with open(report) as f:
        return json.load(f)


def per_kind(report: dict) -> dict[str, dict[str, float]]:
    """Kernels per kind: their count and the sums of KERNEL_FIGURES."""
    kinds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for kernel in report["kernels"]:
        row = kinds[kernel["kind"]]
        row["count"] += 1
        for figure in KERNEL_FIGURES:
            row[figure] += kernel[figure]
    return kinds


def passes(perf: dict) -> str:
    return f"{perf['micro_batches']} x {perf['micro_batch_size']}" if perf.get("micro_batches") else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--configs", nargs="+", help="config names (no .yaml); default: every shared one")
    parser.add_argument("--profiles", nargs="+", default=["wse2", "wse3"])
    parser.add_argument("--tolerance", type=float, default=0.03, help="a ratio off 1 by more is a difference")
    parser.add_argument("--jobs", type=int, default=2, help="compiles at once")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per compile")
    args = parser.parse_args()

    cases = [(family, config, profile) for family in args.families for config in shared_configs(family)
             if args.configs is None or config in args.configs for profile in args.profiles]
    if not cases:
        sys.exit(f"twin_estimates: no shared config of {', '.join(args.families)} is named {args.configs}")
    with tempfile.TemporaryDirectory(prefix="twin_estimates_") as work_dir, ThreadPoolExecutor(args.jobs) as pool:
        futures = {(case, fw): pool.submit(compile_one, fw, *case, work_dir, args.timeout)
                   for case in cases for fw in FRAMEWORKS}
        reports = {key: future.result() for key, future in futures.items()}

    print(f"{'family':12s} {'config':22s} {'profile':7s} {'pytorch samples/s':>18s} {'tf samples/s':>14s} "
          f"{'ratio':>6s}  {'passes (pt / tf)':18s} bound (pt / tf)")
    differing = []
    for case in cases:
        pt, tf = reports[(case, "pytorch")], reports[(case, "tf")]
        if "error" in pt or "error" in tf:
            print(f"{case[0]:12s} {case[1]:22s} {case[2]:7s}  pytorch: {pt.get('error', 'ok')} | "
                  f"tf: {tf.get('error', 'ok')}")
            continue
        a, b = pt["performance"], tf["performance"]
        ratio = a["samples_per_s"] / b["samples_per_s"]
        mark = "" if abs(ratio - 1) <= args.tolerance else "  <- differs"
        print(f"{case[0]:12s} {case[1]:22s} {case[2]:7s} {a['samples_per_s']:18,.1f} {b['samples_per_s']:14,.1f} "
              f"{ratio:6.3f}  {passes(a) + ' / ' + passes(b):18s} {a['bound_by']} / {b['bound_by']}{mark}")
        if mark:
            differing.append((case, pt, tf))

    for case, pt, tf in differing:
        print(f"\n{' '.join(case)}: kernels per kind (pytorch / tf)")
        kinds_pt, kinds_tf = per_kind(pt), per_kind(tf)
        print(f"  {'kind':14s} {'count':>11s} " + " ".join(f"{f:>27s}" for f in KERNEL_FIGURES))
        for kind in sorted(set(kinds_pt) | set(kinds_tf)):
            x, y = kinds_pt.get(kind, {}), kinds_tf.get(kind, {})
            cells = [f"{int(x.get('count', 0)):>5d}/{int(y.get('count', 0)):<5d}"]
            cells += [f"{x.get(f, 0):>13.4g}/{y.get(f, 0):<13.4g}" for f in KERNEL_FIGURES]
            print(f"  {kind:14s} " + " ".join(cells))
        for name, report in (("pytorch", pt), ("tf", tf)):
            slowest = max(report["performance"]["kernels"], key=lambda k: k["time_s"])
            print(f"  {name:8s} slowest kernel {slowest['name']} ({slowest['kind']}, {slowest['pes']:,} PEs, "
                  f"{slowest['time_s'] * 1e3:.2f} ms, {slowest['bound_by']}); active PEs "
                  f"{report['performance']['active_pes']:,}")


if __name__ == "__main__":
    main()
