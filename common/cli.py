"""The one command line of every run.py, TF and PyTorch alike, and the error guard around a run.

    python <framework>/<model>/run.py --mode train [--params FILE] [section.key=value ...]

Flags name what a run does; everything about the model and its training lives in params
(overridable with trailing ``section.key=value`` arguments).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import traceback
from typing import Any, Callable, Mapping, Sequence

from common.errors import UserError
from common.io import not_written
from common.interrupt import Interrupted, raise_on_signals
from common.params import (MODES, Typed, defaults_form, load_params, load_vendor_params, parse_override,
                           read_params_file, shown)
from common.runlock import release_all


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the usage text is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# The vendor's runner flags that mean nothing here: accepted, and each given one is named with the reason
# (-p, -m, -o, --checkpoint_path, --validate_only, --compile_only and --cpu are this runner's own).
VENDOR_FLAGS = {
    "--cs_ip": ("-cs", "addresses the vendor's system; --device picks cpu, gpu or emulator here"),
    "--multireplica": (None, "replicas on the vendor's system; one replica runs here"),
    "--num_csx": (None, "counts the vendor's systems; --device picks cpu, gpu or emulator here"),
    "--num_wgt_servers": (None, "weight servers of the vendor's system; device.execution_mode=weight_streaming "
                                "models weight streaming here"),
    "--appliance": (None, "the vendor's appliance mode; --device picks cpu, gpu or emulator here"),
    "--fabric_config_file": (None, "configures the vendor's system"),
    "--compile_dir": ("-c", "a compile writes into model_dir/compile here"),
    "--config": (None, "one params file holds one config here: give it with --params"),
    "--is_pretrained_checkpoint": (None, "--checkpoint_path loads the weights it names here"),
    "--logging": (None, "--verbose sets the log level here"),
    "--credentials_path": (None, "configures the vendor's cluster"),
    "--mgmt_address": (None, "configures the vendor's cluster"),
    "--debug_args_path": (None, "configures the vendor's compiler"),
    "--mount_dirs": (None, "configures the vendor's cluster"),
    "--python_paths": (None, "configures the vendor's cluster"),
    "--volume_mount_path": (None, "configures the vendor's cluster"),
    "--dist_addr": ("-dist_addr", "one process trains here"),
    "--dist_backend": ("-dist_backend", "one process trains here"),
    "--init_method": ("-init_method", "one process trains here"),
}
_VENDOR_SWITCHES = {"--multireplica", "--appliance", "--is_pretrained_checkpoint"}
_VENDOR_LISTS = {"--mount_dirs", "--python_paths"}


def build_parser(prog: str | None = None, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    parser = _OneLineParser(prog=prog, description="Train, evaluate, predict with or compile a zoo model.",
                            parents=list(parents))
    parser.add_argument("-m", "--mode", choices=MODES, default="train",
                        help="train (default), eval (latest checkpoint), eval_all (every checkpoint), "
                             "train_and_eval, predict")
    parser.add_argument("-p", "--params", help="params YAML (default: configs/params.yaml beside run.py)")
    parser.add_argument("-o", "--model_dir", help="where checkpoints, summaries and params land (runconfig.model_dir)")
    parser.add_argument("--checkpoint_path",
                        help="checkpoint to start from (default: the latest in model_dir)")
    parser.add_argument("--max_steps", type=int, help="train until this global step (runconfig.max_steps)")
    parser.add_argument("--steps", type=int, help="train this many steps more (runconfig.steps)")
    parser.add_argument("--eval_steps", type=int, help="eval batches (runconfig.eval_steps; default: all)")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--validate_only", action="store_true",
                      help="compile up to kernel matching: is every op supported? (fast)")
    only.add_argument("--compile_only", action="store_true",
                      help="compile completely: placement, memory and performance estimate in model_dir/compile")
    parser.add_argument("--device", choices=("cpu", "gpu", "emulator"), default="cpu",
                        help="where the run executes (emulator: the numpy model of the wafer)")
    parser.add_argument("--cpu", dest="device", action="store_const", const="cpu", help="the vendor's flag: "
                        "--device cpu")
    parser.add_argument("--verbose", action="store_true", help="debug logging and tracebacks for errors")
    vendor = parser.add_argument_group("the vendor's runner flags, accepted and ignored (each given one says why)")
    for flag, (short, why) in VENDOR_FLAGS.items():
        names = [short, flag] if short else [flag]
        dest = "vendor_" + flag.lstrip("-")
        if flag in _VENDOR_SWITCHES:
            vendor.add_argument(*names, dest=dest, action="store_true", help=why)
        else:
            vendor.add_argument(*names, dest=dest, nargs="+" if flag in _VENDOR_LISTS else None, metavar="X",
                                help=why)
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="override any params key, e.g. runconfig.max_steps=100 model.dropout=0.0")
    return parser


def parse_command_line(argv: Sequence[str] | None = None, prog: str | None = None,
                       parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.Namespace:
    """The run's flags; ``parents``: a folder's own flags (the vendor's extra_args_parser_fn)."""
    # intermixed: overrides may come before and after flags (`--mode eval a.b=1 --steps 5 c.d=2`)
    args = build_parser(prog, parents).parse_intermixed_args(argv)
    for flag, (_, why) in VENDOR_FLAGS.items():
        if getattr(args, "vendor_" + flag.lstrip("-")) not in (None, False):
            print(f"{prog or 'run.py'}: {flag} is ignored: {why}", file=sys.stderr)
    _check_counts(args, prog)
    return args


def _check_counts(args: argparse.Namespace, prog: str | None) -> None:
    for flag in ("max_steps", "steps", "eval_steps"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise SystemExit(f"{prog or 'run.py'}: error: --{flag} must be positive, got {value}")


def refuse_early(prog_of: Callable[[str], str]) -> None:
    """Where this process is ``python <folder>/run.py ...``: the errors of its command line that
    need no framework (a misspelt --mode, a flag's value of the wrong type), one line and status
    2 as parse_command_line gives them, before torch or TensorFlow loads (a second, not the
    framework's import). Each runner calls it before its framework's first import;
    ``prog_of(folder)`` is the name its usage lines give the run.py of ``folder``.

    Only the runner's own flags, written out whole, are checked here: a folder's own flags
    (extra_args_parser_fn), an abbreviated flag and --help wait for the whole parser."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) != "run.py" or not os.path.isfile(script):
        return  # imported by a test or a tool, whose command line is not a run's
    argv = sys.argv[1:]
    if any(a.startswith("-h") or (len(a) > 2 and "--help".startswith(a)) for a in argv):
        return
    prog = prog_of(os.path.dirname(os.path.abspath(script)))
    parser = build_parser(prog)
    parser.allow_abbrev = False  # an abbreviation may name a folder's own flag
    args, _ = parser.parse_known_intermixed_args(argv)
    _check_counts(args, prog)


def default_model_dir(framework: str, model_folder: str, params_path: str) -> str:
    """``model_dir/<framework>_<folder>[_<config>]`` when nothing sets runconfig.model_dir: a
    copied folder, or another config of the same folder, never resumes or overwrites the
    checkpoints of the original (``configs/params_tiny.yaml`` -> ``..._tiny``)."""
    stem = os.path.splitext(os.path.basename(params_path))[0]
    config = "" if stem == "params" else "_" + (stem.removeprefix("params_") or stem)
    return os.path.join("model_dir", f"{framework}_{os.path.basename(os.path.abspath(model_folder))}{config}")


# the input sections a run of each --mode reads (their data_dirs are checked; a compile may read more)
_INPUTS_READ = {"train": ("train_input",), "train_and_eval": ("train_input", "eval_input"), "eval": ("eval_input",),
                "eval_all": ("eval_input",), "predict": ("eval_input",)}


def effective_params(args: argparse.Namespace, default_params_fn: Callable | None, model_folder: str,
                     framework: str, mode: str | None = None) -> Mapping:
    """Defaults -> the params file -> flags -> ``section.key=value`` overrides, validated.

    ``default_params_fn`` comes in either form (``common.params.defaults_form``): the zoo's
    ``default_params() -> dict``, whose result is the schema (params come back frozen), or the
    vendor's ``set_defaults(params)`` (TF: ``set_defaults(params, mode=mode)``), which fills
    the loaded params in place (params come back as a plain, tracked dict). ``mode`` is the
    vendor's mode key handed to a set_defaults that takes one. None, as the vendor's runner
    allowed (its gpt2 passes none): the vendor's form with nothing filled in, the params
    file as it is, and the runner's own sections (runconfig, optimizer, ...) with their defaults.
    """
    path = args.params or os.path.join(model_folder, "configs", "params.yaml")
    overrides = [f"runconfig.{flag}={getattr(args, flag)}" for flag in ("model_dir", "max_steps", "steps", "eval_steps")
                 if getattr(args, flag) is not None]
    model_dir = default_model_dir(framework, model_folder, path)
    if default_params_fn is None or defaults_form(default_params_fn) == "vendor":
        params = load_vendor_params(path, default_params_fn, [*overrides, *args.overrides], mode=mode,
                                    model_dir=model_dir)
        defaults = None  # set_defaults fills what the file leaves out: every value the file gives is the user's
    else:
        defaults = default_params_fn()
        params = load_params(path, defaults, [*overrides, *args.overrides], model_dir=model_dir)
    from common.data.mnist.resolve import check_set_data_dirs  # numpy: not before the command line is checked

    unread = {"train_input", "eval_input"} - set(_INPUTS_READ[args.mode])
    check_set_data_dirs(params, set_by_user(params, path, args.overrides, defaults), unread)
    args.run_model_dir = dict.get(params["runconfig"], "model_dir")  # for guarded's line on a stop during start-up
    return params


def check_device_optimizer(params: Mapping, args: argparse.Namespace, framework: str) -> None:
    """The vendor's optimizer keys that the device's optimizer does not take, refused (one line)
    where the run is on the device (--device emulator, --validate_only, --compile_only)."""
    on_device = args.device == "emulator" or args.validate_only or args.compile_only
    optimizer = params["optimizer"]
    if not on_device:
        return
    if optimizer["optimizer_type"] in ("adam", "adamw") and not optimizer.get("correct_bias", True):
        raise UserError("optimizer.correct_bias: false: the device's Adam always corrects the bias of its moments; "
                        "run it with --device cpu or gpu, or drop the key")
    from device.api import MAX_LOSS_SCALE  # numpy: after the command line is checked

    if framework == "pytorch" and optimizer.get("max_loss_scale", MAX_LOSS_SCALE) != MAX_LOSS_SCALE:
        raise UserError(f"optimizer.max_loss_scale: {optimizer['max_loss_scale']:g}: a PyTorch run on the device "
                        f"grows the loss scale up to {MAX_LOSS_SCALE:g}; run it with --device cpu or gpu, or drop "
                        f"the key")


def set_by_user(params: Mapping, path: str, overrides: Sequence[str],
                defaults: Mapping | None) -> Callable[[tuple], str | None]:
    """``where_set(key_path)``: where the user set that key (the params file's ``file:line``, or
    the command line's override), or None where it holds its default value (``defaults``: the
    zoo's form's schema; None: every value a file gives is the user's; a path is its default
    however written, ``data/mnist`` for ``./data/mnist``). As common/params.py names a key's
    origin in its errors: the last override of the key or of a section above it wins over the
    file, which gives the line of each key it sets."""
    in_file = read_params_file(path)[1] if os.path.isfile(path) else {}
    on_command_line = {parse_override(text)[0]: f"command line '{shown(text)}'" for text in overrides}

    def where_set(key_path: tuple) -> str | None:
        origin = next((on_command_line[key_path[:n]] for n in range(len(key_path), 0, -1)
                       if key_path[:n] in on_command_line), in_file.get(key_path))
        if origin is None or defaults is None:
            return origin
        default: Any = defaults
        for key in key_path:
            default = default.get(key) if isinstance(default, Mapping) else None
        default = default.default if isinstance(default, Typed) else default
        value: Any = params
        for key in key_path:
            value = dict.get(value, key) if isinstance(value, Mapping) else None
        if isinstance(value, str) and isinstance(default, str) and value and default:
            value, default = os.path.normpath(value), os.path.normpath(default)
        return None if value == default else origin

    return where_set


def _restart(args: argparse.Namespace, latest_checkpoint: Callable[[str], str | None] | None) -> str:
    """Where the same training command starts from, for the line of a stop before the loop began."""
    if getattr(args, "checkpoint_path", None):
        return f"; the same command starts again from {args.checkpoint_path}"
    model_dir = getattr(args, "run_model_dir", None)
    try:
        newest = latest_checkpoint(model_dir) if model_dir and latest_checkpoint is not None else None
    except (UserError, OSError):  # a damaged TF state file: the run's next start names it
        newest = None
    if newest is None:
        return ""
    return f"; the same command resumes from {newest}, the newest checkpoint in {model_dir}"


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S", force=True)


def guarded(body: Callable[[argparse.Namespace], Any], args: argparse.Namespace,
            latest_checkpoint: Callable[[str], str | None] | None = None) -> Any:
    """Run ``body(args)``; bad input becomes one ``error:`` line and a non-zero exit, and a
    Ctrl-C or SIGTERM one line saying where the run stopped, with the shell's status (130,
    143). The model_dir lock (common/runlock.py) is released however the run ends.

    ``latest_checkpoint(model_dir)``: the framework's newest checkpoint there (or None); a
    training run stopped before its loop began says the same command resumes from it only
    when there is one (model_dir is known once effective_params has loaded the params)."""
    try:
        with raise_on_signals():
            return body(args)
    except (UserError, OSError) as e:
        error = e if isinstance(e, UserError) else not_written(e)  # a full disk: one line as well
        if error is None:
            raise
        if args.verbose:
            traceback.print_exc()
        # one line; a validation report that lists several findings adds one line per finding
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except KeyboardInterrupt as e:  # Interrupted, or a KeyboardInterrupt raised where our handler was not
        if args.verbose:
            traceback.print_exc()
        signum = getattr(e, "signum", signal.SIGINT)
        line = str(e) if isinstance(e, Interrupted) else ""  # the train loops say where they stopped
        if not line:
            line = f"interrupted by {signal.Signals(signum).name} during --mode {args.mode}"
            if args.mode in ("train", "train_and_eval"):
                line += _restart(args, latest_checkpoint)
        print(line, file=sys.stderr)
        raise SystemExit(128 + signum) from None
    finally:
        release_all()
