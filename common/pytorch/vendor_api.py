"""The vendor's system-software names, as its zoo had them where no vendor system is installed.

A folder written for the vendor's zoo imports these from the package (``from
common.pytorch import cbtorch, modes`` once ``zoo port migrate`` has rewritten its
imports); ``cb_model`` is the module beside this one. The vendor's own
``common/pytorch/__init__.py`` fell back to the same answers when its system software was
missing, and so do these:

    modes         the run modes' names (TRAIN, EVAL, TRAIN_AND_EVAL, INFERENCE), get_modes(), is_valid()
    name_scope    a context manager naming a part of the graph for the system's compiler: does nothing
    amp           the system's mixed-precision settings: get_init_params() is {} (params'
                  mixed_precision section sets 16-bit compute here)
    AP_DISABLED   a value of the system compiler's autogen policy, only ever handed to cbtorch.state()
    cbtorch       the system's PyTorch package. Nothing here has it: a folder reaches it only behind
                  ``cm.use_cs()`` (always False) or for a system-only feature such as variable tensor
                  shapes (``model.enable_vts``), and any attribute it asks for is one UserError line
                  naming the attribute (the vendor's fallback was an empty namespace: an AttributeError)

Nothing here imports torch, so the package can bind these names after setting torch's
OpenMP wait policy and before anything loads torch.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from common.errors import UserError


class modes:  # noqa: N801 (the vendor's name: folders write modes.TRAIN)
    """The vendor's run modes (this zoo's runner also has eval_all and predict, which no vendor folder names)."""

    TRAIN = "train"
    EVAL = "eval"
    TRAIN_AND_EVAL = "train_and_eval"
    INFERENCE = "inference"

    @staticmethod
    def get_modes() -> tuple[str, ...]:
        return (modes.TRAIN, modes.EVAL, modes.TRAIN_AND_EVAL, modes.INFERENCE)

    @staticmethod
    def is_valid(mode: str) -> bool:
        return mode in modes.get_modes()


@contextlib.contextmanager
def name_scope(name: str) -> Iterator[None]:
    """Names the ops made inside for the system's compiler; without one, the ops are made as they are."""
    yield None


class _Amp:
    """The system's mixed precision: no settings of its own here."""

    @staticmethod
    def get_init_params() -> dict:
        return {}


amp = _Amp()

# The autogen policy that turns the system compiler's kernel autogeneration off. Folders assign it
# to cbtorch.state()'s config behind cm.use_cs(); a name, as the value is the system's.
AP_DISABLED = "AP_DISABLED"


class _NoSystem:
    """The vendor's ``cbtorch`` package where it is not installed: every attribute is a UserError."""

    def __getattr__(self, name: str):
        if name.startswith("__"):  # Python's own probes (copy, pickle, inspect) get the usual answer
            raise AttributeError(name)
        hint = " (model.enable_vts: set it to false)" if name == "nn" else ""
        raise UserError(f"cbtorch.{name} is the vendor's system software, which this zoo does not have; a folder "
                        f"reaches it only on the vendor's system{hint}")

    def __repr__(self) -> str:
        return "<cbtorch: the vendor's system software, not installed>"


cbtorch = _NoSystem()
