"""Helpers that folders written for the vendor's zoo import from ``common.pytorch.utils``.

    get_input_dtype          the dtype a data loader casts its inputs to
    get_params               a params file read as it is written (a script beside a folder's run.py)
    BufferedShuffleDataset   an iterable dataset shuffled through a buffer, seeded by Python's random

Each behaves as the vendor's did where no vendor system is present.
"""

from __future__ import annotations

import logging
import random

import torch

from common.errors import UserError
from common.params import read_yaml

logger = logging.getLogger("zoo")


def get_input_dtype(to_float16: bool) -> torch.dtype:
    """The dtype a data loader casts its inputs to: float16 when asked for and a GPU is there,
    else float32 (as the vendor's: a CPU model takes float32 inputs; 16-bit compute on the CPU
    and the emulator comes from params' mixed_precision, not from the inputs)."""
    if to_float16 and not torch.cuda.is_available():
        logger.info("to_float16: the inputs stay float32 without a GPU (16-bit compute: mixed_precision.enabled)")
        return torch.float32
    return torch.float16 if to_float16 else torch.float32


def get_params(params_file: str, config: str | None = None) -> dict:
    """The params file as it is written (no defaults, no checks of its keys), as the vendor's ``get_params``;
    with ``config``, the section of that name (a file holding several configs)."""
    params, lines = read_yaml(params_file)
    if config is None:
        return params
    if config not in params:
        raise UserError(f"{params_file}: no config {config!r} (it has {', '.join(map(repr, params)) or 'none'})")
    if not isinstance(params[config], dict):
        raise UserError(f"{params_file}:{lines.get((config,), 1)}: config {config!r} must be a mapping of "
                        f"sections, got {type(params[config]).__name__}")
    return params[config]


class BufferedShuffleDataset(torch.utils.data.IterableDataset):
    """The items of the iterable ``dataset`` in an order shuffled through a buffer of ``buffer_size`` items.

    The buffer is filled with the first ``buffer_size`` items; from then on each item read
    replaces one drawn at random from the buffer, which is yielded; at the end the buffer is
    yielded in a random order. So item i comes out at position i - buffer_size + 1 or later,
    no more than buffer_size + 1 items are held at once, a buffer of 1 keeps the order, and a
    buffer as large as the dataset shuffles it fully. The draws come from Python's ``random``
    module, as the vendor's: seed it (``random.seed``, in a DataLoader's worker_init_fn for
    workers) for a repeatable order.
    """

    def __init__(self, dataset, buffer_size: int):
        super().__init__()
        if not isinstance(buffer_size, int) or isinstance(buffer_size, bool) or buffer_size < 1:
            raise UserError(f"BufferedShuffleDataset: buffer_size must be a whole number of at least 1 (the input's "
                            f"shuffle_buffer), got {buffer_size!r}")
        self.dataset = dataset
        self.buffer_size = buffer_size

    def __iter__(self):
        buffer = []
        for item in self.dataset:
            if len(buffer) < self.buffer_size:
                buffer.append(item)
                continue
            slot = random.randrange(self.buffer_size)
            yield buffer[slot]
            buffer[slot] = item
        random.shuffle(buffer)
        yield from buffer

    def __len__(self) -> int:
        return len(self.dataset)
