"""Update rules of the device, on numpy fp32 master weights, in place.

One ``Optimizer`` runs what an ``OptimizerSpec`` (device/optimizer.py, which states the
semantics: the order of a step, weight-decay exclusion, clipping, loss scaling) reads
from the framework, in the order a framework training step applies it:

    unscale the gradients (loss scaling)  ->  skip the step if any is inf/NaN (without
    loss scaling: refuse it, NonFiniteGradient)
    ->  clip by value  ->  clip by global norm  ->  weight decay  ->  update rule

Each rule follows the framework the model came from (``spec.semantics``) closely enough
that 20 steps agree to float32 rounding (tests/device/test_optimizers.py against
torch.optim, tests/device/test_kernels_tf.py against tf.compat.v1.train):

    sgd       p -= lr * g                                    (both frameworks)
    momentum  buf = m * buf + g;  p -= lr * buf              (torch SGD(momentum), TF
              nesterov: p -= lr * (g + m * buf)               MomentumOptimizer: the same)
    adam      torch: p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
              tf:    p -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps), with
                     the powers b^t kept as float32 running products like TF's
                     beta1_power/beta2_power variables
    adamw     p *= 1 - lr * wd, then adam (torch.optim.AdamW, keras AdamW)
    form "bert" (adam, adamw; BERT's AdamWeightDecay written out in TF ops, float32 as those ops round):
              m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2
              p -= lr * (m / (sqrt(v) + eps) [* sqrt(1 - b2^t) / (1 - b1^t)] [+ wd * p])

Weight decay for sgd, momentum and adam is torch's coupled L2 (g += wd * p). A
parameter is excluded from weight decay when one of ``spec.weight_decay_exclude`` is a
substring of its name, ignoring case (so "bias" excludes every bias, as BERT's exclusion
list does). Gradients are never modified in place: one gradient array may back several views.
"""

from __future__ import annotations

import math

import numpy as np

from device.optimizer import SLOTS, OptimizerSpec
from zoo_base.errors import NonFiniteGradient, UserError


class LossScaler:
    """Static or dynamic loss scaling, as torch.amp.GradScaler (growth 2, backoff 0.5).

    The loss gradient is multiplied by ``scale`` before the backward pass so that small
    16-bit gradients do not flush to zero; gradients are divided by it afterwards. With
    dynamic scaling, a step with an inf/NaN gradient is skipped and halves the scale, and
    ``steps_per_increase`` finite steps in a row double it, within [min, max]. A static
    scale also skips a non-finite step but keeps its value.
    """

    def __init__(self, spec: OptimizerSpec):
        spec.check()
        self.dynamic = spec.loss_scale == "dynamic"
        self.scale = float(spec.initial_loss_scale if self.dynamic else spec.loss_scale)
        self.steps_per_increase = int(spec.steps_per_increase)
        self.min_scale = float(spec.min_loss_scale)
        self.max_scale = float(spec.max_loss_scale)
        self.good_steps = 0  # finite steps since the last change (GradScaler's growth tracker)

    def unscale(self, grads: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], bool]:
        """Gradients divided by the scale, and whether all of them are finite."""
        inverse = np.float32(1.0 / self.scale)
        unscaled = {name: g * inverse for name, g in grads.items()}
        return unscaled, all(np.isfinite(g).all() for g in unscaled.values())

    def update(self, finite: bool) -> None:
        if not self.dynamic:
            return
        if not finite:
            self.scale = max(self.scale * 0.5, self.min_scale)
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == self.steps_per_increase:
            self.scale = min(self.scale * 2.0, self.max_scale)
            self.good_steps = 0


def global_norm(grads: dict[str, np.ndarray]) -> float:
    return math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))


def clip_by_global_norm(grads: dict[str, np.ndarray], max_norm: float, semantics: str) -> dict[str, np.ndarray]:
    """Scale all gradients together so that their joint L2 norm is at most ``max_norm``."""
    norm = global_norm(grads)
    if semantics == "tf":  # tf.clip_by_global_norm: clip * min(1/norm, 1/clip), in float32
        with np.errstate(divide="ignore"):  # a zero norm gives 1/0 = inf, then the min
            coef = np.float32(max_norm) * min(np.float32(1) / np.float32(norm), np.float32(1) / np.float32(max_norm))
    else:  # torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1
        coef = np.float32(min(max_norm / (norm + 1e-6), 1.0))
    return {name: g * coef for name, g in grads.items()}


def clip_by_value(grads: dict[str, np.ndarray], limit: float) -> dict[str, np.ndarray]:
    return {name: np.clip(g, -limit, limit) for name, g in grads.items()}


class Optimizer:
    """The update rule of ``spec`` over named fp32 parameters (framework names)."""

    def __init__(self, spec: OptimizerSpec, params: dict[str, np.ndarray]):
        spec.check()
        self.spec = spec
        hyper = spec.hyper
        self.momentum = float(hyper.get("momentum", 0.0))
        self.nesterov = bool(hyper.get("nesterov", False))
        self.beta1 = float(hyper.get("beta1", 0.9))
        self.beta2 = float(hyper.get("beta2", 0.999))
        self.eps = float(hyper.get("eps", 1e-8))
        self.weight_decay = float(hyper.get("weight_decay", 0.0))
        self.step_count = 0  # updates applied (skipped steps do not count, as in torch)
        self.scaler = LossScaler(spec) if spec.loss_scale is not None else None
        self.slots: dict[str, dict[str, np.ndarray]] = {name: self._new_slots(p) for name, p in params.items()}
        # TF's Adam keeps b1^t and b2^t as float32 variables multiplied once per step
        self._beta_powers = (np.float32(1.0), np.float32(1.0))

    def _new_slots(self, p: np.ndarray) -> dict[str, np.ndarray]:
        return {slot: np.zeros_like(p) for slot in SLOTS[self.spec.kind]}

    @property
    def loss_scale(self) -> float:
        return self.scaler.scale if self.scaler else 1.0

    def apply_gradients(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> bool:
        """One training step's update from (loss-scaled) gradients; False if it was skipped.

        Parameters without a gradient (the loss does not depend on them) are left alone,
        as torch leaves a parameter whose .grad is None.
        """
        if self.scaler:
            grads, finite = self.scaler.unscale(grads)
            self.scaler.update(finite)
            if not finite:
                return False
        else:  # nothing skips the step: refuse it before it spreads into the weights
            for name, g in grads.items():
                if not np.isfinite(g).all():
                    raise NonFiniteGradient(name, float(g[~np.isfinite(g)].flat[0]))
        # both clippings given: by value, then by global norm (device/optimizer.py)
        if self.spec.max_gradient_value is not None:
            grads = clip_by_value(grads, self.spec.max_gradient_value)
        if self.spec.max_gradient_norm is not None:
            grads = clip_by_global_norm(grads, self.spec.max_gradient_norm, self.spec.semantics)
        self.step(params, grads, lr)
        return True

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray], lr: float) -> None:
        """The bare update rule (with weight decay), in place on ``params``."""
        self.step_count += 1
        if self.spec.kind in ("adam", "adamw"):
            b1_power, b2_power = self._beta_powers
            self._beta_powers = (b1_power * np.float32(self.beta1), b2_power * np.float32(self.beta2))
        for name, g in grads.items():
            p = params[name]
            decays = self.spec.decays(name)
            if decays and self.spec.kind != "adamw" and self.spec.form != "bert":
                g = g + self.weight_decay * p  # coupled L2, as torch's weight_decay
            if self.spec.kind == "sgd":
                p -= lr * g
            elif self.spec.kind == "momentum":
                self._momentum(p, g, self.slots[name]["momentum"], lr)
            elif self.spec.form == "bert":
                self._adam_bert(p, g, self.slots[name], lr, decays)
            else:
                if decays and self.spec.kind == "adamw":  # decoupled: decay the weight itself
                    if self.spec.semantics == "torch":
                        p *= 1 - lr * self.weight_decay
                    else:  # keras AdamW rounds it as var - var * wd * lr
                        p -= p * np.float32(self.weight_decay) * np.float32(lr)
                self._adam(p, g, self.slots[name], lr)

    def _momentum(self, p, g, buf, lr):
        buf *= self.momentum
        buf += g
        if not self.nesterov:
            p -= lr * buf
        elif self.spec.semantics == "torch":
            p -= lr * (g + self.momentum * buf)
        else:  # TF's ApplyMomentum(use_nesterov=True) rounds in this order
            p -= g * lr + buf * self.momentum * lr

    def _adam(self, p, g, slots, lr):
        m, v = slots["m"], slots["v"]
        if self.spec.semantics == "torch":  # torch.optim.Adam, single-tensor path
            m += (1 - self.beta1) * (g - m)  # lerp
            v *= self.beta2
            v += (1 - self.beta2) * (g * g)
            step_size = lr / (1 - self.beta1**self.step_count)
            denom = np.sqrt(v)
            denom /= math.sqrt(1 - self.beta2**self.step_count)
            denom += self.eps
        else:  # tf.compat.v1.train.AdamOptimizer (the ApplyAdam kernel): all float32
            one = np.float32(1)
            b1_power, b2_power = self._beta_powers
            m += (g - m) * (one - np.float32(self.beta1))
            v += (g * g - v) * (one - np.float32(self.beta2))
            step_size = np.float32(lr) * np.sqrt(one - b2_power) / (one - b1_power)
            denom = np.sqrt(v)
            denom += np.float32(self.eps)
        p -= step_size * m / denom

    def _adam_bert(self, p, g, slots, lr, decays):
        """BERT's AdamWeightDecay, each op as TF rounds it in float32 (its constants are the
        Python floats 1 - b1 and 1 - b2 rounded once); the decay is added to the step."""
        m, v = slots["m"], slots["v"]
        f = np.float32
        m[...] = f(self.beta1) * m + f(1.0 - self.beta1) * g
        v[...] = f(self.beta2) * v + f(1.0 - self.beta2) * np.square(g)
        update = m / (np.sqrt(v) + f(self.eps))
        if self.spec.hyper.get("bias_correction", 0.0):
            b1_power, b2_power = self._beta_powers
            update *= np.sqrt(f(1) - b2_power) / (f(1) - b1_power)
        if decays:
            update += f(self.weight_decay) * p
        p -= f(lr) * update

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """Per parameter {"m", "v"} or {"momentum"} (copies), plus "step" and loss scaling."""
        state: dict = {name: {k: a.copy() for k, a in slots.items()} for name, slots in self.slots.items()}
        state["step"] = self.step_count
        state["loss_scale"] = self.loss_scale
        if self.scaler:
            state["loss_scale_good_steps"] = self.scaler.good_steps
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, slots in self.slots.items():
            if name not in state:
                raise UserError(f"optimizer state has no entry for parameter {name!r}")
            for key, array in slots.items():
                value = state[name].get(key)
                if value is None or np.shape(value) != array.shape:
                    raise UserError(f"optimizer state {name!r}[{key!r}]: expected shape {array.shape}, "
                                    f"got {None if value is None else np.shape(value)}")
                np.copyto(array, value)
        self.step_count = int(state.get("step", 0))
        b1_power = b2_power = np.float32(1.0)
        for _ in range(self.step_count):  # the float32 running products TF would hold
            b1_power, b2_power = b1_power * np.float32(self.beta1), b2_power * np.float32(self.beta2)
        self._beta_powers = (b1_power, b2_power)
        if self.scaler and "loss_scale" in state:
            self.scaler.scale = float(state["loss_scale"])
            self.scaler.good_steps = int(state.get("loss_scale_good_steps", 0))
