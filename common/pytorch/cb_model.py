"""The vendor's ``cb_model`` (``from common.pytorch import cb_model as cm``) where no vendor system is present.

A folder written for the vendor's zoo asks these questions to decide how to stream its data
to the system's workers. Here there is one process and no system, so the answers are the
ones the vendor's own zoo gave without its system software: not on a CS system, one
streamer, which is the master and has rank 0. ``--device emulator`` runs through the same
answers: the emulator is fed by the one host process, like a CPU run.
"""

from __future__ import annotations

from typing import Any, Callable


def use_cs() -> bool:
    """Whether the run drives the vendor's system: never here."""
    return False


def is_wse_device() -> bool:
    return False


def is_master_ordinal() -> bool:
    return True


def is_streamer() -> bool:
    return True


def is_receiver() -> bool:
    return True


def get_streaming_rank() -> int:
    return 0


def get_ordinal() -> int:
    return 0


def num_tasks() -> int:
    return 1


def num_receivers() -> int:
    return 1


def num_streamers() -> int:
    return 1


def rendezvous(tag: str) -> None:
    """Wait for the other workers at ``tag``: with one process there is nobody to wait for."""


def step_closure(fn: Callable) -> Callable:
    return fn


def to_cpu(value: Any) -> Any:
    """Tensors (in nested lists, tuples and dicts) moved to the CPU."""
    if hasattr(value, "cpu"):
        return value.cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
