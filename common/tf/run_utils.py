"""The vendor's TF ``run_utils``, for a folder's own ``run.py`` that drives the Estimator itself.

A folder from the vendor's zoo keeps its argparse and calls, in order::

    update_params_from_args(args, params["runconfig"])     # the command line into runconfig
    save_params(params, model_dir=runconfig["model_dir"])
    use_cs = is_cs(runconfig)                               # False: no vendor system here
    CSRunConfig(cs_ip=..., stack_params=..., **get_csrunconfig_dict(runconfig))
    check_env(runconfig)

``--device emulator`` (this zoo's) reaches the emulator through the same path:
update_params_from_args keeps it in runconfig, get_csrunconfig_dict hands it to the
RunConfig, and the CerebrasEstimator runs its steps there. Params stay the plain dict the
folder loaded; the runconfig keys are read with the vendor's and this zoo's spellings, and
the keys of the vendor's system are named once, with why they are ignored.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, Mapping, MutableMapping

import yaml

from common.cli import setup_logging
from common.errors import UserError
from common.io import atomic_write_text
from common.params import VENDOR_SYSTEM_KEYS

logger = logging.getLogger("zoo")

# RunConfig field -> the runconfig spellings that set it (the vendor's first)
_RUNCONFIG_FIELDS = {
    "save_summary_steps": ("save_summary_steps", "log_steps"),
    "save_checkpoints_steps": ("save_checkpoints_steps", "checkpoint_steps"),
    "keep_checkpoint_max": ("keep_checkpoint_max",),
    "tf_random_seed": ("tf_random_seed", "seed"),
}
# the runconfig keys a vendor run.py reads itself
_RUN_PY_KEYS = {"model_dir", "mode", "steps", "max_steps", "eval_steps", "validate_only", "compile_only", "params",
                "device", "checkpoint_path", "predict_steps"}
# the vendor's --device values (TensorFlow device names) and this zoo's
_DEVICES = {None: "cpu", "cpu": "cpu", "/cpu:0": "cpu", "gpu": "gpu", "/gpu:0": "gpu", "emulator": "emulator"}


def update_params_from_args(args: argparse.Namespace | None, params: MutableMapping) -> None:
    """The command line's values into ``params`` (the runconfig section): a flag not given keeps
    the file's value; ``eval_steps`` of 0 or less means all; ``--device`` becomes cpu, gpu or emulator.
    The first call of a vendor run.py: the run's log lines go to stderr from here, as the runner's do."""
    if not logging.getLogger().handlers:
        setup_logging(False)
    if args:
        for key, value in vars(args).items():
            params[key] = value if value is not None else params.get(key)
    if params.get("eval_steps") is not None and params["eval_steps"] <= 0:
        params["eval_steps"] = None
    device = params.get("device")
    if device not in _DEVICES:
        raise UserError(f"--device {device}: give cpu, gpu or emulator (or the vendor's /cpu:0, /gpu:0)")
    params["device"] = _DEVICES[device]
    for key in ("validate_only", "compile_only", "multireplica"):
        params.setdefault(key, False)
    # as the vendor's: cs_ip stays only for a run on the vendor's system, which is never here
    is_cs(params)
    params["cs_ip"] = None
    params.setdefault("steps", None)
    if params.get("validate_only") and params.get("compile_only"):
        raise UserError("give one of --validate_only and --compile_only")


def is_cs(params: Mapping) -> bool:
    """Whether the run drives the vendor's system: never here (a cs_ip is named and ignored)."""
    if params.get("cs_ip"):
        logger.warning("cs_ip %s is ignored: it addresses the vendor's system; --device picks cpu, gpu or emulator "
                       "here", params["cs_ip"])
    return False


def check_env(params: Mapping) -> None:
    """The vendor checked its system's environment; here: that the device asked for is there."""
    if params.get("device") == "gpu":
        import tensorflow as tf

        if not tf.config.list_physical_devices("GPU"):
            raise UserError("--device gpu: TensorFlow sees no GPU on this machine; use --device cpu")


def get_csrunconfig_dict(params: Mapping) -> dict[str, Any]:
    """The keyword arguments of CSRunConfig from runconfig, in either spelling; the vendor's
    system keys are named once with the reason they are ignored, an unknown key is an error."""
    out: dict[str, Any] = {}
    for field, spellings in _RUNCONFIG_FIELDS.items():
        given = [s for s in spellings if params.get(s) is not None]
        if len(given) > 1:
            raise UserError(f"runconfig: '{given[0]}' and '{given[1]}' are the same setting; give only one")
        if given:
            out[field] = params[given[0]]
    for key, value in params.items():
        if key in VENDOR_SYSTEM_KEYS and key not in _RUN_PY_KEYS and value not in (None, False):
            logger.warning("runconfig.%s is ignored: %s", key, VENDOR_SYSTEM_KEYS[key])
        elif key not in VENDOR_SYSTEM_KEYS and key not in _RUN_PY_KEYS and not any(
                key in s for s in _RUNCONFIG_FIELDS.values()):
            raise UserError(f"runconfig.{key}: unknown key (this zoo reads {', '.join(sorted(_RUN_PY_KEYS))}, and "
                            f"{', '.join(s for v in _RUNCONFIG_FIELDS.values() for s in v)})")
    out["model_dir"] = params.get("model_dir") or "model_dir"
    out["device"] = params.get("device") or "cpu"
    return out


def save_params(params: Mapping, model_dir: str, fname: str = "params.yaml") -> str:
    """The params as the run uses them, to ``model_dir/fname``."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, fname)
    atomic_write_text(path, yaml.safe_dump(_plain(params), sort_keys=False, default_flow_style=None))
    return path


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
