"""Optimizers from ``params["optimizer"]``, and the learning-rate schedule as a torch LR scheduler.

    optimizer:
      optimizer_type: adamw          # sgd | momentum | adam | adamw
      learning_rate: 0.001           # or a schedule: common/schedules.py
      weight_decay: 0.01
      weight_decay_exclude: [bias, norm]
      correct_bias: true             # adam, adamw: false drops the bias correction (the vendor's BERT)

A schedule is a pure function of the step (the number of optimizer steps already taken),
so the CPU runner and the emulator read the same learning rate for the same step.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import torch

from common.errors import UserError
from common.schedules import Schedule
from device.api import excluded_from_weight_decay


class ScheduledLR(torch.optim.lr_scheduler.LRScheduler):
    """Sets every param group's lr to ``schedule(step)``; its state is the step alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule):
        self.schedule = schedule
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        return [self.schedule(self.last_epoch) for _ in self.optimizer.param_groups]

    def set_step(self, step: int) -> None:
        """Continue from ``step`` steps taken elsewhere (on the emulator): the groups' lr follows."""
        self.last_epoch = step
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def state_dict(self) -> dict:
        # the schedule comes from params, not from the checkpoint (and is not a tensor type
        # that torch.load(weights_only=True) accepts)
        return {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "schedule")}


def _param_groups(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], weight_decay: float,
                  exclude: Sequence[str]) -> list[dict]:
    """Two groups: with weight decay, and without it for names containing an excluded substring.

    Without weight decay, one group (each group costs an optimizer pass per step).
    """
    if weight_decay == 0.0:
        trainable = [p for _, p in named_parameters if p.requires_grad]
        return [{"params": trainable, "weight_decay": 0.0}] if trainable else []
    decay, no_decay = [], []
    for name, parameter in named_parameters:
        if not parameter.requires_grad:
            continue
        excluded = excluded_from_weight_decay(name, exclude)
        (no_decay if excluded else decay).append(parameter)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class AdamNoBiasCorrection(torch.optim.Optimizer):
    """Adam (coupled L2, ``decoupled=False``) or AdamW (decoupled weight decay) without bias
    correction: the vendor's ``correct_bias: false``, as BERT's original optimizer. torch's
    update with 1 - beta^step taken as 1:

        m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2;  p -= lr m / (sqrt(v) + eps)

    The state has torch's names (step, exp_avg, exp_avg_sq), so a checkpoint reads either way."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, decoupled: bool):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0, "decoupled": decoupled})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                if decay and group["decoupled"]:
                    p.mul_(1 - lr * decay)  # AdamW: decay the weights, not the gradient
                elif decay:
                    grad = grad.add(p, alpha=decay)  # Adam: L2 in the gradient
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                p.addcdiv_(state["exp_avg"], state["exp_avg_sq"].sqrt().add_(group["eps"]), value=-lr)
        return loss


def build_optimizer(model: torch.nn.Module, optimizer_params: Mapping) -> torch.optim.Optimizer:
    """The optimizer of ``params["optimizer"]`` over the model's trainable parameters.

    Weight decay (coupled L2 for sgd/momentum/adam, decoupled for adamw) skips every
    parameter whose name contains one of ``weight_decay_exclude`` (case-insensitive). Adam and
    AdamW correct the bias of their moments unless ``correct_bias`` is false.
    The learning rate starts at 0 here; the ScheduledLR sets it before the first step.
    """
    p = optimizer_params
    groups = _param_groups(model.named_parameters(), p["weight_decay"], p["weight_decay_exclude"])
    if not groups:
        raise UserError("optimizer: the model has no trainable parameters")
    kind = p["optimizer_type"]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=0.0)
    if kind == "momentum":
        return torch.optim.SGD(groups, lr=0.0, momentum=p["momentum"], nesterov=p["nesterov"])
    betas = (p["beta1"], p["beta2"])
    if kind in ("adam", "adamw") and not p.get("correct_bias", True):
        return AdamNoBiasCorrection(groups, lr=0.0, betas=betas, eps=p["epsilon"], decoupled=kind == "adamw")
    if kind == "adam":
        return torch.optim.Adam(groups, lr=0.0, betas=betas, eps=p["epsilon"])
    if kind == "adamw":
        return torch.optim.AdamW(groups, lr=0.0, betas=betas, eps=p["epsilon"])
    raise UserError(f"optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got {kind!r}")
