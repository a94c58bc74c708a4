"""The device's ops: one record each, the single place that says what an op is.

``OPS[name]`` is an ``OpRecord`` (device/ops/record.py): inputs and attributes, shape and
dtype rule, the dtypes it takes, its numpy forward kernel (the op's living definition)
and gradient, its cost (flops and SRAM bytes), and the category that decides which
library kernel it is matched into. Every stage reads only the records: validation (is
the op known, are its shapes and dtypes the record's), kernel matching (categories),
the cost model (work per node) and the runtime (forward, gradient, state updates).

The records live by family, one module each, in the order the README's op table lists
them. A new op is a record in its family's module, a mapping in each frontend
(device/capture/), and a case in tests/device/test_ops.py: see device/README.md.
"""

from __future__ import annotations

from device.ops import (activations, elementwise, language, layout, linalg, losses, normalization, reductions,
                        vision)
from device.ops.record import CATEGORIES, KernelContext, OpRecord

__all__ = ["CATEGORIES", "FAMILIES", "KernelContext", "OPS", "OpRecord", "ops_in"]

FAMILIES = (elementwise, activations, linalg, layout, reductions, normalization, vision, language, losses)


def _by_name() -> dict[str, OpRecord]:
    records: dict[str, OpRecord] = {}
    for family in FAMILIES:
        for record in family.RECORDS:
            if record.name in records:
                raise ValueError(f"op {record.name!r} has two records ({family.__name__})")
            records[record.name] = record
    return records


OPS: dict[str, OpRecord] = _by_name()


def ops_in(*categories: str) -> frozenset[str]:
    """The names of the ops of ``categories``."""
    unknown = set(categories) - set(CATEGORIES)
    if unknown:
        raise ValueError(f"unknown op categories {sorted(unknown)}; known: {', '.join(CATEGORIES)}")
    return frozenset(name for name, record in OPS.items() if record.category in categories)
