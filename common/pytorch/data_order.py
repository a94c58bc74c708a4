"""The order of training batches: fixed by (seed, epoch) and resumable mid-epoch.

A DataLoader with ``shuffle=True`` draws its order (and its workers' seeds) from the
global torch RNG, which dropout also draws from; then the order depends on everything
that ran before, and a resumed run cannot replay it. Here each epoch gets a generator
seeded from (seed, epoch): the epoch's batches of indices are drawn from the loader's own
sampler with that generator, and a DataLoader with the same settings replays them, from
the first batch not yet consumed. Training 2N steps in one run and N + N with a resume
in between thus sees the same batches, and the global RNG is left to the model.

Samplers with a ``generator`` attribute (RandomSampler, SubsetRandomSampler,
WeightedRandomSampler) get the epoch's generator; samplers with ``set_epoch``
(DistributedSampler) get the epoch. An IterableDataset keeps its own order; resuming it
skips the consumed batches by reading them.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset

from common.errors import UserError

_MISSING = object()


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for one epoch (nearby seeds and epochs give unrelated orders)."""
    digest = hashlib.blake2b(f"{seed}/{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _index_order(loader: DataLoader, generator: torch.Generator, epoch: int) -> list:
    """The epoch's batches of indices (or single indices without auto-batching), from the loader's sampler."""
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    saved = getattr(sampler, "generator", _MISSING)
    if saved is not _MISSING:
        sampler.generator = generator
    try:
        return list(loader.batch_sampler if loader.batch_sampler is not None else sampler)
    finally:
        if saved is not _MISSING:
            sampler.generator = saved


def epoch_batches(loader: DataLoader, seed: int, epoch: int, skip: int = 0) -> Iterator[Any]:
    """The batches of ``epoch``, from batch ``skip`` on, in the order (seed, epoch) fixes."""
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    if isinstance(loader.dataset, IterableDataset):
        return itertools.islice(iter(loader), skip, None)
    order = _index_order(loader, generator, epoch)[skip:]
    if loader.batch_sampler is not None:
        indices: dict[str, Any] = {"batch_sampler": order}
    else:
        indices = {"batch_size": None, "sampler": order}
    replay = DataLoader(
        loader.dataset, **indices, num_workers=loader.num_workers, collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory, timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=generator,  # the workers' seeds, drawn from it, follow (seed, epoch) too
        prefetch_factor=loader.prefetch_factor, pin_memory_device=loader.pin_memory_device,
        in_order=loader.in_order)
    return iter(replay)


class TrainOrder:
    """Endless training batches, epoch after epoch; ``state()`` says where the next one comes from."""

    def __init__(self, loader: DataLoader, seed: int, state: dict | None = None):
        self.loader, self.seed = loader, seed
        self.epoch = int(state["epoch"]) if state else 0
        self.batch = int(state["batch"]) if state else 0  # batches of this epoch already consumed

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch}

    def __iter__(self) -> Iterator[Any]:
        while True:
            produced = 0
            for batch in epoch_batches(self.loader, self.seed, self.epoch, self.batch):
                self.batch += 1
                produced += 1
                yield batch
            if produced == 0 and self.batch == 0:
                raise UserError("train data: an epoch yielded no batches (is the dataset smaller than "
                                "batch_size with drop_last?)")
            self.epoch += 1
            self.batch = 0
