"""The emulator's training step against PyTorch's eager CPU step, per family block, fp32.

    python benchmarks/device_blocks.py [--rounds 7] [--steps 5] [--threads 1] [--blocks mlp,gpt] [--no-memory]

Rows: the pytorch/mnist MLP and the family blocks of the parity tests, at benchmark sizes:
the vision blocks of tests/device/test_family_blocks_vision.py (copied below, wider) on
batches of 32 images 3x32x32 (UNet: 8); the language blocks of
tests/device/test_family_blocks_language_torch.py and the recurrent classifiers of
tests/device/test_family_blocks_recurrent_torch.py (imported) on 48 sequences, their first
test batch tiled 16 times.

Per row, both contenders train the same model from the same weights with Adam: PyTorch
eager (zero_grad, forward, backward, optimizer.step) and the emulator (device.api's
build_program, then Program.train_step), in alternating rounds in one process so that the
machine's noise hits both alike. numpy's BLAS and torch run on the same number of threads
(--threads). Peak RSS: one child process per contender that builds and captures the block
as the parent does, then runs only that contender's steps (so both children share the
setup's memory). Targets (issue 11): emulator / eager at most 1.5 on every row, peak RSS
at most 1.5x. Every figure is printed, none is asserted.
"""

from __future__ import annotations

import argparse
import os
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import torch  # before anything that could import TensorFlow
import torch.nn.functional as F
from threadpoolctl import threadpool_limits
from torch import nn

from device.api import build_program
from device.capture.torch import capture, state_of, weights_of

LR = 1e-3


class MnistMLP(nn.Module):
    """pytorch/mnist's model at its default params: 784 -> 500 -> 300 -> 10, ReLU, dropout 0.2."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Flatten(), nn.Linear(784, 500), nn.ReLU(), nn.Dropout(0.2),
                                    nn.Linear(500, 300), nn.ReLU(), nn.Dropout(0.2), nn.Linear(300, 10))

    def forward(self, images):  # (B, 1, 28, 28) -> (B, 10)
        return self.layers(images)


# The vision blocks of tests/device/test_family_blocks_vision.py, wider (that module imports
# TensorFlow too when it is installed, which this benchmark keeps out of its process).
CLASSES = 5


class BasicBlock(nn.Module):
    """Stem conv, then ResNet's basic block: conv-bn-relu-conv-bn plus the identity."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(width)
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc = nn.Linear(width, CLASSES)

    def forward(self, x):  # (N, 3, H, W)
        x = F.relu(self.bn0(self.stem(x)))  # (N, C, H, W)
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        x = F.relu(x + y)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))  # (N, classes)


class Bottleneck(nn.Module):
    """ResNet's bottleneck block, 1x1 -> 3x3 (stride 2) -> 1x1, with a projection shortcut."""

    def __init__(self, width: int = 8, expansion: int = 4):
        super().__init__()
        out = width * expansion
        self.stem = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        self.conv1 = nn.Conv2d(16, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.project = nn.Conv2d(16, out, 1, stride=2, bias=False)
        self.bn_project = nn.BatchNorm2d(out)
        self.fc = nn.Linear(out, CLASSES)

    def forward(self, x):  # (N, 3, H, W)
        x = F.relu(self.bn0(self.stem(x)))  # (N, 16, H, W)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))  # (N, width, H/2, W/2)
        y = self.bn3(self.conv3(y))  # (N, out, H/2, W/2)
        x = F.relu(y + self.bn_project(self.project(x)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class UNetBlock(nn.Module):
    """One UNet level: down (conv, max pool, conv), up by a transposed conv and by a bilinear
    upsample, the skip concatenated, a 1x1 head to mask logits."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.down1 = nn.Conv2d(3, width, 3, padding=1)
        self.down2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.up = nn.ConvTranspose2d(2 * width, width, 2, stride=2)
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear")
        self.side = nn.Conv2d(2 * width, width, 1)
        self.fuse = nn.Conv2d(2 * width, width, 3, padding=1)
        self.head = nn.Conv2d(width, 1, 1)

    def forward(self, x):  # (N, 3, H, W)
        skip = F.relu(self.down1(x))  # (N, C, H, W)
        deep = F.relu(self.down2(F.max_pool2d(skip, 2)))  # (N, 2C, H/2, W/2)
        up = self.up(deep) + self.side(self.upsample(deep))  # (N, C, H, W)
        y = F.relu(self.fuse(torch.cat([up, skip], dim=1)))
        return self.head(y)  # (N, 1, H, W) mask logits


def _classify(model):
    return lambda batch: F.cross_entropy(model(batch[0]), batch[1])


def _images(n, size, labels):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((n, *size)).astype(np.float32))
    return [x, torch.from_numpy(labels(rng))]


def make_block(name: str):
    """(model, step_fn, batch of torch tensors, description) of one row."""
    if name == "mlp":
        model = MnistMLP()
        batch = _images(256, (1, 28, 28), lambda rng: rng.integers(0, 10, 256))
        return model, _classify(model), batch, "784-500-300-10, batch 256"
    if name in ("resnet-basic", "resnet-bottleneck"):
        model = BasicBlock() if name == "resnet-basic" else Bottleneck()
        batch = _images(32, (3, 32, 32), lambda rng: rng.integers(0, CLASSES, 32))
        return model, _classify(model), batch, "batch 32, 3x32x32"
    if name == "unet":
        model = UNetBlock()
        batch = _images(8, (3, 32, 32), lambda rng: (rng.uniform(size=(8, 1, 32, 32)) > 0.5).astype(np.float32))
        return model, lambda b: nn.BCEWithLogitsLoss()(model(b[0]), b[1]), batch, "batch 8, 3x32x32"
    if name in ("lstm", "gru"):
        from tests.device import recurrent_blocks, test_family_blocks_recurrent_torch as recurrent

        model = recurrent.TorchClassifier(name.upper())
        ids, labels = recurrent_blocks.classifier_batches()[0]
        batch = [torch.from_numpy(np.tile(ids, (16, 1))), torch.from_numpy(np.tile(labels, 16))]
        return model, _classify(model), batch, (f"48 x {ids.shape[1]} tokens, {recurrent_blocks.LAYERS} layers of "
                                                f"{recurrent_blocks.HIDDEN}")
    from tests.device import language_blocks, test_family_blocks_language_torch as language

    model, step, make = language.torch_block(name)
    tiled = [np.tile(a, (16,) + (1,) * (a.ndim - 1)) for a in language_blocks.step_batches()[0]]
    return model, step, make(tiled), f"48 x {language_blocks.SEQ} tokens, dim {language_blocks.DIM}"


BLOCKS = ("mlp", "resnet-basic", "resnet-bottleneck", "unet", "bert", "gpt", "t5", "lstm", "gru")


class Row:
    """One block, both contenders, set up from the same initial weights."""

    def __init__(self, name: str):
        torch.manual_seed(0)
        self.model, self.step, self.batch, self.description = make_block(name)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR)
        graph = capture(self.step, self.model, self.batch, optimizer=self.optimizer)
        self.program = build_program(graph, weights_of(self.model, graph), state_of(self.model, graph), seed=0)
        self.numpy_batch = [t.numpy() for t in self.batch]
        self.model.train()

    def eager(self, steps: int):
        for _ in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.step(self.batch)
            loss.backward()
            self.optimizer.step()

    def emulator(self, steps: int):
        for _ in range(steps):
            self.program.train_step(self.numpy_batch, LR)


def _rss_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, in MB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child_memory(name: str, contender: str, steps: int) -> None:
    """--child: set up the row, run one contender's steps, print its memory as JSON."""
    row = Row(name)
    setup = _rss_mb("VmRSS")
    getattr(row, contender)(steps)
    print(json.dumps({"setup_mb": setup, "peak_mb": _rss_mb("VmHWM")}))


def measure_memory(name: str, contender: str, args) -> dict | None:
    command = [sys.executable, __file__, "--child", f"{name}:{contender}", "--steps", str(args.steps),
               "--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"  memory of {name} ({contender}) not measured: {done.stderr.strip().splitlines()[-1:]}")
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternating rounds of each contender")
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--threads", type=int, default=1, help="threads of numpy's BLAS and of torch")
    parser.add_argument("--blocks", default=",".join(BLOCKS), help=f"comma-separated, of {', '.join(BLOCKS)}")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-RSS child processes")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # block:contender, for the memory children
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with threadpool_limits(args.threads):
        if args.child:
            child_memory(*args.child.split(":"), args.steps)
            return
        blocks = args.blocks.split(",")
        unknown = [b for b in blocks if b not in BLOCKS]
        if unknown:
            parser.error(f"--blocks: {unknown[0]!r} is not one of {', '.join(BLOCKS)}")
        print(f"fp32 training steps (Adam), {args.threads} thread(s) for torch and numpy's BLAS, "
              f"{args.rounds} rounds x {args.steps} steps; medians")
        header = f"{'block':18} {'eager ms':>9} {'emul. ms':>9} {'ratio':>6} {'quartiles':>11}"
        if not args.no_memory:
            header += f" {'eager MB':>9} {'emul. MB':>9} {'ratio':>6}"
        print(header + "   sizes")
        for name in blocks:
            row = Row(name)
            row.eager(1), row.emulator(1)  # warm up both
            eager_ms, emulator_ms, ratios = [], [], []
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                row.eager(args.steps)
                t1 = time.perf_counter()
                row.emulator(args.steps)
                t2 = time.perf_counter()
                eager_ms.append((t1 - t0) / args.steps * 1e3)
                emulator_ms.append((t2 - t1) / args.steps * 1e3)
                ratios.append((t2 - t1) / (t1 - t0))
            q = statistics.quantiles(ratios, n=4)
            line = (f"{name:18} {statistics.median(eager_ms):9.2f} {statistics.median(emulator_ms):9.2f} "
                    f"{statistics.median(ratios):6.2f} {q[0]:5.2f}-{q[2]:<5.2f}")
            if not args.no_memory:
                eager_mem, emulator_mem = (measure_memory(name, c, args) for c in ("eager", "emulator"))
                if eager_mem and emulator_mem:
                    line += (f" {eager_mem['peak_mb']:9.0f} {emulator_mem['peak_mb']:9.0f} "
                             f"{emulator_mem['peak_mb'] / eager_mem['peak_mb']:6.2f}")
            print(line + f"   {row.description}", flush=True)


if __name__ == "__main__":
    main()
