"""The TF runner every tf/<model>/run.py hands its callables to; the same flags as the PyTorch side.

    python tf/mnist/run.py --mode train [--params FILE] [--model_dir DIR] [section.key=value ...]

Modes: train, eval (the latest checkpoint, or --checkpoint_path), eval_all (every checkpoint
in model_dir), train_and_eval (evaluating each checkpoint as it is saved), predict
(predictions of the eval input to model_dir/predictions.npz). ``--checkpoint_path`` in
train starts from that checkpoint (its weights, optimizer state and step, and its input
position where it holds one for the same input pipeline) instead of the latest in model_dir. ``--validate_only`` / ``--compile_only`` compile for the device;
``--device emulator`` trains and evaluates on the numpy model of the wafer.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from typing import Any, Callable

import numpy as np

from common.cli import effective_params, guarded, parse_command_line, setup_logging
from common.errors import UserError
from common.precision import check_precision
from common.io import atomic_open
from common.params import save_params
from common.runlock import RunLock, check_free

logger = logging.getLogger("zoo")

# --mode -> the ModeKeys value a compile of that mode builds
_COMPILE_MODES = {"train": "train", "train_and_eval": "train", "eval": "eval", "eval_all": "eval",
                  "predict": "infer"}


def _check_device(device: str) -> None:
    import tensorflow as tf

    if device == "gpu" and not tf.config.list_physical_devices("GPU"):
        raise UserError("--device gpu: TensorFlow sees no GPU on this machine; use --device cpu")


def run(model_fn: Callable, train_input_fn: Callable, eval_input_fn: Callable, default_params_fn: Callable[[], dict],
        argv: list[str] | None = None) -> Any:
    """Parse the command line, run the mode; bad input exits with one ``error:`` line."""
    model_folder = os.path.dirname(os.path.abspath(inspect.getfile(model_fn)))
    args = parse_command_line(argv, prog=f"{os.path.relpath(model_folder)}/run.py")
    setup_logging(args.verbose)
    return guarded(lambda a: _run(a, model_fn, train_input_fn, eval_input_fn, default_params_fn(), model_folder),
                   args)


def _run(args, model_fn, train_input_fn, eval_input_fn, defaults: dict, model_folder: str) -> Any:
    params = effective_params(args, defaults, model_folder)
    check_precision(params, args.device)
    _check_device(args.device)

    from common.tf.estimator import CerebrasEstimator, RunConfig  # TensorFlow loads here, after the flags

    config = RunConfig.from_params(params, device=args.device)
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
        save_params(params, config.model_dir, mode)

    if args.validate_only or args.compile_only:
        input_fn = train_input_fn if _COMPILE_MODES[mode] == "train" else eval_input_fn
        return estimator.compile(input_fn, validate_only=args.validate_only, mode=_COMPILE_MODES[mode])

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
    return _predict(estimator, eval_input_fn, args.checkpoint_path, rc["eval_steps"], write_params)


def _predict(estimator, input_fn: Callable, checkpoint_path: str | None, max_batches: int | None,
             write_params: Callable[[], None]) -> str:
    """Predictions of the eval input, stacked per key, to model_dir/predictions.npz."""
    batches: dict[str, list[np.ndarray]] = {}
    predictions = estimator.predict(input_fn, checkpoint_path=checkpoint_path, yield_single_examples=False,
                                    on_ready=write_params)
    with contextlib.closing(predictions):
        for i, batch in enumerate(predictions):
            if max_batches is not None and i >= max_batches:
                break
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
    return path
