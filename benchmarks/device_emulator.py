"""The emulator's training step against PyTorch's eager CPU step on pytorch/mnist, fp32,
measured side by side in one run; the time of --compile_only beyond the framework's import;
peak memory.

    python benchmarks/device_emulator.py [--rounds 15] [--steps 20]

Targets (issue 4): emulator / eager at most 1.5 (both are BLAS-bound at this size);
--compile_only under 5 s beyond the import. Every figure is printed, none is asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

import torch  # before anything that could import TensorFlow

from common.folder import load_run_module
from common.params import load_params
from common.pytorch.device_run import capture_step, first_batch
from common.pytorch.run import seed_everything
from device.api import build_program, torch_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MNIST = os.path.join(ROOT, "pytorch", "mnist")


def peak_rss_mb(who=resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds of each contender")
    parser.add_argument("--steps", type=int, default=20, help="training steps per round")
    args = parser.parse_args()

    run_module = load_run_module(MNIST)
    params = load_params(os.path.join(MNIST, "configs", "params.yaml"), run_module.utils.default_params())
    seed_everything(0)
    loader = run_module.data.get_train_dataloader(params)
    batch = tuple(first_batch(loader, 0))  # one batch of 256 real digits, reused by both contenders
    model = run_module.model.model_fn(params, torch.device("cpu"))

    start = time.perf_counter()
    graph, _ = capture_step(model, batch, True, params)
    capture_s = time.perf_counter() - start
    program = build_program(graph, torch_weights(model.model, graph))
    lr = params["optimizer"]["learning_rate"]
    numpy_batch = [t.numpy() for t in batch]

    def eager_round():
        for _ in range(args.steps):
            model.optimizer.zero_grad(set_to_none=True)
            loss, _ = model(batch)
            loss.backward()
            model.optimizer.step()

    def emulator_round():
        for _ in range(args.steps):
            program.train_step(numpy_batch, lr)

    model.model.train()
    eager_round(), emulator_round()  # warm up both
    ratios, eager_ms, emulator_ms = [], [], []
    for _ in range(args.rounds):  # interleaved, so that the machine's noise hits both alike
        t0 = time.perf_counter()
        eager_round()
        t1 = time.perf_counter()
        emulator_round()
        t2 = time.perf_counter()
        eager_ms.append((t1 - t0) / args.steps * 1e3)
        emulator_ms.append((t2 - t1) / args.steps * 1e3)
        ratios.append((t2 - t1) / (t1 - t0))

    print(f"pytorch/mnist MLP {list(params['model']['hidden_sizes'])}, batch {batch[0].shape[0]}, fp32, "
          f"dropout {params['model']['dropout']}, {torch.get_num_threads()} torch threads")
    print(f"  eager step      median {statistics.median(eager_ms):7.2f} ms")
    print(f"  emulator step   median {statistics.median(emulator_ms):7.2f} ms")
    q = statistics.quantiles(ratios, n=4)
    print(f"  emulator/eager  median {statistics.median(ratios):.2f} (quartiles {q[0]:.2f}-{q[2]:.2f}; target <= 1.5)")
    print(f"  capture of the training step: {capture_s:.2f} s")
    print(f"  peak memory of this process: {peak_rss_mb():.0f} MB")

    # --compile_only end to end, against the bare import of the same framework
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, torchvision"], check=True, env=env)
    import_s = time.perf_counter() - t0
    with_dir = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"zoo_bench_compile_{os.getpid()}")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(MNIST, "run.py"), "--compile_only", "--model_dir", with_dir],
                   check=True, env=env, capture_output=True)
    compile_s = time.perf_counter() - t0
    print(f"  --compile_only of pytorch/mnist: {compile_s:.1f} s, of which import torch+torchvision "
          f"{import_s:.1f} s: {compile_s - import_s:.1f} s beyond the import (target < 5 s)")
    print(f"  peak memory of the --compile_only process: {peak_rss_mb(resource.RUSAGE_CHILDREN):.0f} MB")


if __name__ == "__main__":
    main()
