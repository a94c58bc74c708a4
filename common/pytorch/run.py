"""The shared PyTorch runner: ``run(model_fn, train_data_fn, eval_data_fn, default_params_fn)``
(and the vendor's fifth argument, ``extra_args_parser_fn``; all but model_fn optional, as the vendor's).

A model's run.py hands over four callables; everything else is here:

    model_fn(params, device) -> PyTorchBaseModel
    train_data_fn(params) / eval_data_fn(params) -> torch.utils.data.DataLoader
    default_params_fn() -> dict    the model's own keys (model, train_input, eval_input, ...), or the
                                   vendor's set_defaults(params), which fills the loaded params in place,
                                   or None: the params file as it is

One run, in order: command line -> params (defaults, the file, overrides) -> data loaders
-> model -> checkpoint. Only when all of these loaded fine does the run create model_dir
and write ``params_<mode>.yaml`` into it, so bad input never touches an existing model_dir.
Then the mode runs (common/pytorch/runner.py: the loops), with the steps of ``--device``:
cpu and gpu in torch, emulator on the numpy emulator (common/pytorch/device_run.py).
--validate_only and --compile_only capture and compile the model for the device instead
(common/pytorch/device_run.py: compile_for_device). Launched by ``torchrun`` with several
processes, the run is data parallel (common/pytorch/distributed.py).
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
from typing import Any, Callable

from common import threads
from common.cli import (check_device_optimizer, effective_params, guarded, parse_command_line, refuse_early,
                        setup_logging)


def _prog(model_folder: str) -> str:
    return f"{os.path.basename(model_folder)}/run.py"


refuse_early(_prog)  # `--mode trian` refused before torch loads

from common.errors import UserError  # noqa: E402
from common.params import TrackedDict, report_unused  # noqa: E402
from common.pytorch import distributed  # noqa: E402
from common.pytorch.checkpoint import latest_checkpoint  # noqa: E402
from common.pytorch.runner import DataFn, FrameworkSteps, ModelFn, Runner, StepsFn  # noqa: E402
# imported from here by tools and tests
from common.pytorch.runner import StepWindow, seed_everything  # noqa: E402, F401


def run(model_fn: ModelFn, train_data_fn: DataFn | None = None, eval_data_fn: DataFn | None = None,
        default_params_fn: Callable | None = None,
        extra_args_parser_fn: Callable[[], list[argparse.ArgumentParser]] | None = None,
        argv: list[str] | None = None) -> Any:
    """Parse the command line and run the mode; bad input exits with one line (status 2).

    The vendor's signature, in its order: only ``model_fn`` is required. Without
    ``default_params_fn`` the params file is taken as it is (the runner's own sections get
    their defaults); a data function left out is an error only in a mode that reads it.
    ``extra_args_parser_fn`` (the vendor's) returns parsers of the folder's own flags; their
    values land in ``params["runconfig"]``, as the vendor's runner put them."""
    model_folder = os.path.dirname(os.path.abspath(inspect.getfile(model_fn)))
    extra = list(extra_args_parser_fn()) if extra_args_parser_fn is not None else []
    args = parse_command_line(argv, prog=_prog(model_folder), parents=extra)
    setup_logging(args.verbose)

    def body(args):
        world = distributed.world_from_env()
        if world.distributed:
            if args.validate_only or args.compile_only:
                distributed.refuse_on_device(world, "--validate_only / --compile_only")
            if args.device == "emulator":
                distributed.refuse_on_device(world, "--device emulator")
            if not world.is_main:  # rank 0 logs the run; the others their warnings and errors
                logging.getLogger("zoo").setLevel(logging.WARNING)
        _check_data_fns(args, train_data_fn, eval_data_fn)
        threads.start_up()  # torch's CPU threads: how many, from the cores free now
        params = effective_params(args, default_params_fn, model_folder, "pytorch")
        check_device_optimizer(params, args, "pytorch")
        _add_extra_args(params, args, extra)
        for key in ("train_distribute", "num_devices"):
            if params["runconfig"][key] is not None:
                raise UserError(f"runconfig.{key} is the TF runner's (tf.distribute strategies); a PyTorch run "
                                f"trains data parallel when launched by torchrun --nproc_per_node N (README)")
        if args.validate_only or args.compile_only:
            from common.pytorch.device_run import compile_for_device  # the device; loaded only when asked for

            result = compile_for_device(args, params, model_fn, train_data_fn, eval_data_fn)
        elif world.distributed:
            result = _data_parallel(args, params, model_fn, train_data_fn, eval_data_fn, world)
        else:
            result = Runner(args, params, model_fn, train_data_fn, eval_data_fn, step_backend(args.device)).execute()
        report_unused(params)  # vendor-form params: keys of the file nobody read (once; training reports early)
        return result

    return guarded(body, args, latest_checkpoint)


def _check_data_fns(args: argparse.Namespace, train_data_fn: DataFn | None, eval_data_fn: DataFn | None) -> None:
    """A mode that reads a data function run() was not given: one line, before anything loads."""
    compiles = args.validate_only or args.compile_only  # a compile reads the input of the mode it compiles
    reads = {"train": ("train",), "train_and_eval": ("train",) if compiles else ("train", "eval")}.get(
        args.mode, ("eval",))
    for name, fn in (("train", train_data_fn), ("eval", eval_data_fn)):
        if name in reads and fn is None:
            raise UserError(f"--mode {args.mode} reads the {name} input, and run() was given no {name}_data_fn")


def _data_parallel(args, params, model_fn, train_data_fn, eval_data_fn, world: distributed.World) -> Any:
    """One process of a torchrun launch: join the group, run the mode, leave the group."""
    distributed.init(world, args.device)
    try:
        return Runner(args, params, model_fn, train_data_fn, eval_data_fn, FrameworkSteps, world).execute()
    except RuntimeError as e:  # a collective whose peer is gone (DistBackendError) or timed out
        if not _is_collective_failure(e):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"process {world.rank} of {world.size}: a collective failed ({first[:160]}): another "
                               f"process of the run stopped or cannot be reached; the same command resumes from "
                               f"the newest checkpoint in {params['runconfig']['model_dir']}") from None
    finally:
        distributed.finish()


def _is_collective_failure(e: BaseException) -> bool:
    import torch.distributed as dist

    backend_error = getattr(dist, "DistBackendError", ())
    text = str(e)
    return isinstance(e, backend_error) or any(word in text for word in ("Gloo", "gloo", "NCCL", "Connection closed",
                                                                          "Timed out", "timed out"))




def _add_extra_args(params, args: argparse.Namespace, parsers: list[argparse.ArgumentParser]) -> None:
    # (argparse's -h prints and exits: it never leaves a "help" in args)
    given = {a.dest: getattr(args, a.dest) for p in parsers for a in p._actions
             if getattr(args, a.dest, None) is not None}
    if not given:
        return
    if not isinstance(params, TrackedDict):
        raise UserError("extra_args_parser_fn: a folder's own flags go into params['runconfig'], which only the "
                        "vendor's form (set_defaults(params)) leaves writable; make them params keys instead")
    params["runconfig"].update(given)


def step_backend(device: str) -> StepsFn:
    """The steps of ``--device``: cpu and gpu in torch, emulator on the numpy emulator."""
    if device == "emulator":
        from common.pytorch.device_run import EmulatorSteps  # numpy emulator; loaded only when asked for

        return EmulatorSteps
    return FrameworkSteps
