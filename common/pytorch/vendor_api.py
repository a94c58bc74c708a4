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
    cbtorch       the system's PyTorch package. A folder reaches it behind ``cm.use_cs()`` (always
                  False here) and for variable tensor shapes (``model.enable_vts``), whose
                  ``cbtorch.nn.StripPadding`` is here what the model computes with it (see there);
                  any other attribute is one UserError line naming it (the vendor's fallback was an
                  empty namespace: an AttributeError)

Nothing here imports torch, so the package can bind these names after setting torch's
OpenMP wait policy and before anything loads torch.
"""

from __future__ import annotations

import contextlib
import functools
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


@functools.cache
def _strip_padding():
    """``cbtorch.nn.StripPadding``, made when first asked for (it is a torch module, and this file loads no torch).

    Variable tensor shapes: on the system, ``StripPadding()(x, mask)`` marks the positions where
    ``mask`` is 0 as padding, which the system then does not compute; what a model reads there is
    undefined, so a model that uses it masks those positions out of its attention and its loss (the
    vendor's BERT, T5 and Transformer do). Here they are computed, holding 0: the value the vendor's
    data already pads with, and one that leaves the loss and every gradient of such a model as they
    are without VTS. It runs on the CPU, the GPU and the emulator; ``model.enable_vts`` then costs
    nothing and saves nothing here (the emulator's estimate counts the padded positions).
    """
    import torch

    class StripPadding(torch.nn.Module):
        """x where mask is nonzero, 0 where it is 0 (see _strip_padding)."""

        def forward(self, input: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            if mask.shape != input.shape[:mask.dim()]:
                raise UserError(f"cbtorch.nn.StripPadding: a mask of shape {tuple(mask.shape)} for a tensor of "
                                f"shape {tuple(input.shape)}; the mask's shape must lead the tensor's")
            keep = (mask != 0).reshape(*mask.shape, *([1] * (input.dim() - mask.dim())))
            return torch.where(keep, input, torch.zeros((), dtype=input.dtype, device=input.device))

    return StripPadding


class _SystemNN:
    """``cbtorch.nn``: StripPadding (variable tensor shapes); any other layer is one UserError line."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if name == "StripPadding":
            return _strip_padding()
        raise UserError(f"cbtorch.nn.{name} is the vendor's system software, which this zoo does not have; a "
                        f"folder reaches it only on the vendor's system")


class _NoSystem:
    """The vendor's ``cbtorch`` package where it is not installed: ``nn.StripPadding`` works, anything else is
    a UserError."""

    nn = _SystemNN()

    def __getattr__(self, name: str):
        if name.startswith("__"):  # Python's own probes (copy, pickle, inspect) get the usual answer
            raise AttributeError(name)
        raise UserError(f"cbtorch.{name} is the vendor's system software, which this zoo does not have; a folder "
                        f"reaches it only on the vendor's system")

    def __repr__(self) -> str:
        return "<cbtorch: the vendor's system software, not installed>"


cbtorch = _NoSystem()
