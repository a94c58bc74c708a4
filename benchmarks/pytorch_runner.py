"""The PyTorch runner's training loop against a minimal hand-written loop, side by side.

    python benchmarks/pytorch_runner.py [--steps 300] [--repeats 8] [--threads N] [--data_dir DIR]

Both train pytorch/mnist's default model (MLP 500-300, Adam, batch 256) on the same
DataLoader for the same number of steps, alternately (runner, hand loop, runner, ...), so
that both see the same machine load; the ratio is the median over the pairs (and, less
sensitive to other processes on a shared machine, the ratio of the fastest of each). The runner's time is its whole ``train`` mode
(data order, loss check, log lines, TensorBoard scalars, the final checkpoint); the hand
loop is zero_grad / forward / loss / backward / step. Printed: the median time per step of
each and their ratio (target <= 1.05), and the input pipeline's samples/s (the same
batches the runner reads, without the model) against the samples/s the model consumes
(target >= 3x).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import tempfile
import time

import torch
import torch.nn.functional as F

from common.cli import effective_params, parse_command_line
from common.folder import import_beside
from common.pytorch.data_order import TrainOrder
from common.pytorch.run import Runner

MNIST = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "pytorch", "mnist")
model, data, utils = import_beside(os.path.join(MNIST, "run.py"), "model", "data", "utils")


def params_for(model_dir: str, steps: int, data_dir: str | None):
    argv = ["--model_dir", model_dir, "--max_steps", str(steps), "runconfig.checkpoint_steps=0"]
    if data_dir:
        argv += [f"train_input.data_dir={data_dir}", f"eval_input.data_dir={data_dir}"]
    args = parse_command_line(argv)
    return args, effective_params(args, utils.default_params, MNIST, "pytorch")


def time_runner(steps: int, data_dir: str | None, scratch: str) -> float:
    """Seconds for ``steps`` steps of the runner's train mode (set-up before it excluded)."""
    args, params = params_for(tempfile.mkdtemp(dir=scratch), steps, data_dir)
    runner = Runner(args, params, model.model_fn, data.get_train_dataloader, data.get_eval_dataloader)
    started = time.perf_counter()
    runner.execute()
    return time.perf_counter() - started


def time_hand_loop(steps: int, data_dir: str | None, scratch: str) -> float:
    """Seconds for ``steps`` steps of the plainest PyTorch loop over the same model and DataLoader."""
    _, params = params_for(scratch, steps, data_dir)
    torch.manual_seed(0)
    net = model.model_fn(params, torch.device("cpu")).model
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    loader = data.get_train_dataloader(params)
    started = time.perf_counter()
    done = 0
    while done < steps:
        for images, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(net(images), labels)
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    return time.perf_counter() - started


def input_samples_per_sec(batches: int, data_dir: str | None, scratch: str) -> float:
    """The runner's input path alone: batches in (seed, epoch) order, no model."""
    _, params = params_for(scratch, batches, data_dir)
    loader = data.get_train_dataloader(params)
    order = iter(TrainOrder(loader, seed=0))
    samples = 0
    started = time.perf_counter()
    for _ in range(batches):
        images, _ = next(order)
        samples += len(images)
    return samples / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per measurement")
    parser.add_argument("--repeats", type=int, default=8, help="measurements of each, interleaved")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's; 1 is steadier on a busy machine)")
    parser.add_argument("--data_dir", help="MNIST data_dir (default: params.yaml's, else the embedded digits)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("common.data.mnist").setLevel(logging.ERROR)  # the "using embedded digits" line, once per loader

    with tempfile.TemporaryDirectory() as scratch:
        time_runner(20, args.data_dir, scratch)  # warm-up: allocator, BLAS threads, page cache
        time_hand_loop(20, args.data_dir, scratch)
        runner_times, hand_times = [], []
        for _ in range(args.repeats):
            runner_times.append(time_runner(args.steps, args.data_dir, scratch) / args.steps)
            hand_times.append(time_hand_loop(args.steps, args.data_dir, scratch) / args.steps)
        input_rate = input_samples_per_sec(args.steps, args.data_dir, scratch)

    _, params = params_for("unused", args.steps, args.data_dir)
    batch = params["train_input"]["batch_size"]
    paired = statistics.median(r / h for r, h in zip(runner_times, hand_times))
    consumed = batch / min(runner_times)  # the model at its fastest: the hardest case for the input
    print(f"pytorch/mnist, batch {batch}, {args.steps} steps x {args.repeats} repeats, "
          f"{torch.get_num_threads()} threads")
    for name, times in (("runner", runner_times), ("hand loop", hand_times)):
        print(f"  {name:10} median {1e3 * statistics.median(times):8.3f} ms/step, fastest {1e3 * min(times):8.3f}"
              f"  (all: {', '.join(f'{1e3 * t:.2f}' for t in times)})")
    print(f"  ratio runner / hand loop: {paired:.3f} (median of pairs), {min(runner_times) / min(hand_times):.3f} "
          f"(fastest)   target <= 1.05")
    print(f"  input pipeline {input_rate:12,.0f} samples/s vs model consumption {consumed:10,.0f} samples/s: "
          f"{input_rate / consumed:.1f}x   target >= 3x")

if __name__ == "__main__":
    main()
