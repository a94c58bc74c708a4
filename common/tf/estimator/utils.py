"""The vendor's summary switches: ``with cs_enable_summaries(): ...`` around a run.

On the vendor's system, summaries written inside model_fn (``tf.compat.v1.summary.scalar``)
leave the device only inside ``cs_enable_summaries``; a multi-replica run disables them.
Here the CPU and the emulator write them to model_dir/train (TensorBoard) at every log
step inside ``cs_enable_summaries`` or outside both, and never inside ``cs_disable_summaries``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

_enabled = [True]  # the innermost switch's value


def summaries_enabled() -> bool:
    return _enabled[-1]


@contextlib.contextmanager
def _summaries(on: bool) -> Iterator[None]:
    _enabled.append(on)
    try:
        yield
    finally:
        _enabled.pop()


def cs_enable_summaries() -> contextlib.AbstractContextManager:
    return _summaries(True)


def cs_disable_summaries() -> contextlib.AbstractContextManager:
    return _summaries(False)
