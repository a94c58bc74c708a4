"""Data-parallel training across processes: ``torchrun`` runs the zoo's run.py N times.

    torchrun --nproc_per_node 2 pytorch/mnist/run.py --mode train

torchrun starts N processes and tells each its place (the environment variables RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); run.py reads them here. With
WORLD_SIZE > 1 the run is data parallel:

- one process group, gloo on the CPU and NCCL on GPUs (``--device gpu``: process k uses
  GPU LOCAL_RANK); every collective gives up after ``ZOO_DIST_TIMEOUT_S`` seconds
  (default 600) instead of waiting for a lost process for ever;
- the model in ``DistributedDataParallel`` (the gradients averaged across processes in
  the backward pass); the same weights everywhere, from rank 0's;
- the global batch is train_input.batch_size x WORLD_SIZE: each training step draws one
  global batch from the data order a single process with that batch size would draw
  (common/pytorch/data_order.py), and process k takes its k-th slice. Two processes with
  batch B thus train on exactly the examples of one process with batch 2B, step by step;
- rank 0 alone writes into model_dir (the run lock, params, checkpoints, TensorBoard,
  predictions) and logs; the others log warnings and errors only, prefixed with their rank;
- the logged loss is the mean of the processes' losses (the loss of the global batch);
- eval and eval_all share the eval set: process k evaluates batches k, k + N, ... of the
  order one process evaluates (common/pytorch/data_order.eval_shard), each batch once, none
  padded or dropped; the loss sum, the example count and every metric's sums (``summed``,
  common/pytorch/metrics.py) are added up over the processes, so the metrics are those of one
  process over the whole eval set (up to the order of the float64 additions); rank 0 reports.
  predict runs whole on every process, and rank 0 writes the predictions.

A checkpoint is the same whatever the number of processes, and records where the data
order stands in examples: resuming with another WORLD_SIZE continues from the same example.
The device (``--device emulator``, ``--validate_only``, ``--compile_only``) is one process
per run: the emulator models one system, and a launch of several processes is refused.

When a process fails, torchrun stops the others (SIGTERM), and they stop as after a
Ctrl-C: the step under way finishes, or a collective fails because its peer is gone; rank
0 says which in one line, and the same command resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from common.errors import UserError

logger = logging.getLogger("zoo")

TIMEOUT_ENV = "ZOO_DIST_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class World:
    """This process's place among the run's processes (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


SINGLE = World()


def _env_int(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise UserError(f"environment variable {name}={value!r}: not an integer (torchrun sets it)") from None


def world_from_env() -> World:
    """The World torchrun's environment describes; one process when WORLD_SIZE is unset."""
    size = _env_int("WORLD_SIZE", 1)
    if size is None or size < 1:
        raise UserError(f"environment variable WORLD_SIZE={size}: must be at least 1")
    if size == 1:
        return SINGLE
    rank = _env_int("RANK", None)
    if rank is None or not 0 <= rank < size:
        raise UserError(f"environment variable RANK={os.environ.get('RANK')!r}: a data-parallel run "
                        f"(WORLD_SIZE={size}) needs each process's RANK in 0..{size - 1}: launch it with torchrun")
    return World(rank, size, _env_int("LOCAL_RANK", 0) or 0)


def timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV, str(DEFAULT_TIMEOUT_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UserError(f"environment variable {TIMEOUT_ENV}={value!r}: a number of seconds above 0")
    return seconds


def refuse_on_device(world: World, what: str) -> None:
    if world.distributed:
        raise UserError(f"{what} runs in one process: the emulated device is one system per run, but this is "
                        f"process {world.rank} of {world.size} (WORLD_SIZE); launch it without torchrun")


def init(world: World, device_flag: str) -> torch.device:
    """Join the process group (gloo on the CPU, NCCL on GPUs); this process's device."""
    if device_flag == "gpu":
        if not torch.cuda.is_available():
            raise UserError(f"--device gpu: no CUDA device is available to torch {torch.__version__}")
        if world.local_rank >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {world.local_rank}: this machine has {torch.cuda.device_count()} GPU(s); "
                            f"start at most that many processes per node (--nproc_per_node)")
        torch.cuda.set_device(world.local_rank)
        backend, device = "nccl", torch.device("cuda", world.local_rank)
    else:
        backend, device = "gloo", torch.device("cpu")
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s()))
    return device


def finish() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class ZooDDP(DistributedDataParallel):
    """DistributedDataParallel that stays out of the model code's way: attributes the wrapper
    lacks are the wrapped module's (``self.model.transformer``), and state dicts carry the
    module's own names (no ``module.`` prefix), so checkpoints are those of one process."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)

    def state_dict(self, *args, **kwargs):
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        return self.module.load_state_dict(*args, **kwargs)


def wrap(module: torch.nn.Module, device: torch.device) -> ZooDDP:
    """The model in DDP; rank 0's parameters and buffers are broadcast to every process."""
    ids = [device.index] if device.type == "cuda" else None
    return ZooDDP(module, device_ids=ids)


def mean_across(value: float, world: World) -> float:
    """The mean of ``value`` over the processes (a float64 all-reduce)."""
    if not world.distributed:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return float(t.item()) / world.size


def sum_across(arrays: list[np.ndarray], world: World) -> list[np.ndarray]:
    """Each array summed over the processes, as float64 (one all-reduce for all of them)."""
    if not world.distributed or not arrays:
        return arrays
    flat = [np.asarray(a, np.float64).reshape(-1) for a in arrays]
    t = torch.from_numpy(np.concatenate(flat))
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    total = t.cpu().numpy()
    sums, start = [], 0
    for a, f in zip(arrays, flat):
        sums.append(total[start:start + f.size].reshape(np.shape(a)))
        start += f.size
    return sums
