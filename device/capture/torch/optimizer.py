"""The optimizer of a step: a ``torch.optim`` optimizer read into an ``OptimizerSpec`` ("torch" semantics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from device.optimizer import DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, FRAMEWORK_OPTIMIZERS, OptimizerSpec
from zoo_base.errors import UserError

SUPPORTED_OPTIMIZERS = FRAMEWORK_OPTIMIZERS["torch"]


@dataclass
class _Group:
    """The hyper-parameters every param group must share (weight decay may differ by exclusion)."""

    kind: str
    hyper: dict


def optimizer_spec(optimizer: torch.optim.Optimizer, module: torch.nn.Module, *, max_gradient_norm=None,
                   max_gradient_value=None, loss_scale=None, initial_loss_scale=DEFAULT_INITIAL_LOSS_SCALE,
                   steps_per_increase=DEFAULT_STEPS_PER_INCREASE) -> OptimizerSpec:
    """The update rule of a torch.optim optimizer, with torch's semantics.

    Param groups may differ only in weight decay, and only as "some groups have none":
    their params are listed in ``weight_decay_exclude`` (by state_dict key).
    """
    names = {id(p): name for name, p in module.named_parameters()}
    groups = [_group_hyper(optimizer, g) for g in optimizer.param_groups]
    first = groups[0]
    for g in groups[1:]:
        for key in ("lr", "beta1", "beta2", "eps", "momentum", "nesterov"):
            if g.hyper[key] != first.hyper[key]:
                raise UserError(f"optimizer param groups with different {key} ({first.hyper[key]} vs "
                                f"{g.hyper[key]}) are not supported")
    decays = {g.hyper["weight_decay"] for g in groups} - {0.0}
    if len(decays) > 1:
        raise UserError(f"optimizer param groups with different weight_decay {sorted(decays)} are not supported")
    exclude = []
    for param_group, g in zip(optimizer.param_groups, groups):
        for p in param_group["params"]:
            if id(p) not in names:
                raise UserError(f"the optimizer holds a parameter of shape {tuple(p.shape)} that is not in the module")
            if decays and g.hyper["weight_decay"] == 0.0 and p.requires_grad:
                exclude.append(names[id(p)])
    hyper = dict(first.hyper, weight_decay=decays.pop() if decays else 0.0)
    spec = OptimizerSpec(kind=first.kind, semantics="torch", hyper=hyper, weight_decay_exclude=tuple(exclude),
                         max_gradient_norm=max_gradient_norm, max_gradient_value=max_gradient_value,
                         loss_scale=loss_scale, initial_loss_scale=float(initial_loss_scale),
                         steps_per_increase=int(steps_per_increase))
    spec.check()
    return spec


def _group_hyper(optimizer: torch.optim.Optimizer, group: dict) -> _Group:
    name = type(optimizer).__name__
    if group.get("maximize"):
        raise UserError(f"{name}(maximize=True) is not supported")
    lr = float(group["lr"])
    if isinstance(optimizer, torch.optim.SGD):
        if group.get("dampening", 0):
            raise UserError(f"SGD(dampening={group['dampening']}) is not supported (only 0)")
        momentum = float(group.get("momentum", 0.0))
        return _Group("momentum" if momentum else "sgd",
                      dict(lr=lr, beta1=0.0, beta2=0.0, eps=0.0, weight_decay=float(group.get("weight_decay", 0.0)),
                           momentum=momentum, nesterov=bool(group.get("nesterov", False))))
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        if group.get("amsgrad"):
            raise UserError(f"{name}(amsgrad=True) is not supported")
        decoupled = isinstance(optimizer, torch.optim.AdamW) or group.get("decoupled_weight_decay", False)
        beta1, beta2 = (float(b) for b in group["betas"])
        return _Group("adamw" if decoupled else "adam",
                      dict(lr=lr, beta1=beta1, beta2=beta2, eps=float(group["eps"]),
                           weight_decay=float(group["weight_decay"]), momentum=0.0, nesterov=False))
    raise UserError(f"optimizer {name} is not supported on the device; supported: {', '.join(SUPPORTED_OPTIMIZERS)}")
