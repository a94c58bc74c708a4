"""Weights and state between the module and the emulator, by ``state_dict()`` key.

A tied parameter (one tensor under several keys) is one weight, under its first key
(``_first_names``); a graph's weight or state name the module lacks is a validation
finding (``_check_names``).
"""

from __future__ import annotations

import numpy as np
import torch

from device.ir import Graph, SourceLoc
from zoo_base.errors import UserError


def _first_names(module: torch.nn.Module) -> dict[int, str]:
    """id(tensor) -> its first state_dict key: a tied parameter or buffer is one tensor with many keys."""
    names: dict[int, str] = {}
    for name, t in (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)):
        names.setdefault(id(t), name)
    return names


def _check_names(graph: Graph, module: torch.nn.Module) -> None:
    """Every weight and state name of the graph is one the module has: a validation finding if not."""
    tensors = dict(_named_tensors(module))
    for what, names in (("parameter", graph.params.values()), ("state", graph.state.values())):
        for name in names:
            if name not in tensors:
                graph.issues.append({"kind": "weights", "loc": SourceLoc(name),
                                     "message": f"{what} {name!r} is not a parameter or buffer of "
                                                f"{type(module).__name__}: its value cannot be read or saved"})


def _named_tensors(module: torch.nn.Module):
    """Every parameter and buffer by state_dict key, tied ones under each of their keys, non-persistent
    buffers included."""
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()


def weights_of(module: torch.nn.Module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """The trainable parameters by state_dict key (only those of ``graph.params`` when given).

    A tied parameter (one tensor under two keys) is one weight, under its first key.
    """
    wanted = set(graph.params.values()) if graph is not None else None
    return {name: _to_numpy(p) for name, p in module.named_parameters()
            if p.requires_grad and (wanted is None or name in wanted)}


def state_of(module: torch.nn.Module, graph: Graph | None = None) -> dict[str, np.ndarray]:
    """Buffers and frozen parameters by state_dict key (only those of ``graph.state`` when given,
    non-persistent buffers the step writes included)."""
    trainable = {id(p) for p in module.parameters() if p.requires_grad}
    if graph is None:
        return {name: _to_numpy(t) for name, t in module.state_dict(keep_vars=True).items() if id(t) not in trainable}
    tensors = dict(_named_tensors(module))
    return {name: _to_numpy(tensors[name]) for name in graph.state.values() if name in tensors}


def load_weights(module: torch.nn.Module, weights: dict[str, np.ndarray]) -> None:
    """Copy arrays into the module's parameters or buffers, by state_dict key (a tied parameter
    under any of its keys: it is one tensor)."""
    targets = {**dict(_named_tensors(module)), **module.state_dict(keep_vars=True)}
    with torch.no_grad():
        for name, array in weights.items():
            if name not in targets:
                raise UserError(f"load_weights: {name!r} is not a parameter or buffer of {type(module).__name__}")
            target = targets[name]
            array = np.asarray(array)
            if tuple(array.shape) != tuple(target.shape):
                raise UserError(f"load_weights: {name!r} has shape {tuple(array.shape)}, "
                                f"the module expects {tuple(target.shape)}")
            target.copy_(torch.tensor(array, dtype=target.dtype))


def load_state(module: torch.nn.Module, state: dict[str, np.ndarray]) -> None:
    """Copy state (batch norm statistics, ...) into the module's buffers, by state_dict key."""
    load_weights(module, state)
