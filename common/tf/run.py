"""The TF runner every tf/<model>/run.py hands its callables to; the same flags as the PyTorch side.

    python tf/mnist/run.py --mode train [--params FILE] [--model_dir DIR] [section.key=value ...]

Modes: train, eval (the latest checkpoint, or --checkpoint_path), eval_all (every checkpoint
in model_dir), train_and_eval (evaluating each checkpoint as it is saved), predict
(predictions of the eval input to model_dir/predictions.npz; a model's ``predictions_done``
hook may write more: ``run``). ``--checkpoint_path`` in train starts from that checkpoint (its
weights, optimizer state and step, and its input position where it holds one for the same
input pipeline) instead of the latest in model_dir. ``--validate_only`` / ``--compile_only``
compile for the device; ``--device emulator`` trains and evaluates on the numpy model of the
wafer.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import faulthandler
import importlib.util
import inspect
import logging
import os
import re
import shutil
import sys
import tempfile
from typing import Any, Callable

import numpy as np

from common.cli import (check_device_optimizer, effective_params, guarded, parse_command_line, refuse_early,
                        setup_logging)
from common.errors import UserError
from common.precision import check_precision
from common.io import atomic_open
from common.params import TrackedDict, report_unused, save_params
from common.runlock import RunLock, check_free

logger = logging.getLogger("zoo")

# --- TensorFlow's first import -------------------------------------------------------------
# On a machine without CUDA, importing TensorFlow prints C++ lines about the CUDA libraries
# and drivers it did not find, which bury the run's own first lines. TF_CPP_MIN_LOG_LEVEL
# does not reach most of them (absl logs them before TensorFlow sets up its logging), so
# the import and the first device query run with stderr (fd 2) captured, and every other
# line is written back. A folder's run.py imports this module before its model.py imports
# TensorFlow, so this is the first import; --verbose keeps every line.
_STARTUP_NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^[IWE]\d{4} [\d:.]+\s+\d+ (cudart_stub|cuda_\w+|cpu_feature_guard)\.cc:\d+\] "
    r"|^To enable the following instructions: .* rebuild TensorFlow")


def is_startup_noise(line: str) -> bool:
    """A line of TensorFlow's start-up about CUDA it did not find (or the CPU it was built for)."""
    return bool(_STARTUP_NOISE.match(line))


def _verbose_requested(argv: list[str]) -> bool:
    # argparse accepts any unambiguous prefix of --verbose ("--ve" on)
    return any(len(a) >= 4 and "--verbose".startswith(a) for a in argv)


def _import_tensorflow_quietly() -> None:
    if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's own INFO lines; the user's setting wins
    sys.stderr.flush()
    saved = os.dup(2)
    # a TensorFlow that kills the process while importing (a CPU it was not built for) takes
    # its captured reason with it: the traceback goes to the real stderr (--verbose shows all)
    crash_report = faulthandler.is_enabled()
    faulthandler.enable(saved)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.config.list_physical_devices()  # where a CPU-only machine logs its failed cuInit
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            if crash_report:  # on fd 2: sys.stderr may be a stream without one (a test's capture)
                faulthandler.enable(2)
            else:
                faulthandler.disable()
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not is_startup_noise(line.rstrip("\n"))]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


def _prog(model_folder: str) -> str:
    return f"{os.path.relpath(model_folder)}/run.py"


refuse_early(_prog)  # `--mode trian` refused before TensorFlow loads
if not _verbose_requested(sys.argv[1:]):
    _import_tensorflow_quietly()

# --mode -> the ModeKeys value a compile of that mode builds
_COMPILE_MODES = {"train": "train", "train_and_eval": "train", "eval": "eval", "eval_all": "eval",
                  "predict": "infer"}


def _check_device(device: str) -> None:
    import tensorflow as tf

    if device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise UserError("--device gpu: TensorFlow sees no GPU on this machine; use --device cpu")


def run(model_fn: Callable, train_input_fn: Callable | None = None, eval_input_fn: Callable | None = None,
        default_params_fn: Callable | None = None, argv: list[str] | None = None,
        predictions_done: Callable | None = None) -> Any:
    """Parse the command line, run the mode; bad input exits with one ``error:`` line.

    The PyTorch runner's argument order; only ``model_fn`` is required (an input function left
    out is an error only in a mode that reads it). ``default_params_fn`` is the zoo's
    ``default_params() -> dict`` or the vendor's ``set_defaults(params, mode=mode)``
    (common/cli.py::effective_params tells them apart), or None: the params file as it is,
    with the runner's own sections (runconfig, optimizer, ...) given their defaults.
    ``predictions_done(arrays, params, model_dir) -> {name: float}``, where given, runs once
    predict has written predictions.npz (``arrays``: its contents): it writes the model's own
    files (tf/gpt2's completions) and may return figures, which are logged."""
    model_folder = os.path.dirname(os.path.abspath(inspect.getfile(model_fn)))
    args = parse_command_line(argv, prog=_prog(model_folder))
    setup_logging(args.verbose)
    return guarded(lambda a: _run(a, model_fn, train_input_fn, eval_input_fn, default_params_fn, model_folder,
                                  predictions_done), args, _latest_checkpoint)


def _latest_checkpoint(model_dir: str) -> str | None:
    from common.tf.estimator.checkpoints import latest_checkpoint

    return latest_checkpoint(model_dir)


def _run(args, model_fn, train_input_fn, eval_input_fn, default_params_fn: Callable | None, model_folder: str,
         predictions_done: Callable | None = None) -> Any:
    compiles = args.validate_only or args.compile_only  # a compile builds the graph of one mode
    reads = ("train",) if _COMPILE_MODES[args.mode] == "train" else ("eval",)
    if args.mode == "train_and_eval" and not compiles:
        reads = ("train", "eval")
    for name, fn in (("train", train_input_fn), ("eval", eval_input_fn)):
        if name in reads and fn is None:
            raise UserError(f"--mode {args.mode} reads the {name} input, and run() was given no {name}_input_fn")
    params = effective_params(args, default_params_fn, model_folder, "tf", mode=_COMPILE_MODES[args.mode])
    check_device_optimizer(params, args, "tf")
    if not (args.validate_only or args.compile_only):  # these build for the device, which takes every 16-bit format
        check_precision(params, args.device)
    _check_device(args.device)
    if params["runconfig"]["disable_dropout"]:
        raise UserError("runconfig.disable_dropout: true is PyTorch's only: a TF graph's dropout rates are written "
                        "into its ops (tf.nn.dropout's rate, a Keras Dropout layer's); set them to 0 through the "
                        "model's own params")
    if (args.validate_only or args.compile_only) and params["runconfig"]["train_distribute"] is not None:
        raise UserError(f"runconfig.train_distribute={params['runconfig']['train_distribute']} with "
                        f"{'--validate_only' if args.validate_only else '--compile_only'}: the device is one system "
                        f"per run and compiles one graph; compile without a strategy")

    from common.tf.estimator import CerebrasEstimator, RunConfig  # TensorFlow loads here, after the flags
    from common.tf.estimator.distribute import worker_index

    config = RunConfig.from_params(params, device=args.device)
    worker = worker_index(config.train_distribute)
    if worker > 0:  # a multi-worker run: the chief (worker 0) writes model_dir, the others a folder of their own
        scratch = tempfile.mkdtemp(prefix=f"zoo_worker{worker}_")
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        logger.info("worker %d of a multi-worker run: worker 0 writes %s; this one writes into %s, deleted at the "
                    "end", worker, config.model_dir, scratch)
        config = dataclasses.replace(config, model_dir=scratch)
    estimator = CerebrasEstimator(model_fn, config=config, params=params,
                                  warm_start_from=args.checkpoint_path if args.mode in ("train", "train_and_eval")
                                  else None)
    mode, rc = args.mode, params["runconfig"]

    # every mode but --validate_only / --compile_only writes into model_dir: one run there at a time
    # (common/runlock.py). Refused now, before reading a checkpoint the other run may rotate away;
    # taken when model_dir is first written; common.cli.guarded releases it when the run ends.
    lock = RunLock(config.model_dir, mode)
    if not (args.validate_only or args.compile_only):
        check_free(config.model_dir)

    def write_params() -> None:
        lock.acquire()
        # the graph is built: model_fn and input_fn have read what they read
        if mode == "train_and_eval" and isinstance(params, TrackedDict):
            # the eval graph comes at the first checkpoint: its input_fn reads its keys now, in a
            # graph of its own, or they would be reported as never read
            _read_keys_of(eval_input_fn, params, _COMPILE_MODES["eval"])
        report_unused(params)
        save_params(params, config.model_dir, mode)

    if args.validate_only or args.compile_only:
        input_fn = train_input_fn if _COMPILE_MODES[mode] == "train" else eval_input_fn
        report = estimator.compile(input_fn, validate_only=args.validate_only, mode=_COMPILE_MODES[mode])
        report_unused(params)
        return report

    steps = rc["steps"]
    max_steps = None if steps is not None else rc["max_steps"]
    if mode == "train":
        estimator.train(train_input_fn, steps=steps, max_steps=max_steps, on_ready=write_params)
        return None
    if mode == "eval":
        return estimator.evaluate(eval_input_fn, steps=rc["eval_steps"], checkpoint_path=args.checkpoint_path,
                                  on_ready=write_params)
    if mode == "eval_all":
        return estimator.evaluate_all(eval_input_fn, steps=rc["eval_steps"], on_ready=write_params)
    if mode == "train_and_eval":
        return estimator.train_and_evaluate(train_input_fn, eval_input_fn, steps=steps, max_steps=max_steps,
                                            eval_steps=rc["eval_steps"], on_ready=write_params)
    path, arrays = _predict(estimator, eval_input_fn, args.checkpoint_path, rc["eval_steps"], write_params)
    if predictions_done is not None:
        for name, value in (predictions_done(arrays, params, estimator.model_dir) or {}).items():
            logger.info("predict: %s %.6g", name, value)
    return path


def _read_keys_of(input_fn: Callable, params: Any, mode: str) -> None:
    """Build ``input_fn``'s dataset in a throwaway graph, never iterated: what it reads of params counts as read."""
    import tensorflow as tf

    from common.tf.estimator.graph import call_input_fn

    with tf.Graph().as_default():
        call_input_fn(input_fn, params, mode)


def _predict(estimator, input_fn: Callable, checkpoint_path: str | None, max_batches: int | None,
             write_params: Callable[[], None]) -> tuple[str, dict[str, np.ndarray]]:
    """Predictions of the eval input, stacked per key, to model_dir/predictions.npz: its path and arrays."""
    batches: dict[str, list[np.ndarray]] = {}
    predictions = estimator.predict(input_fn, checkpoint_path=checkpoint_path, yield_single_examples=False,
                                    max_batches=max_batches, on_ready=write_params)
    with contextlib.closing(predictions):
        for batch in predictions:
            for key, value in batch.items():
                batches.setdefault(key, []).append(value)
    if not batches:
        raise UserError("predict: the input yielded no batch")
    arrays = {key: np.concatenate(values) for key, values in batches.items()}
    path = os.path.join(estimator.model_dir, "predictions.npz")
    with atomic_open(path, "wb") as f:
        np.savez(f, **arrays)
    count = len(next(iter(arrays.values())))
    logger.info("predict: wrote %d predictions (%s) to %s", count, ", ".join(arrays), path)
    return path, arrays
