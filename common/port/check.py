"""``zoo port check PATH``: what stands between a user's code and the wafer, in fix order.

PATH is a folder in the zoo's structure (one with run.py, configs/ or utils.py, or model.py
and data.py), a plain PyTorch or TF/Keras training script, or a folder of plain scripts
(an HF-style module and its train.py). The check reads the code (common.port.static), checks
a zoo folder's contract and params (common.port.folder), then builds the model where it
can and hands its training step to the device compiler (common.port.capture,
common.port.script). It prints every finding with its file:line and the change to make,
in the order to make them, then notes: what it could not determine, and the compile
estimate.

Exit status: 0 ready (no findings), 1 findings, 2 the input could not be read, 3 the check
itself failed (one line naming the error and the check's own file and line, no traceback).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import sys
from dataclasses import dataclass, field

from common.port.findings import (CHECK_FAILED, FINDINGS, READY, STAGES, UNREADABLE, Finding, Note, Unreadable,
                                  ordered)
from common.port.source import Source

FRAMEWORK_NAMES = {"pytorch": "PyTorch", "tf": "TensorFlow/Keras"}
_SKIP_DIRS = {"__pycache__", ".git", ".venv", "venv", "model_dir", "data", ".ipynb_checkpoints"}


@dataclass
class Report:
    target: str
    what: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    built: list[str] = field(default_factory=list)  # how the model was built, fact by fact

    @property
    def status(self) -> int:
        return FINDINGS if self.findings else READY

    def kinds(self) -> list[tuple[str, str, int]]:
        """(kind, file, line) of every finding: what tests compare."""
        return [(f.kind, f.file, f.line) for f in self.findings]


def python_files(folder: str) -> list[str]:
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        found += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
    return found


def framework_of(sources: list[Source]) -> str:
    """PyTorch or TF, by what the files import (the file that defines a model decides a tie)."""
    torch = [s for s in sources if s.imports("torch", "torchvision")]
    tf = [s for s in sources if s.imports("tensorflow", "keras", "tensorflow_datasets", "tf_keras")]
    run = next((s for s in sources if os.path.basename(s.path) == "run.py"), None)
    if run is not None and run.imports("common"):
        for module in run.aliases.values():
            if module.startswith("common.pytorch"):
                return "pytorch"
            if module.startswith("common.tf"):
                return "tf"
    if torch and not tf:
        return "pytorch"
    if tf and not torch:
        return "tf"
    if not torch and not tf:
        raise Unreadable("imports neither torch nor tensorflow/keras: not a PyTorch or TF training script")
    model = [s for s in sources if os.path.basename(s.path) == "model.py"] or sources
    return "pytorch" if any(s.imports("torch") for s in model) else "tf"


def check(path: str, *, capture: bool = True, params: str | None = None, profile: str | None = None,
          overrides: tuple[str, ...] = ()) -> Report:
    """The report of ``zoo port check`` for ``path``; raises Unreadable (exit 2)."""
    if not os.path.exists(path):
        raise Unreadable(f"{path}: no such file or folder")
    path = os.path.abspath(path)
    redirected = None
    if os.path.isfile(path) and os.path.basename(path) in ("model.py", "data.py", "utils.py", "run.py") and \
            _looks_like_zoo_folder(os.path.dirname(path)):
        # one file of a zoo folder means little alone (its model_fn needs the folder's data and params)
        redirected, path = os.path.basename(path), os.path.dirname(path)
    if os.path.isfile(path):
        if not path.endswith(".py"):
            raise Unreadable(f"{path}: not a Python file (give a .py script or a folder)")
        root, files = os.path.dirname(path), [path]
    else:
        root, files = path, python_files(path)
        if not files:
            raise Unreadable(f"{path}: no Python files in this folder")
    sources = [Source.read(f, os.path.relpath(f, root)) for f in files]
    framework = framework_of(sources)
    zoo = os.path.isdir(path) and _looks_like_zoo_folder(path)
    shown_target = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else path
    what = (f"a {FRAMEWORK_NAMES[framework]} folder in the zoo's structure" if zoo else
            f"plain {FRAMEWORK_NAMES[framework]} code: {', '.join(s.shown for s in sources)}")
    report = Report(shown_target, what)

    def shown(file: str) -> str:
        if not file:
            return ""
        real = os.path.realpath(file)
        relative = os.path.relpath(real, os.path.realpath(root))
        return relative if not relative.startswith("..") else file

    if redirected:
        report.notes.append(Note("", 0, f"{redirected} is part of a zoo folder: the whole folder was checked"))
    if zoo:
        _check_folder(report, root, sources, framework, shown, capture, params, profile, list(overrides))
    else:
        _check_plain(report, root, sources, framework, shown, capture, profile)
    report.findings = _without_echoes(ordered(report.findings))
    return report


def _looks_like_zoo_folder(folder: str) -> bool:
    from common.port.folder import looks_like_zoo_folder

    return looks_like_zoo_folder(folder)


def _without_echoes(findings: list[Finding]) -> list[Finding]:
    """The compiler's view of what the reader found at its source: a partial last batch reported
    where it is made (drop_last) echoes in the graph as a dynamic input; a float64 model the reader
    found at .double() echoes in every weight, at no line of the user's. Each is one finding."""
    read_kinds = {f.kind for f in findings if f.by == "read"}
    drop_last = "no_drop_last" in read_kinds
    return [f for f in findings if not (f.by == "capture" and (
        drop_last and f.kind == "dynamic_shape" and "drop_last" in f.message or
        not f.file and f.kind in read_kinds))]


def _framework_available(framework: str) -> bool:
    return importlib.util.find_spec("torch" if framework == "pytorch" else "tensorflow") is not None


def _check_folder(report: Report, folder: str, sources: list[Source], framework: str, shown, capture: bool,
                  params_path: str | None, profile: str | None, overrides: list[str]) -> None:
    from common.folder import import_beside
    from common.port import folder as zoo_folder
    from common.port.params_reads import ParamsReads
    from common.port.static import Reader

    by_name = {s.shown: s for s in sources}
    findings, handover = zoo_folder.contract_findings(folder, by_name, framework)
    report.findings += findings
    defaults_name = handover.fns[3][1] if len(handover.fns) > 3 else next(
        (n for n in ("default_params", "set_defaults") if "utils.py" in by_name and
         zoo_folder.defines(by_name["utils.py"], n)), None)
    configs, form = [], "zoo"
    if "utils.py" in by_name and defaults_name and zoo_folder.defines(by_name["utils.py"], defaults_name):
        from common.params import defaults_form

        try:
            utils = import_beside(os.path.join(folder, "utils.py"), "utils")
            defaults_fn = getattr(utils, defaults_name)
            form = defaults_form(defaults_fn)
            configs, params_findings = zoo_folder.load_configs(folder, defaults_fn, framework, shown)
            report.findings += params_findings
        except Exception as e:  # noqa: BLE001 - importing the user's utils.py
            from common.port.capture import one_line, user_frame

            file, line = user_frame(e, folder)
            report.findings.append(Finding("port", "import_failed", shown(file) or "utils.py", line,
                                           f"importing utils.py failed: {one_line(e)}", "fix the import error"))
    reads = ParamsReads(sources)
    report.findings += zoo_folder.missing_reads(reads, configs, form)
    values = zoo_folder.drop_last_values(reads, configs, "utils.py")
    reader = Reader(sources, framework, zoo=True,
                    params_values=lambda src, node: [(v, shown(f), l) for v, f, l in values(src, node)])
    found, notes = reader.read()
    report.findings += found
    report.notes += notes
    report.findings += _own_loops(reader)
    report.notes += zoo_folder.notes_for_the_zoo(folder)
    if not capture:
        report.notes.append(Note("", 0, "the model was read, not built (--no-capture)"))
        return
    blocking = [f for f in report.findings if f.stage in ("port", "params")]
    if blocking:
        report.notes.append(Note("", 0, "the model was not built: fix the Port and Params findings first"))
        return
    if not _framework_available(framework):
        report.notes.append(Note("", 0, f"{FRAMEWORK_NAMES[framework]} is not installed here: the model was read, "
                                        "not built"))
        return
    config = params_path or os.path.join(folder, "configs", "params.yaml")
    _build(report, folder, shown, lambda: _folder_graph(folder, framework, config, overrides), profile, "params")


def _folder_graph(folder, framework, config, overrides):
    from common.port.capture import folder_graph

    graph, params = folder_graph(folder, framework, config, overrides)
    device = params["device"]
    given = f" with {' '.join(overrides)}" if overrides else ""
    return graph, device["profile"], device["execution_mode"], [
        f"built as run.py does, from {os.path.relpath(config, folder)}{given}"]


def _own_loops(reader) -> list[Finding]:
    """Code of a zoo folder that trains itself: the runner owns the loop."""
    import ast

    found = []
    for node, region in reader.marks.items():
        if region == "train" and isinstance(node, (ast.For, ast.While)):
            src = next(s for s in reader.sources if node in s.parents)
            found.append(Finding("port", "own_training_loop", src.shown, node.lineno,
                                 "a training loop in the folder's code: the runner owns the loop",
                                 "drop it: run.py hands model_fn and the data functions to the runner"))
    return found


# what to do when building the model the way the runner does fails, by where it failed
BUILD_FIXES = {
    "port": "the runner stops at the same place: fix it there",
    "params": "the runner stops at the same place: fix the config (zoo config check FILE)",
    "data": ("the runner stops at the same place: prepare the data where the config's data_dir points (zoo prepare), "
             "or check against the data you have: zoo port check PATH train_input.data_dir=DIR"),
    "model": "the runner stops at the same place: fix the model code there",
}


def _check_plain(report: Report, root: str, sources: list[Source], framework: str, shown, capture: bool,
                 profile: str | None) -> None:
    from common.port.static import Reader, plain_script_findings

    reader = Reader(sources, framework, zoo=False)
    found, notes = reader.read()
    report.findings += found + plain_script_findings(reader)
    report.notes += notes
    if not capture:
        report.notes.append(Note("", 0, "the model was read, not built (--no-capture)"))
        return
    if not _framework_available(framework):
        report.notes.append(Note("", 0, f"{FRAMEWORK_NAMES[framework]} is not installed here: the model was read, "
                                        "not built"))
        return

    def graph():
        from common.port import script

        built = script.build_torch(reader, root) if framework == "pytorch" else script.build_keras(reader, root)
        return built.graph, "wse2", "pipelined", built.said

    _build(report, root, shown, graph, profile, "the port's params")


def _build(report: Report, root: str, shown, make_graph, profile: str | None, where_set: str) -> None:
    from common.port.capture import NotBuilt, device_verdict

    try:
        graph, params_profile, execution_mode, said = make_graph()
    except NotBuilt as e:
        if e.finding:
            report.findings.append(Finding(e.stage, "build_failed", shown(e.file), e.line, str(e), BUILD_FIXES[e.stage]))
        else:
            report.notes.append(Note(shown(e.file), e.line, str(e)))
        return
    report.built = said
    findings, notes = device_verdict(graph, profile=profile or params_profile, execution_mode=execution_mode,
                                     shown=shown, where_set=where_set)
    # the compiler names the user's files by their absolute paths: shown relative to the checked folder
    prefix = os.path.realpath(root) + os.sep
    report.findings += [dataclasses.replace(f, message=f.message.replace(prefix, ""), fix=f.fix.replace(prefix, ""))
                        for f in findings]
    report.notes += [dataclasses.replace(n, message=n.message.replace(prefix, "")) for n in notes]


# --- the report, as printed ----------------------------------------------------------------

def render(report: Report) -> str:
    lines = [f"zoo port check {report.target}: {report.what}"]
    stage = None
    for i, f in enumerate(report.findings, 1):
        if f.stage != stage:
            stage = f.stage
            lines += ["", STAGES[stage]]
        by = "  [compiler]" if f.by == "capture" else ""
        lines.append(f"  {i}. {f.where() + ': ' if f.file else ''}{f.message}{by}")
        if f.fix:
            lines.append(f"       fix: {f.fix}")
    if report.built:
        lines += ["", "Built for the compiler: " + "; ".join(report.built)]
    if report.notes:
        lines += ["", "Notes (what the check could not determine, and what it measured)"]
        lines += [f"  - {n.where() + ': ' if n.file else ''}{n.message}" for n in report.notes]
    lines.append("")
    if report.findings:
        lines.append(f"not ready: {len(report.findings)} finding(s); fix them in the order above, then check again")
    else:
        lines.append("ready: no findings" + (" (see the notes for what was not determined)"
                                             if any("not built" in n.message or "not determined" in n.message
                                                    or "not captured" in n.message for n in report.notes) else ""))
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", metavar="PATH", help="a zoo-structured folder, a plain training script, or a folder "
                                                     "of scripts")
    parser.add_argument("--no-capture", dest="capture", action="store_false",
                        help="read the code only: do not build the model for the device compiler")
    parser.add_argument("--params", help="a zoo folder's config to build the model from "
                                         "(default: configs/params.yaml)")
    parser.add_argument("--profile", help="the device to compile for (wse1, wse2, wse3, small, tiny; default: "
                                          "the params' device.profile, or wse2)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value",
                        help="params overrides for a zoo folder's build, as run.py takes them")


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        report = check(args.path, capture=args.capture, params=args.params, profile=args.profile,
                       overrides=tuple(args.overrides))
    except Unreadable as e:
        print(f"error: {e}", file=sys.stderr)
        return UNREADABLE
    except Exception as e:  # noqa: BLE001 - a defect of the check: one line, and not exit 1 ("findings")
        print(f"error: {internal_error(e, args.path)}", file=sys.stderr)
        return CHECK_FAILED
    sys.stdout.write(render(report))
    return report.status


def internal_error(error: Exception, path: str) -> str:
    """What a failure of the check's own code says: the error and the innermost line of the zoo's
    code it came from, so that it can be reported; nothing about the user's code is claimed."""
    import traceback

    from common.port.capture import one_line

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    zoo_code = tuple(os.path.join(root, d) + os.sep for d in ("common", "device", "zoo_base"))
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(zoo_code)]
    where = f" at {os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno}" if frames else ""
    return (f"zoo port check {path} stopped on an error of its own{where} ({one_line(error)}), not a finding "
            "about your code; please report it with the file checked (--no-capture reads the code without "
            "building the model)")
