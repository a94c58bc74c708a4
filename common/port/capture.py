"""The built model through the device compiler: ``zoo port check``'s second opinion.

Where the model can be built, its training step is captured as the device IR and handed
to the emulator's public API (device/api.py): ``validate_graph`` lists every op, dtype
and shape the device will not take, at the user's line; ``compile_graph`` places it and
estimates its speed, first layer-pipelined and, when that does not fit, with weight
streaming, so that the check says which one the model needs.

A zoo folder is built as its runner builds it, from what its run.py hands over: the
params of its config, the first training batch of its own data function, model_fn (PyTorch:
``common.pytorch.device_run``'s capture; TF: the Estimator's TRAIN graph, captured by
``common.tf.device_run``). A plain script is built by ``common.port.script``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
import warnings
from typing import Any, Callable

from common.errors import UserError
from common.port.findings import Finding, Note

logger = logging.getLogger("zoo")


class NotBuilt(Exception):
    """The model could not be built: the message says why (a note, or with a location a finding)."""

    def __init__(self, message: str, file: str = "", line: int = 0, finding: bool = False, stage: str = "port"):
        super().__init__(message)
        self.file, self.line, self.finding, self.stage = file, line, finding, stage


@contextlib.contextmanager
def quiet():
    """The zoo's INFO lines and the frameworks' chatter stay out of the check's report."""
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the data code's "using the embedded digits" and the like
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the frameworks' advice to the user's code, which the findings give
            yield
    finally:
        logging.disable(level)


def user_frame(error: BaseException, root: str) -> tuple[str, int]:
    """The innermost traceback frame inside ``root`` (the user's code): (path, line)."""
    root = os.path.realpath(root) + os.sep
    found = ("", 0)
    for frame in traceback.extract_tb(error.__traceback__):
        if os.path.realpath(frame.filename).startswith(root):
            found = (frame.filename, frame.lineno or 0)
    return found


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if not isinstance(error, UserError) else text


# --- the verdict of the device compiler ----------------------------------------------------

def device_verdict(graph, *, profile: str, execution_mode: str, shown: Callable[[str], str],
                   where_set: str = "params") -> tuple[list[Finding], list[Note]]:
    """Validate ``graph`` for training on ``profile``, then compile it; findings and notes.

    ``shown`` turns a source path into the name findings use; ``where_set`` says where the
    user sets device.execution_mode (a zoo folder's params, or the params a port will have).
    """
    from device.api import DeviceCompileError, compile_graph, validate_graph

    report = validate_graph(graph, mode="train", profile_name=profile)
    findings = _grouped([_finding(f, shown) for f in report.errors])
    notes = [Note(shown(f.file) if f.file else "", f.line, f"warning from the device compiler: {f.message}")
             for f in report.warnings]
    if not report.ok:
        notes.append(Note("", 0, "compile estimate: none until the model validates"))
        return findings, notes
    try:
        result = compile_graph(graph, mode="train", profile_name=profile, execution_mode=execution_mode)
    except DeviceCompileError as e:
        message = str(e).splitlines()[0]
        if execution_mode != "pipelined" or "weight_streaming" not in message:
            findings.append(Finding("compile", "does_not_fit", "", 0, message,
                                    "a smaller batch (train_input.batch_size) or model"))
            return findings, notes
        try:
            streamed = compile_graph(graph, mode="train", profile_name=profile, execution_mode="weight_streaming")
        except DeviceCompileError as e2:
            findings.append(Finding("compile", "does_not_fit", "", 0, message + "; with weight streaming: " +
                                    str(e2).splitlines()[0], "a smaller batch (train_input.batch_size) or model"))
            return findings, notes
        findings.append(Finding(
            "compile", "needs_weight_streaming", "", 0, message.split("; stream the weights")[0],
            f"device.execution_mode: weight_streaming in {where_set}: then {estimate(streamed)}"))
        return findings, notes
    notes.append(Note("", 0, f"compile estimate: {estimate(result)}"))
    return findings, notes


def estimate(result) -> str:
    cost, placement = result.cost, result.placement
    mode = "layer-pipelined" if result.execution_mode == "pipelined" else "weight streaming"
    return (f"{cost.samples_per_s:,.0f} samples/s on {result.profile.name}, {mode}, batch {cost.batch_size}, "
            f"bound by {cost.bound_by}; {result.graph.num_params():,} parameters, {placement.active_pes:,} of "
            f"{placement.fabric_pes:,} PEs ({cost.active_pes_pct:.1f} %); the emulator's cost model, an estimate")


def _finding(f, shown: Callable[[str], str]) -> Finding:
    stage = "params" if f.kind == "profile" else "model"
    message = f"{f.framework_op}: {f.message}" if f.framework_op else f.message
    file = shown(f.file) if f.file and f.file != "<unknown>" else ""
    return Finding(stage, f.kind, file, f.line if file else 0, message, f.suggestion, by="capture")


def _grouped(findings: list[Finding]) -> list[Finding]:
    """Findings no line of the user's code explains (a float64 in every weight of an nn.Sequential)
    become one per kind, counting them."""
    located = [f for f in findings if f.file]
    by_kind: dict[str, list[Finding]] = {}
    for f in findings:
        if not f.file:
            by_kind.setdefault(f.kind, []).append(f)
    for kind, group in by_kind.items():
        first = group[0]
        if len(group) == 1:
            located.append(first)
            continue
        shown = "; ".join(f.message.split(": ", 1)[-1] for f in group[:3])
        more = f" ({len(group)} in all)" if len(group) > 3 else ""
        located.append(Finding(first.stage, kind, "", 0, f"{shown}{more}", first.fix, by="capture"))
    return located


# --- a zoo folder, built as its runner builds it ----------------------------------------

class _Handed(Exception):
    """Raised by the stand-in for run(): run.py has handed over its callables."""


def handed_callables(folder: str) -> tuple[Callable, Callable, Callable, Callable]:
    """(model_fn, train_data_fn, eval_data_fn, default_params_fn) as the folder's run.py hands them
    to the runner: its main() is called with run() replaced by a stand-in that keeps them."""
    from common.folder import load_run_module

    try:
        run_module = load_run_module(folder)
    except Exception as e:  # noqa: BLE001 - any error importing the user's folder is the user's
        path, line = user_frame(e, folder)
        raise NotBuilt(f"importing the folder failed: {one_line(e)}", path, line, finding=True) from None
    if not callable(getattr(run_module, "main", None)) or not callable(getattr(run_module, "run", None)):
        raise NotBuilt("run.py does not define main() calling run(...) as the zoo's run.py files do: "
                       "the model was not built", "run.py")
    handed: dict[str, Any] = {}

    def stand_in(model_fn, train_data_fn, eval_data_fn, default_params_fn, argv=None, **_):
        handed["fns"] = (model_fn, train_data_fn, eval_data_fn, default_params_fn)
        raise _Handed

    real = run_module.run
    run_module.run = stand_in
    try:
        run_module.main([])
    except _Handed:
        pass
    except Exception as e:  # noqa: BLE001
        path, line = user_frame(e, folder)
        raise NotBuilt(f"run.py's main() failed before calling run(): {one_line(e)}", path, line,
                       finding=True) from None
    finally:
        run_module.run = real
    if "fns" not in handed:
        raise NotBuilt("run.py's main() did not call run(model_fn, train_data_fn, eval_data_fn, defaults): "
                       "the model was not built", "run.py")
    return handed["fns"]


@contextlib.contextmanager
def phase(stage: str, what: str, folder: str):
    """Any error of the user's code in this phase becomes NotBuilt at the user's line, in ``stage``."""
    try:
        with quiet():
            yield
    except NotBuilt:
        raise
    except UserError as e:
        raise NotBuilt(f"{what}: {e}", stage=stage, finding=True) from None
    except Exception as e:  # noqa: BLE001 - the user's model or data code failed: say where
        path, line = user_frame(e, folder)
        raise NotBuilt(f"{what}: {one_line(e)}", path, line, finding=True, stage=stage) from None


def folder_graph(folder: str, framework: str, params_path: str, overrides: list[str]):
    """The device IR of the folder's training step, built from ``params_path``, and its params."""
    from common.cli import effective_params, parse_command_line

    model_fn, train_data_fn, _, defaults_fn = handed_callables(folder)
    args = parse_command_line(["--validate_only", "--params", params_path, *overrides])
    with phase("params", "loading the params", folder):
        params = effective_params(args, defaults_fn, folder, framework, **({"mode": "train"} if framework == "tf"
                                                                            else {}))
    if framework == "pytorch":
        return _torch_folder_graph(folder, params, model_fn, train_data_fn), params
    return _tf_folder_graph(folder, params, model_fn, train_data_fn), params


def _torch_folder_graph(folder, params, model_fn, train_data_fn):
    import torch

    from common.pytorch.base_model import PyTorchBaseModel
    from common.pytorch.device_run import capture_step, first_batch, mark_dynamic_batch
    from common.pytorch.run import seed_everything

    seed = params["runconfig"]["seed"]
    seed_everything(seed)
    with phase("data", "the training DataLoader", folder):
        loader = train_data_fn(params)
        batch = first_batch(loader, seed)
    with phase("model", "model_fn", folder):
        model = model_fn(params, torch.device("cpu"))
    if not isinstance(model, PyTorchBaseModel):
        raise NotBuilt(f"model_fn returns a {type(model).__name__}, not a PyTorchBaseModel: the runner "
                       "needs one, whose __call__(batch) returns the loss", finding=True)
    with phase("model", "capturing the training step", folder):
        captured = capture_step(model, batch, True, params)
    # capture_step gives the graph, or (graph, the eval metric calls it feeds) since the vendor metrics
    graph = captured[0] if isinstance(captured, tuple) else captured
    return mark_dynamic_batch(graph, loader)


def _tf_folder_graph(folder, params, model_fn, train_input_fn):
    from common.tf import device_run
    from common.tf.estimator import CerebrasEstimator, ModeKeys, RunConfig

    estimator = CerebrasEstimator(model_fn, config=RunConfig.from_params(params), params=params)
    with phase("model", "building the TRAIN graph (input_fn, then model_fn)", folder):
        run = estimator.open_session(train_input_fn, ModeKeys.TRAIN, mixed_policy=False)
    try:
        with phase("model", "capturing the training graph", folder):
            return device_run.capture(estimator, run)
    finally:
        run.close()
