"""pytorch/mnist's training with and without the runner's thread policy (common/threads.py),
under a background load this script starts and stops.

    python benchmarks/threads_under_load.py [--loads 0 2 4] [--steps 30] [--repeats 2]

For each load N it starts N busy Python processes (each spins on a core), then trains the
default model (MLP 500-300, Adam, batch 256, the runner's train mode) for --steps steps in a
fresh process, in three variants taken in turn (default, policy, one_thread, default, ...), so
that the runs of a round meet the same load from other work on the machine too:

    default     torch as it starts: OpenMP's default wait (spin, then sleep), one thread a core
    policy      what a run.py gets (common/threads.py): OpenMP's passive wait, set before torch
                loads, and torch's thread count, which start_up() keeps
    one_thread  the passive wait and one thread: what a thread per free core gives under load

Printed: samples/s of each run with its threads and wait policy, the 1-minute load average
before it, and per load the ratio of each variant to default within a round: median and spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST = os.path.join(ROOT, "pytorch", "mnist")
VARIANTS = ("default", "policy", "one_thread")
# each busy process spins until its parent, this script, is gone (however it ends)
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"
# a user's own settings would make the variants alike: each run starts without them
CLEARED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def train_once(variant: str, steps: int, data_dir: str | None) -> dict:
    """One measurement, in this (fresh) process: samples/s of ``steps`` steps of the runner's train mode."""
    if variant == "default":
        import torch  # noqa: F401  (first: OpenMP loads before common.pytorch sets its wait policy)
    from common.pytorch.run import Runner  # common.pytorch sets the wait policy, where torch is not loaded yet

    import torch

    from common import threads
    from common.cli import effective_params, parse_command_line
    from common.folder import import_beside

    if variant == "policy":
        threads.start_up()  # the runner's start-up call (common/pytorch/run.py)
    elif variant == "one_thread":
        torch.set_num_threads(1)
    model, data, utils = import_beside(os.path.join(MNIST, "run.py"), "model", "data", "utils")

    def seconds(scratch: str, count: int) -> tuple[float, int]:
        argv = ["--model_dir", tempfile.mkdtemp(dir=scratch), "--max_steps", str(count), "runconfig.checkpoint_steps=0"]
        if data_dir:
            argv += [f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}"]
        args = parse_command_line(argv)
        params = effective_params(args, utils.default_params, MNIST, "pytorch")
        runner = Runner(args, params, model.model_fn, data.get_train_dataloader, data.get_eval_dataloader)
        started = time.perf_counter()
        runner.execute()
        return time.perf_counter() - started, params["train_input"]["batch_size"]

    with tempfile.TemporaryDirectory() as scratch:
        seconds(scratch, 5)  # warm-up: allocator, OpenMP team, page cache
        took, batch = seconds(scratch, steps)
    return {"samples_per_s": steps * batch / took, "threads": torch.get_num_threads(),
            "wait": os.environ.get("OMP_WAIT_POLICY", "default")}


def measure(variant: str, steps: int, data_dir: str | None) -> dict:
    """train_once in a fresh Python (OpenMP reads the wait policy once, when torch loads)."""
    env = {name: value for name, value in os.environ.items() if name not in CLEARED}
    env["PYTHONPATH"] = ROOT
    command = [sys.executable, os.path.abspath(__file__), "--one", variant, "--steps", str(steps)]
    command += ["--data_dir", data_dir] if data_dir else []
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a measurement failed (status {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, nargs="+", default=[0, 2, 4], help="busy processes started, per row")
    parser.add_argument("--steps", type=int, default=30, help="training steps per measurement")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the three variants per load")
    parser.add_argument("--data_dir", help="MNIST data_dir (default: params.yaml's, else the embedded digits)")
    parser.add_argument("--one", choices=VARIANTS, help=argparse.SUPPRESS)  # a measuring child
    args = parser.parse_args()
    if args.one:
        print(json.dumps(train_once(args.one, args.steps, args.data_dir)))
        return

    print(f"pytorch/mnist, {args.steps} steps a run, {len(os.sched_getaffinity(0))} cores; samples/s "
          f"[threads, wait policy] (1-minute load average before the run)", flush=True)
    summary = []
    for load in args.loads:
        busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
        try:
            time.sleep(2)
            rounds = []
            for _ in range(args.repeats):
                rates = {}
                for variant in VARIANTS:
                    before = loadavg()
                    result = measure(variant, args.steps, args.data_dir)
                    rates[variant] = result["samples_per_s"]
                    print(f"  busy {load}  {variant:8} {result['samples_per_s']:9,.0f} samples/s "
                          f"[{result['threads']}, {result['wait']}]  ({before})", flush=True)
                rounds.append(rates)
        finally:
            for process in busy:
                process.kill()
                process.wait()
        summary.append((load, rounds))
    print("per load, each variant against default in the same round: median ratio (min - max)")
    for load, rounds in summary:
        cells = []
        for variant in VARIANTS[1:]:
            ratios = [r[variant] / r["default"] for r in rounds]
            cells.append(f"{variant} {statistics.median(ratios):6.2f} ({min(ratios):.2f} - {max(ratios):.2f})")
        print(f"  busy {load}:  " + "   ".join(cells))
    print(f"load average at the end: {loadavg()}")


if __name__ == "__main__":
    main()
