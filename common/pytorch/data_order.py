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

In a data-parallel run (common/pytorch/distributed.py) every process draws the same
order with the global batch size (batch_size x processes) and takes its slice of each
global batch, so N processes see exactly the batches of one process with N times the
batch size. The state records the global batch size, and a run resumed with another
number of processes continues from the same example.

The emulator compiles the model for the first batch before training starts
(``peek_first_batch``: epoch 0's first, or the one a resumed run starts from); the loop then
continues that same draw, so that data which draws another order on each pass (a sampler that
shuffles its own list in place, a stream whose persistent workers carry on) trains on the
emulator on the CPU's batches.
"""

from __future__ import annotations

import hashlib
import itertools
import weakref
from typing import Any, Iterator

import logging

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from common.errors import UserError
from common.pytorch.distributed import SINGLE, World

logger = logging.getLogger("zoo")

_MISSING = object()

# loader -> [((seed, epoch, skip), the batches of that draw), ...] after peek_first_batch: the
# next draws of those (the training loop's, or the eval's) continue them instead of drawing
# again. A dataset or sampler with a state of its own draws another order on each pass (a
# sampler that shuffles its list in place, an IterableDataset whose persistent workers carry
# on their stream): a second draw would train on other batches than the CPU.
_PEEKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed for one epoch (nearby seeds and epochs give unrelated orders)."""
    digest = hashlib.blake2b(f"{seed}/{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _drawn(loader: DataLoader, iterable, generator: torch.Generator, epoch: int) -> list:
    """``iterable`` (the loader's sampler or batch sampler) drawn whole for ``epoch``, the
    sampler using ``generator`` (its own generator is put back after)."""
    sampler = loader.sampler
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)
    saved = getattr(sampler, "generator", _MISSING)
    if saved is not _MISSING:
        sampler.generator = generator
    try:
        return list(iterable)
    finally:
        if saved is not _MISSING:
            sampler.generator = saved


def _index_order(loader: DataLoader, generator: torch.Generator, epoch: int) -> list:
    """The epoch's batches of indices (or single indices without auto-batching), from the loader's sampler."""
    batches = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    return _drawn(loader, batches, generator, epoch)


def _slices_of_global_batches(loader: DataLoader, generator: torch.Generator, epoch: int, world: World) -> list:
    """This process's slice of each global batch (batch_size x world.size) of the epoch."""
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None or \
            type(loader.batch_sampler) is not BatchSampler:
        raise UserError("train data: a data-parallel run needs a DataLoader over a map-style dataset with "
                        "batch_size set (the processes slice each global batch of its sampler's order); "
                        "an IterableDataset, a custom batch_sampler or batch_size=None cannot be sliced")
    b = loader.batch_size
    g = b * world.size
    indices = _drawn(loader, loader.sampler, generator, epoch)
    # an incomplete last global batch cannot be shared evenly: it is left out, as drop_last does
    return [indices[k * g + world.rank * b:k * g + (world.rank + 1) * b] for k in range(len(indices) // g)]


def epoch_batches(loader: DataLoader, seed: int, epoch: int, skip: int = 0, world: World = SINGLE) -> Iterator[Any]:
    """The batches of ``epoch``, from batch ``skip`` on, in the order (seed, epoch) fixes
    (in a data-parallel run: this process's slices of the global batches)."""
    peeked = _take_peeked(loader, (seed, epoch, skip), not world.distributed)
    if peeked is not None:
        return peeked
    generator = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    if world.distributed:
        order = _slices_of_global_batches(loader, generator, epoch, world)[skip:]
    elif isinstance(loader.dataset, IterableDataset):
        return itertools.islice(iter(loader), skip, None)
    else:
        order = _index_order(loader, generator, epoch)[skip:]
    return _replay(loader, order, generator, batched=loader.batch_sampler is not None or world.distributed)


def eval_shard(loader: DataLoader, seed: int, limit: int | None = None, world: World = SINGLE) -> Iterator[Any]:
    """The eval set's batches in the fixed order of (seed, epoch 0), the first ``limit`` of them
    (all when None); in a data-parallel run, this process's share: batches rank, rank + N, ...
    of that order. The processes thus evaluate exactly the batches of one process with the same
    batch size, each once; when their number does not divide by N, the first processes get one
    batch more (nothing is padded or dropped: the runner sums the eval over the processes)."""
    peeked = _take_peeked(loader, (seed, 0, 0), not world.distributed)  # epoch 0's order, as drawn here
    if peeked is not None:
        return itertools.islice(peeked, limit)
    if isinstance(loader.dataset, IterableDataset):  # its own order: every process reads it, keeps its share
        return itertools.islice(iter(loader), world.rank, limit, world.size)
    generator = torch.Generator().manual_seed(epoch_seed(seed, 0))
    order = _index_order(loader, generator, 0)[:limit][world.rank::world.size]
    return _replay(loader, order, generator, batched=loader.batch_sampler is not None)


def peek_first_batch(loader: DataLoader, seed: int, epoch: int = 0, skip: int = 0) -> Any:
    """The first batch a run starting at batch ``skip`` of ``epoch`` draws (None if there is
    none), drawn as training (TrainOrder) or an eval (from epoch 0's start) would draw it: the
    next ``epoch_batches(loader, seed, epoch, skip)`` or ``eval_shard(loader, seed)`` gives it
    again, then the rest of that same draw (a single-process run's; any other draw first drops
    it). Where that epoch has no batch left (a run resumed at an epoch's end), the draw that
    found none is kept too, and the batch is the next epoch's first, as TrainOrder goes on.
    The emulator compiles the model for this batch before its loop starts."""
    peeks: list = []
    for key in ((seed, epoch, skip), (seed, epoch + 1, 0)):
        batches = iter(epoch_batches(loader, *key))
        first = next(batches, _MISSING)
        if first is not _MISSING:
            _PEEKED[loader] = [*peeks, (key, itertools.chain([first], batches))]
            return first
        if key[2] == 0:  # a whole epoch without a batch: training refuses it (TrainOrder)
            return None
        peeks.append((key, iter(())))
    return None


def _take_peeked(loader: DataLoader, key: tuple[int, int, int], usable: bool) -> Iterator[Any] | None:
    """The draw peek_first_batch left for ``loader`` under ``key`` (seed, epoch, skip), if it is
    the next one kept and ``usable`` (one process); it is given once, and all are dropped at the
    first draw that is not theirs."""
    peeks = _PEEKED.get(loader)
    if not peeks:
        return None
    if not usable or peeks[0][0] != key:
        del _PEEKED[loader]
        return None
    _, batches = peeks.pop(0)
    if not peeks:
        del _PEEKED[loader]
    return batches


def _replay(loader: DataLoader, order: list, generator: torch.Generator, batched: bool) -> Iterator[Any]:
    """A DataLoader with ``loader``'s settings over ``order`` (batches of indices when ``batched``, else indices)."""
    if batched:
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


def start_of(loader: DataLoader, state: dict | None, world: World = SINGLE) -> tuple[int, int, int]:
    """Where training resumes from a checkpoint's data-order ``state`` (None: the start): (epoch,
    global batches of it consumed, examples past the last whole one: a run resumed with another
    number of processes or batch size whose global batch does not divide what was consumed)."""
    if not state:
        return 0, 0, 0
    global_batch = (loader.batch_size or 1) * world.size
    epoch, batch = int(state["epoch"]), int(state["batch"])
    examples = batch * int(state.get("global_batch", global_batch))
    return epoch, examples // global_batch, examples % global_batch


class TrainOrder:
    """Endless training batches, epoch after epoch; ``state()`` says where the next one comes from."""

    def __init__(self, loader: DataLoader, seed: int, state: dict | None = None, world: World = SINGLE):
        self.loader, self.seed, self.world = loader, seed, world
        self.global_batch = (loader.batch_size or 1) * world.size
        self.epoch, self.batch, left_over = start_of(loader, state, world)  # batch: of this epoch, consumed
        if left_over:
            logger.warning("data order: the checkpoint stopped %d example(s) into epoch %d, not a multiple of "
                           "the global batch of %d; resuming at example %d", self.batch * self.global_batch +
                           left_over, self.epoch, self.global_batch, self.batch * self.global_batch)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batch": self.batch, "global_batch": self.global_batch}

    def __iter__(self) -> Iterator[Any]:
        while True:
            for batch in epoch_batches(self.loader, self.seed, self.epoch, self.batch, self.world):
                self.batch += 1
                yield batch
            if self.batch == 0:  # none consumed before this pass, none yielded by it
                raise UserError("train data: an epoch yielded no batches (is the dataset smaller than "
                                "batch_size with drop_last?)")
            self.epoch += 1
            self.batch = 0
