"""Data-parallel scaling of the PyTorch runner: 1, 2 (and more) processes under torchrun,
measured side by side in one run.

    python benchmarks/distributed_scaling.py [--processes 1 2] [--steps 300] [--model pytorch/mnist]

Each process count trains the model's params.yaml for --steps steps with the same
per-process batch (so N processes train a global batch N times larger), one thread per
process (torchrun's default), on the CPU. The rate is the mean of the logged
samples_per_sec (global samples: every process's slice) after the first log window; the
efficiency is rate(N) / (N x rate(1)). Every figure is printed, none is asserted; on a
machine with GPUs, --device gpu measures the same with NCCL.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from common.summaries import read_scalars

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rate(model: str, processes: int, steps: int, device: str, workdir: str) -> float:
    model_dir = os.path.join(workdir, f"p{processes}")
    run_py = os.path.join(ROOT, model, "run.py")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    cmd = [*launch, run_py, "--model_dir", model_dir, "--device", device, f"runconfig.max_steps={steps}",
           "runconfig.log_steps=25", "runconfig.checkpoint_steps=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{processes} process(es) failed:\n{done.stderr[-3000:]}")
    rates = [v for _, v in read_scalars(os.path.join(model_dir, "train"))["samples_per_sec"]]
    return statistics.mean(rates[1:] or rates)  # the first window holds the workers' start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="pytorch/mnist")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    args = parser.parse_args()
    print(f"{args.model} params.yaml, {args.steps} steps, {os.cpu_count()} CPU cores, device {args.device}")
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for n in args.processes:
            results[n] = rate(args.model, n, args.steps, args.device, workdir)
    base = results.get(1)
    print("| processes | samples/s | efficiency |")
    print("|---|---|---|")
    for n, r in results.items():
        eff = f"{r / (n * base):.2f}" if base else "-"
        print(f"| {n} | {r:,.0f} | {eff} |")


if __name__ == "__main__":
    main()
