"""The vendor's TF ``run_utils``, for a folder's own ``run.py`` that drives the Estimator itself.

A folder from the vendor's zoo keeps its argparse and calls, in order::

    update_params_from_args(args, params["runconfig"])     # the command line into runconfig
    save_params(params, model_dir=runconfig["model_dir"])
    use_cs = is_cs(runconfig)                               # False: no vendor system here
    CSRunConfig(cs_ip=..., stack_params=..., **get_csrunconfig_dict(runconfig))
    check_env(runconfig)

``--device emulator`` (this zoo's) reaches the emulator through the same path:
update_params_from_args keeps it in runconfig, get_csrunconfig_dict hands it to the
RunConfig, and the CerebrasEstimator runs its steps there. The rest of the vendor's names
answer as the vendor's did without its system: get_execution_mode() (OutsideCerebras),
get_csconfig (None), update_input_checkpoint_steps (params as they are), and get_params,
create_warm_start_settings, save_predictions and get_predict_directory as the vendor's. Params stay the plain dict the
folder loaded; the runconfig keys are read with the vendor's and this zoo's spellings, and
the keys of the vendor's system are named once, with why they are ignored.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from enum import Enum
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
    The first call of a vendor run.py: the run's log lines go to stderr from here, as the runner's do,
    and bad input it meets from here on is one error line (_one_line_user_errors)."""
    if not logging.getLogger().handlers:
        setup_logging(False)
    _one_line_user_errors()
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


def _one_line_user_errors() -> None:
    """A vendor run.py drives the estimator itself, outside the runner's guard (common/cli.py
    guarded): bad input it meets (a UserError it does not catch) is one ``error:`` line and the
    error's exit status, as the runner's; any other exception keeps Python's traceback."""
    previous = sys.excepthook
    if getattr(previous, "one_line_user_errors", False):
        return

    def hook(kind, error, tb):
        if isinstance(error, UserError):
            print(f"error: {error}", file=sys.stderr)
            sys.exit(error.exit_code)
        previous(kind, error, tb)

    hook.one_line_user_errors = True
    sys.excepthook = hook


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


# --- the rest of the vendor's run_utils: where no vendor system is, as the vendor's answered there ---


class ExecutionMode(Enum):
    """How the vendor's system runs a model; a folder asks get_execution_mode() to pick its kernels."""

    WeightStreaming = 1
    Pipeline = 2
    OutsideCerebras = 3


def get_execution_mode() -> ExecutionMode:
    """OutsideCerebras: no vendor system software here (the vendor's answer where it could import neither
    of its estimators). The emulator's own execution mode is ``device.execution_mode`` in params."""
    return ExecutionMode.OutsideCerebras


def get_csconfig(params: Mapping | None) -> None:
    """The vendor system's CSConfig proto: None without its system software, as the vendor's gave."""
    if params:
        logger.warning("csconfig %s is ignored: it configures the vendor's system", ", ".join(sorted(params)))
    return None


def get_params(params_file: str) -> dict:
    """The YAML file as written (the vendor's: no defaults, no checks; the runner checks what it reads)."""
    try:
        with open(params_file, encoding="utf-8") as f:
            params = yaml.safe_load(f)
    except FileNotFoundError:
        raise UserError(f"{params_file}: params file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise UserError(f"{params_file}{line}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(params, dict):
        raise UserError(f"{params_file}: a params file is a mapping of sections, this one holds "
                        f"{type(params).__name__}")
    return params


def create_warm_start_settings(runconfig_params: Mapping, exclude_string: str | None = None):
    """Warm start from ``runconfig.checkpoint_path`` (None without one): the model's trainable variables
    from that checkpoint, except those whose name contains ``exclude_string`` (a fine-tuning head,
    initialised afresh), at step 0; a model_dir that holds a checkpoint resumes from it instead."""
    from common.tf.estimator import WarmStartSettings

    checkpoint_path = runconfig_params.get("checkpoint_path")
    if checkpoint_path is None:
        return None
    regex = f"^((?!{re.escape(exclude_string)}).)*$" if exclude_string else ".*"
    return WarmStartSettings(ckpt_to_initialize_from=checkpoint_path, vars_to_warm_start=regex)


def get_predict_directory(model_dir: str) -> str:
    """``model_dir/predict``, where save_predictions wrote; a UserError before any predict run."""
    path = os.path.join(model_dir, "predict")
    if not os.path.isdir(path):
        raise UserError(f"{path}: no predictions yet; run with --mode predict first")
    return path


def save_predictions(model_dir: str, outputs, name: str = "outputs.npz") -> str | None:
    """Every prediction of ``outputs`` (estimator.predict's dicts) into ``model_dir/predict/name`` as the
    vendor's (one array, ``arr_0``, of the dicts); nothing is written for no outputs. Replaces a file of
    that name, with a warning."""
    import numpy as np

    predict_dir = os.path.join(model_dir, "predict")
    os.makedirs(predict_dir, exist_ok=True)
    path = os.path.join(predict_dir, name)
    collected = list(outputs)
    if not collected:
        return None
    if os.path.exists(path):
        logger.warning("%s exists: replaced by this run's predictions", path)
    np.savez(path, collected)
    return path


def get_input_checkpoint_steps(model_dir: str) -> int:
    """The global step of model_dir's newest checkpoint (0 without one): the batches a resumed input skips."""
    from common.tf.estimator import checkpoints

    newest = checkpoints.latest_checkpoint(model_dir)
    return checkpoints.checkpoint_step(newest) if newest else 0


def update_input_checkpoint_steps(params: MutableMapping) -> MutableMapping:
    """The vendor set ``train_input.skip_steps`` for its system's input pipeline only, and left params as
    they are elsewhere; so here. This zoo's runner restores the input position from the checkpoint
    itself (common/tf/estimator/session.py), on every device."""
    return params
