"""``runconfig.disable_dropout: true``: a run with every dropout of the model at rate 0.

For comparing two runs step by step (the CPU and the emulator, this zoo and another
implementation), where dropout's masks, drawn by each from its own generator, would part them
from the first step, and for a model whose code fixes its dropout rates (a config that cannot
reach them). What it reaches:

- every ``torch.nn`` dropout module (Dropout, Dropout1d/2d/3d, AlphaDropout, FeatureAlphaDropout):
  its ``p`` is set to 0;
- ``nn.MultiheadAttention``'s ``dropout``, and any module's float attribute named ``*dropout*``
  or ``*dropout_p*`` that it hands to ``F.dropout`` or ``F.scaled_dot_product_attention``
  itself (Hugging Face's attention modules keep ``attention_dropout`` so): set to 0.0.

What it cannot reach (a rate written into the forward's code, ``F.dropout(x, 0.1)``) is never
left silently: the first training step on the CPU or a GPU watches every dropout call
(``DropoutWatch``), and the emulator every dropout node of the captured step
(``refuse_captured``); either is one UserError line naming the rate and the user's source line.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from common.errors import UserError

KEY = "runconfig.disable_dropout"
_DROPOUT_FUNCTIONS = {F.dropout: 1, F.dropout1d: 1, F.dropout2d: 1, F.dropout3d: 1, F.alpha_dropout: 1,
                      F.feature_alpha_dropout: 1}  # function -> index of its rate argument (p)
_TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep


def switch_off(module: torch.nn.Module) -> list[str]:
    """Every dropout of ``module`` that it reaches (see the module's docstring) set to rate 0: their names."""
    changed = []
    for name, sub in module.named_modules():
        if isinstance(sub, torch.nn.modules.dropout._DropoutNd):
            if sub.p:
                changed.append(name)
            sub.p = 0.0
            continue
        for attribute, value in vars(sub).items():
            if "dropout" in attribute and isinstance(value, float) and not isinstance(value, bool):
                if value:
                    changed.append(f"{name}.{attribute}" if name else attribute)
                setattr(sub, attribute, 0.0)
    return changed


def _user_line() -> str:
    """The innermost frame of the stack outside torch and this file: where the user's code called."""
    here = os.path.realpath(__file__)
    for frame in reversed(traceback.extract_stack()[:-2]):
        real = os.path.realpath(frame.filename)
        if real != here and not real.startswith(_TORCH_DIR) and not frame.filename.startswith("<"):
            return f"{frame.filename}:{frame.lineno}"
    return "<unknown>"


class DropoutWatch(TorchFunctionMode):
    """Refuses, in one line, a dropout call at a rate above 0 in training (what switch_off did not reach)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        rate, training = 0.0, True
        if func in _DROPOUT_FUNCTIONS:
            at = _DROPOUT_FUNCTIONS[func]
            rate = kwargs.get("p", args[at] if len(args) > at else 0.5)
            training = kwargs.get("training", args[at + 1] if len(args) > at + 1 else True)
        elif func is F.scaled_dot_product_attention:
            rate = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        if training and rate:
            name = getattr(func, "__name__", str(func))
            raise UserError(f"{_user_line()}: {name} drops at rate {rate} with {KEY}: true, a rate written into "
                            f"the code, which the switch does not reach (it sets torch.nn dropout modules and "
                            f"*dropout* attributes to 0): pass 0 there")
        return func(*args, **kwargs)


def refuse_captured(graph: Any) -> None:
    """The emulator's twin of DropoutWatch: a dropout node of the captured step is one UserError line."""
    for node in graph.nodes:
        if node.op == "dropout" and node.attrs.get("rate"):
            loc = node.loc
            raise UserError(f"{loc.file}:{loc.line}: {loc.call or loc.framework_op} drops at rate "
                            f"{node.attrs['rate']:g} with {KEY}: true, a rate written into the code, which the "
                            f"switch does not reach (it sets torch.nn dropout modules and *dropout* attributes to "
                            f"0): pass 0 there")
