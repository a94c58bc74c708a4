"""Helpers that folders written for the vendor's zoo import from ``common.pytorch.utils``."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("zoo")


def get_input_dtype(to_float16: bool) -> torch.dtype:
    """The dtype a data loader casts its inputs to: float16 when asked for and a GPU is there,
    else float32 (as the vendor's: a CPU model takes float32 inputs; 16-bit compute on the CPU
    and the emulator comes from params' mixed_precision, not from the inputs)."""
    if to_float16 and not torch.cuda.is_available():
        logger.info("to_float16: the inputs stay float32 without a GPU (16-bit compute: mixed_precision.enabled)")
        return torch.float32
    return torch.float16 if to_float16 else torch.float32
