"""Data-parallel scaling of the runners, measured side by side in one run: 1, 2 (and more)
processes under torchrun (PyTorch), or replicas of a MirroredStrategy (TF).

    python benchmarks/distributed_scaling.py [--processes 1 2] [--steps 300] [--model pytorch/mnist]
    python benchmarks/distributed_scaling.py --model tf/mnist     # 1 device, then 2 mirrored replicas

Each process count trains the model's params.yaml for --steps steps with the same
per-process batch (so N processes train a global batch N times larger), one thread per
process (torchrun's default), on the CPU. The rate is the mean of the logged
samples_per_sec (global samples: every process's slice) after the first log window; the
efficiency is rate(N) / (N x rate(1)). Every figure is printed, none is asserted; on a
machine with GPUs, --device gpu measures the same with NCCL.

A TF model trains in one process: 1 device without a strategy, N > 1 with
runconfig.train_distribute=mirrored over N logical CPUs (--device cpu: they share the
machine's cores) or N GPUs (--device gpu), the same per-replica batch.
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
    if model.startswith("tf/"):  # one process; N > 1: N mirrored replicas
        launch = [sys.executable]
        strategy = [] if processes == 1 else ["runconfig.train_distribute=mirrored", f"runconfig.num_devices={processes}"]
    else:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
        strategy = []
    cmd = [*launch, run_py, "--model_dir", model_dir, "--device", device, f"runconfig.max_steps={steps}",
           "runconfig.log_steps=25", f"runconfig.checkpoint_steps={steps}", *strategy]  # one save, at the end
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
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
    print(f"| {'replicas' if args.model.startswith('tf/') else 'processes'} | samples/s | efficiency |")
    print("|---|---|---|")
    for n, r in results.items():
        eff = f"{r / (n * base):.2f}" if base else "-"
        print(f"| {n} | {r:,.0f} | {eff} |")


if __name__ == "__main__":
    main()
