"""The optimizer spec: one place for what a training step's update means.

The capture frontends read an ``OptimizerSpec`` from the framework (torch.optim, TF's
Apply ops); the emulator runs it (device/runtime/optimizers.py); the runners build their
framework optimizers to the same semantics (common/pytorch/optim.py, common/tf/optim.py;
tests/device/test_optimizer_parity.py checks the three give the same updates):

    kinds       sgd, momentum, adam, adamw (SLOTS: the state each keeps per parameter)
    semantics   "torch" or "tf": the arithmetic of the framework the model came from, which
                differs in rounding only (Adam's epsilon, Nesterov's order, the clip factor)
    one step    unscale the gradients (loss scaling) -> skip the step if any is inf/NaN
                -> clip by value -> clip by global norm -> weight decay -> update rule

Shared by every kind and both semantics:

- Weight decay is coupled L2 (g += wd * p) for sgd, momentum and adam, decoupled for adamw
  (p -= lr * wd * p). A parameter has none when one of ``weight_decay_exclude`` is a
  substring of its name, compared case-insensitively ("norm" excludes "LayerNorm/gamma"),
  as the runners' optimizers match it: ``excluded_from_weight_decay``.
- Both clipping settings given: clip each gradient to [-max_gradient_value,
  max_gradient_value], then the global norm to max_gradient_norm (what common/tf/optim.py's
  build_train_op does; the PyTorch runner refuses the pair today).
- Adam's ``form``: "kernel" is the framework's fused Adam (torch.optim.Adam, TF's ApplyAdam);
  "bert" is the Adam of BERT's optimization.py written out in TF ops, as the vendor's TF
  AdamW is: m = b1 * m + (1 - b1) * g, v = b2 * v + (1 - b2) * g^2, then
  p -= lr * (m / (sqrt(v) + eps) [* sqrt(1 - b2^t) / (1 - b1^t)] + wd * p), the bias
  correction only with ``hyper["bias_correction"]`` 1, the decay only where it applies.
- Loss scaling (16-bit compute): None, a fixed factor, or "dynamic": a non-finite step is
  skipped (a fixed scale keeps its value); dynamically it halves the scale, and
  steps_per_increase finite steps in a row double it, within [min_loss_scale,
  max_loss_scale] (torch.amp.GradScaler's growth 2 and backoff 0.5).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from zoo_base.errors import UserError

KINDS = ("sgd", "momentum", "adam", "adamw")
SEMANTICS = ("torch", "tf")
ADAM_FORMS = ("kernel", "bert")
# The framework optimizer classes the frontends read into a spec (capture/torch/optimizer.py,
# capture/tf/optimizer.py's Apply ops; a TF Adam written out in ops is matched by its ops), and
# the runners' optimizer_type names: what the porting assistant (common/port/static.py) accepts.
FRAMEWORK_OPTIMIZERS: dict[str, tuple[str, ...]] = {
    "torch": ("SGD", "Adam", "AdamW"),
    "tf": ("GradientDescentOptimizer", "MomentumOptimizer", "AdamOptimizer"),
    "optimizer_type": KINDS,
}
# fp32 state per parameter, by the names the emulator's checkpoints use
SLOTS: dict[str, tuple[str, ...]] = {"sgd": (), "momentum": ("momentum",), "adam": ("m", "v"), "adamw": ("m", "v")}

DEFAULT_INITIAL_LOSS_SCALE = 2.0**15
DEFAULT_STEPS_PER_INCREASE = 2000
MIN_LOSS_SCALE = 1.0
MAX_LOSS_SCALE = 2.0**24


def excluded_from_weight_decay(name: str, exclude: Sequence[str]) -> bool:
    """Whether parameter ``name`` has no weight decay: a pattern of ``exclude`` is a
    substring of it, ignoring case."""
    lowered = name.lower()
    return any(pattern.lower() in lowered for pattern in exclude)


@dataclass
class OptimizerSpec:
    """The update rule read from the framework (torch.optim / TF Apply ops).

    kind: one of KINDS; semantics: "torch" or "tf" (the two frameworks place Adam's
    epsilon differently, and the device follows the framework the model came from so
    that numbers match).
    """

    kind: str
    semantics: str
    hyper: dict[str, float] = field(default_factory=dict)  # lr, momentum, beta1, beta2, eps, weight_decay, nesterov
    form: str = "kernel"  # adam and adamw: "kernel" or "bert" (ADAM_FORMS; the module docstring)
    weight_decay_exclude: tuple[str, ...] = ()  # name patterns without weight decay (excluded_from_weight_decay)
    max_gradient_norm: float | None = None  # both given: clip by value first, then by norm
    max_gradient_value: float | None = None
    # loss scaling for 16-bit compute: None, a fixed number, or "dynamic"
    loss_scale: float | str | None = None
    initial_loss_scale: float = DEFAULT_INITIAL_LOSS_SCALE
    steps_per_increase: int = DEFAULT_STEPS_PER_INCREASE
    min_loss_scale: float = MIN_LOSS_SCALE
    max_loss_scale: float = MAX_LOSS_SCALE

    def check(self) -> None:
        """Raise UserError, naming the setting, if the spec is not one the device runs."""
        if self.kind not in KINDS:
            raise UserError(f"optimizer kind {self.kind!r} is not supported; expected one of {KINDS}")
        if self.semantics not in SEMANTICS:
            raise UserError(f"optimizer semantics {self.semantics!r} is unknown; expected one of {SEMANTICS}")
        if self.form not in ADAM_FORMS or (self.form == "bert" and self.kind not in ("adam", "adamw")):
            raise UserError(f"optimizer form {self.form!r} is not one the device runs for {self.kind!r}; "
                            f"expected one of {ADAM_FORMS} (the second for adam and adamw only)")
        if self.kind == "momentum" and "momentum" not in self.hyper:
            raise UserError("optimizer 'momentum' needs the hyper-parameter 'momentum'")
        scale = self.loss_scale
        if scale is not None and scale != "dynamic" and (isinstance(scale, str) or not scale > 0):
            raise UserError(f"loss_scale must be a positive number or 'dynamic', got {scale!r}")

    def decays(self, name: str) -> bool:
        """Whether parameter ``name`` gets weight decay."""
        return (float(self.hyper.get("weight_decay", 0.0)) != 0.0
                and not excluded_from_weight_decay(name, self.weight_decay_exclude))
