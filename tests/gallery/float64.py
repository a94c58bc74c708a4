"""A torch function mode under which a float64 model stays in float64: the gallery's exact reference.

``model.double()`` converts the weights, but a model may still ask for float32 on the way: transformers'
CTC loss calls ``log_softmax(logits, dtype=torch.float32)``, Llama's RMSNorm and T5's layer norm cast
their input with ``.to(torch.float32)``, rotary embeddings call ``.float()``. Under ``Float64Only`` every
such request gets float64 instead (a ``dtype`` argument, positional or keyword, of a lower-precision
floating type; ``.float()``, ``.half()``, ``.bfloat16()``; a tensor made without a dtype, as torch's
default dtype is float64 meanwhile), and any op that still returns a floating
tensor other than float64 stops the run with its name: a float64 reference that silently computed part
of the model in float32 would be a floor with fp32's error in it.

It sees the ops called from Python (the forward); the backward runs in the forward tensors' dtypes.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_TO_DOUBLE = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}


def _widened(value):
    """float64 for a lower-precision floating dtype, anything else as it is."""
    if isinstance(value, torch.dtype) and value.is_floating_point and value != torch.float64:
        return torch.float64
    return value


def _not_float64(value) -> torch.dtype | None:
    """The first floating tensor of ``value`` (a tensor, or a tuple or list of them) that is not float64."""
    if isinstance(value, torch.Tensor):
        return value.dtype if value.is_floating_point() and value.dtype != torch.float64 else None
    if isinstance(value, (tuple, list)):
        for item in value:
            found = _not_float64(item)
            if found is not None:
                return found
    return None


class Float64Only(TorchFunctionMode):
    """Every floating op in float64 while active (``with Float64Only(): loss = model(**batch).loss``)."""

    def __enter__(self):
        self._default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = {k: _widened(v) for k, v in (kwargs or {}).items()}
        args = tuple(_widened(a) for a in args)
        if func in _TO_DOUBLE:
            func = torch.Tensor.double
        out = func(*args, **kwargs)
        dtype = _not_float64(out)
        if dtype is not None:
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            raise TypeError(f"the float64 reference ran {name} in {dtype}: an input or a cast the mode does "
                            "not widen (tests/gallery/float64.py)")
        return out
