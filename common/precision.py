"""Mixed-precision settings from params, checked the same way for both frameworks."""

from __future__ import annotations

import logging
from typing import Mapping

from common.errors import UserError

logger = logging.getLogger("zoo")


def check_precision(params: Mapping, device: str) -> None:
    """Refuse a mixed-precision dtype that ``device`` (cpu, gpu, emulator) cannot run."""
    mp = params["mixed_precision"]
    if not mp["enabled"]:
        return
    if mp["dtype"] == "cb16" and device != "emulator":
        raise UserError("mixed_precision.dtype: cb16 exists on the device only; run with --device emulator "
                        "or use bfloat16")
    if mp["dtype"] == "float16" and device == "cpu":
        raise UserError("mixed_precision.dtype: float16 needs --device gpu (or emulator); use bfloat16 on the CPU")


def compute_precision(params: Mapping) -> str:
    """The device's compute format: mixed_precision.dtype when enabled, else float32 (one of
    device.api.PRECISIONS; params checks the dtype against HALF_PRECISIONS)."""
    mixed = params["mixed_precision"]
    return mixed["dtype"] if mixed["enabled"] else "float32"


def loss_scaling(params: Mapping) -> float | str | None:
    """The loss scaling params ask for: None, a fixed factor, or "dynamic" (mixed precision only)."""
    factor = params["optimizer"]["loss_scaling_factor"]
    if isinstance(factor, str) and factor != "dynamic":
        raise UserError(f"optimizer.loss_scaling_factor must be a number or 'dynamic', got {factor!r}")
    if not params["mixed_precision"]["enabled"]:
        if factor != 1.0:
            logger.warning("optimizer.loss_scaling_factor=%s is ignored: mixed_precision.enabled is false", factor)
        return None
    if factor == "dynamic":
        return factor
    if factor <= 0:
        raise UserError(f"optimizer.loss_scaling_factor must be positive, got {factor}")
    return None if factor == 1.0 else float(factor)
