"""Atomic file writes: ``zoo_base/io.py``, re-exported (it lives below both common/ and device/)."""

from zoo_base.io import atomic_open, atomic_write_text, atomic_write_texts, not_written

__all__ = ["atomic_open", "atomic_write_text", "atomic_write_texts", "not_written"]
