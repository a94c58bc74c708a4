"""RunConfig: where a run writes, how often, and on which device (tf.estimator's field names).

``save_summary_steps`` sets both the log line and the TensorBoard scalars (params:
``runconfig.log_steps``); ``save_checkpoints_steps`` is ``runconfig.checkpoint_steps``;
``tf_random_seed`` is ``runconfig.seed``. ``train_distribute`` is a tf.distribute strategy to
train data parallel with (params: ``runconfig.train_distribute``, ``runconfig.num_devices``;
common/tf/estimator/distribute.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import logging

from common.errors import UserError

logger = logging.getLogger("zoo")

DEVICES = ("cpu", "gpu", "emulator")
# RunConfig field -> its params key
_PARAMS_KEYS = {"save_summary_steps": "runconfig.log_steps", "save_checkpoints_steps": "runconfig.checkpoint_steps",
                "keep_checkpoint_max": "runconfig.keep_checkpoint_max"}


@dataclass(frozen=True)
class RunConfig:
    model_dir: str = "model_dir"
    tf_random_seed: int = 0
    save_summary_steps: int = 50
    save_checkpoints_steps: int = 1000
    keep_checkpoint_max: int = 5
    device: str = "cpu"  # cpu, gpu or emulator
    device_profile: str = "wse2"  # the emulator's device profile (device/profiles.py)
    execution_mode: str = "pipelined"  # or weight_streaming
    micro_batch_size: int | None = None  # weight streaming: samples per pass; None: the largest that fits
    session_config: Any = None  # a tf.compat.v1.ConfigProto, or None for TensorFlow's defaults
    train_distribute: Any = None  # a tf.compat.v1.distribute.MirroredStrategy, or None: one device

    def __post_init__(self):
        if self.device not in DEVICES:
            raise UserError(f"RunConfig.device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        for name, key in _PARAMS_KEYS.items():
            # as common/params.py: save_checkpoints_steps 0 saves only at the end, keep_checkpoint_max 0 keeps every one
            least = 1 if name == "save_summary_steps" else 0
            if getattr(self, name) < least:
                raise UserError(f"{key} (RunConfig.{name}) must be at least {least}, got {getattr(self, name)}")
        if self.train_distribute is not None and self.device == "emulator":
            raise UserError("RunConfig.train_distribute with --device emulator: the emulated device is one system "
                            "per run; train on it without a strategy")

    @classmethod
    def from_params(cls, params: Mapping, device: str = "cpu") -> "RunConfig":
        from common.tf.estimator.distribute import strategy_from_params  # TensorFlow loads there

        runconfig, dev = params["runconfig"], params["device"]
        return cls(model_dir=runconfig["model_dir"], tf_random_seed=runconfig["seed"],
                   save_summary_steps=runconfig["log_steps"], save_checkpoints_steps=runconfig["checkpoint_steps"],
                   keep_checkpoint_max=runconfig["keep_checkpoint_max"], device=device,
                   device_profile=dev["profile"], execution_mode=dev["execution_mode"],
                   micro_batch_size=dev["micro_batch_size"],
                   train_distribute=strategy_from_params(runconfig, device))


@dataclass(frozen=True)
class CSRunConfig(RunConfig):
    """The vendor's ``CSRunConfig(cs_ip=..., cs_config=..., stack_params=..., **kwargs)``:
    RunConfig's fields, and the three that configured the vendor's system, kept and named as
    ignored when given (``cs_config`` is what get_csconfig returns: None here)."""

    cs_ip: str | None = None
    stack_params: Any = None
    cs_config: Any = None

    def __post_init__(self):
        super().__post_init__()
        if self.cs_ip:
            logger.warning("CSRunConfig.cs_ip %s is ignored: it addresses the vendor's system; the run is on %s",
                           self.cs_ip, self.device)
        if self.stack_params:
            logger.warning("CSRunConfig.stack_params is ignored: it configures the vendor's system software")
        if self.cs_config is not None:
            logger.warning("CSRunConfig.cs_config is ignored: it configures the vendor's system")
