"""PyTorchBaseModel: a model's forward and loss, with everything params say about training it.

A model subclasses it, builds its ``nn.Module``, hands it over, declares its metrics and
writes ``__call__``::

    class MnistModel(PyTorchBaseModel):
        def __init__(self, params, device):
            super().__init__(params, MLP(...), device)
            self.metrics = {"accuracy": Accuracy(output="logits")}

        def __call__(self, batch):
            images, labels = batch                     # (B, 1, 28, 28), (B,)
            logits = self.model(images)                # (B, 10)
            return F.cross_entropy(logits, labels), {"logits": logits}

``__call__`` returns the loss, or ``(loss, outputs)`` with named output tensors (metrics
and predict read them). A ported model may instead feed the vendor's metric classes
(``AccuracyMetric``, ... in common/pytorch/metrics.py) inside ``__call__``; the runner finds
them among the model's attributes. From params the base builds the optimizer, the learning-rate
schedule, gradient clipping and mixed precision (autocast, loss scaling); the runner calls
``train_step`` / ``eval_step`` and saves ``get_state()``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Mapping

import torch

from common.errors import NonFiniteGradient, UserError, where
from common.precision import loss_scaling
from common.pytorch.metrics import Metric
from common.pytorch.optim import ScheduledLR, build_optimizer
from common.schedules import build_schedule
from device.api import MAX_LOSS_SCALE

logger = logging.getLogger("zoo")

_AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def split_result(result: Any, model: Any = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``__call__``'s loss or (loss, outputs) as (loss, outputs); anything else is one line
    naming ``model``'s ``__call__`` (file:line) and what it returned."""
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.Tensor) \
            and isinstance(result[1], Mapping):
        return result[0], dict(result[1])
    if isinstance(result, torch.Tensor):
        return result, {}

    def kind(value: Any) -> str:  # a capture's FakeTensor is a Tensor to the user
        return "Tensor" if isinstance(value, torch.Tensor) else type(value).__name__

    got = f"({', '.join(kind(r) for r in result)})" if isinstance(result, tuple) else kind(result)
    who = where(type(model).__call__) if model is not None else "a model's __call__"
    raise UserError(f"{who} returned {got}; a model's __call__ returns the loss (a tensor) or (loss, outputs: "
                    f"a dict of tensors)")


class PyTorchBaseModel:
    """Optimizer, LR schedule, clipping and mixed precision around ``model``, all from params."""

    def __init__(self, params: Mapping, model: torch.nn.Module, device: torch.device | str | None = None):
        self.params = params
        self.device = torch.device(device or "cpu")  # the vendor's models pass device=None for the CPU
        self.model = model.to(self.device)
        optimizer = params["optimizer"]
        self.optimizer = build_optimizer(self.model, optimizer)
        # the vendor's disable_lr_steps_reset: each schedule of a list reads the global step
        self.schedule = build_schedule(optimizer["learning_rate"],
                                       reset_steps=not optimizer.get("disable_lr_steps_reset", False))
        self.lr_scheduler = ScheduledLR(self.optimizer, self.schedule)
        if optimizer["max_gradient_norm"] is not None and optimizer["max_gradient_value"] is not None:
            raise UserError("optimizer: give max_gradient_norm or max_gradient_value, not both")
        self.max_gradient_norm = optimizer["max_gradient_norm"]
        self.max_gradient_value = optimizer["max_gradient_value"]

        mp = params["mixed_precision"]
        # cb16 has no torch dtype: it runs on the emulator only (check_precision)
        self.autocast_dtype = _AUTOCAST_DTYPES.get(mp["dtype"]) if mp["enabled"] else None
        scaling = loss_scaling(params)
        self.scaler = None
        self.static_loss_scale = None
        if scaling == "dynamic":
            self.scaler = torch.amp.GradScaler(self.device.type, init_scale=optimizer["initial_loss_scale"],
                                               growth_interval=optimizer["steps_per_increase"])
        elif scaling is not None:
            self.static_loss_scale = scaling
        self.max_loss_scale = optimizer.get("max_loss_scale", MAX_LOSS_SCALE)
        self.metrics: dict[str, Metric] = {}

    def __call__(self, batch: Any) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise UserError(f"{where(type(self))} writes no __call__(batch); a model "
                        f"subclasses PyTorchBaseModel and writes __call__, which returns the loss or (loss, outputs)")

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def loss_scale(self) -> float | None:
        """The current loss scale (None without loss scaling)."""
        if self.scaler is not None:
            return float(self.scaler.get_scale())
        return self.static_loss_scale

    def train_step(self, batch: Any) -> torch.Tensor:
        """One optimizer step on ``batch`` (already on the device); returns the loss, detached."""
        if not self.model.training:  # eval_step switched it off (a recursive call, not free per step)
            self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss, _ = split_result(self(batch), self)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
        elif self.static_loss_scale is not None:
            (loss * self.static_loss_scale).backward()
            for p in self.model.parameters():
                if p.grad is not None:
                    p.grad.div_(self.static_loss_scale)
        else:
            loss.backward()
        # the first gradient that is NaN or inf, before clipping spreads it (dynamic scaling: the scaler checks)
        overflow = self._non_finite_gradient() if self.scaler is None else None
        if overflow is not None and self.static_loss_scale is None and bool(torch.isfinite(loss)):
            # no loss scaling to skip the step: stop before the update spreads it into the weights
            raise NonFiniteGradient(*overflow)
        if self.max_gradient_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_gradient_norm)
        elif self.max_gradient_value is not None:
            torch.nn.utils.clip_grad_value_(self.model.parameters(), self.max_gradient_value)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)  # skipped when a gradient is inf/NaN
            self.scaler.update()
            # grown no further than max_loss_scale, as the device and the TF runner: in place on the
            # scaler's scale tensor (its get_scale() would wait for the GPU every step)
            self.scaler._scale.clamp_(max=self.max_loss_scale)
        elif overflow is None:
            # skipped: a static loss scale skips a step whose gradients overflowed, as GradScaler and the
            # device do; a non-finite loss is not applied either (the runner stops on it)
            self.optimizer.step()
        self.lr_scheduler.step()
        return loss.detach()

    def _non_finite_gradient(self) -> tuple[str, float] | None:
        """(name, a NaN or inf value) of the first parameter whose gradient is not finite, or None."""
        named = [(name, p.grad) for name, p in self.model.named_parameters() if p.grad is not None]
        if not named or bool(torch.stack([torch.isfinite(g).all() for _, g in named]).all()):  # one sync
            return None
        for name, g in named:
            bad = g[~torch.isfinite(g)]
            if bad.numel():
                return name, float(bad.flatten()[0])
        return None

    @torch.no_grad()
    def eval_step(self, batch: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        self.model.eval()
        with self.autocast():
            return split_result(self(batch), self)

    def get_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def set_state(self, state: Mapping[str, Any], weights_only: bool = False) -> None:
        """Load ``get_state()``'s dict; ``weights_only`` loads the model alone (eval, predict)."""
        self.model.load_state_dict(state["model"])
        if weights_only:
            return
        self.optimizer.load_state_dict(state["optimizer"])
        self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
