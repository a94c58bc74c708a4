"""A folder in the zoo's structure: the contract's pieces, and its params.

The pieces a runner needs (README.md, "Start your own model"; the vendor's contract,
shared/reference/cerebras-api.md):

    run.py              run(model_fn, train_data_fn, eval_data_fn, default_params_fn)
    model.py            PyTorch: model_fn(params, device) -> a PyTorchBaseModel
                        TF: model_fn(features, labels, mode, params) -> EstimatorSpec
    data.py             PyTorch: get_train_dataloader(params), get_eval_dataloader(params)
                        TF: input_fn(params, mode) -> tf.data.Dataset (train and eval)
    utils.py            default_params() -> dict, or the vendor's set_defaults(params)
    configs/params.yaml the run's settings

Each missing piece is a finding at run.py's line that names it. Every config in configs/
is loaded against the folder's defaults through ``common.params`` (the runner's own
path), and every key the code certainly reads must be in the result.
"""

from __future__ import annotations

import ast
import glob
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from common.errors import UserError
from common.port.findings import Finding, Note
from common.port.params_reads import MISSING, ParamsReads, lookup
from common.port.source import Source

PIECES = ("model.py", "data.py", "utils.py", "configs/params.yaml", "run.py")
# run()'s arguments in order, the names the contract gives them, and the module each lives in
ROLES = {
    "pytorch": (("model_fn", "model"), ("get_train_dataloader", "data"), ("get_eval_dataloader", "data"),
                ("default_params", "utils")),
    "tf": (("model_fn", "model"), ("train_input_fn", "data"), ("eval_input_fn", "data"),
           ("default_params", "utils")),
}
ROLE_WORDS = ("the model function", "the training data function", "the eval data function", "the defaults function")
_WHERE = re.compile(r"^(?P<path>.+?):(?P<line>\d+): (?P<rest>.*)$")


def looks_like_zoo_folder(folder: str) -> bool:
    """A folder a user has started to shape as a zoo folder (any of its pieces present)."""
    return any(os.path.exists(os.path.join(folder, p)) for p in ("run.py", "configs", "utils.py")) or (
        os.path.isfile(os.path.join(folder, "model.py")) and os.path.isfile(os.path.join(folder, "data.py")))


@dataclass
class Handover:
    """What run.py hands the runner: (module, function name, line) per role."""

    framework: str | None = None
    line: int = 0
    fns: list[tuple[str, str, int]] = field(default_factory=list)


def read_handover(run: Source | None) -> Handover:
    handover = Handover()
    if run is None:
        return handover
    modules: dict[str, str] = {}
    for node in ast.walk(run.tree):  # model, data, utils = import_beside(__file__, "model", "data", "utils")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                (run.call_name(node.value).endswith("import_beside")):
            names = [a.value for a in node.value.args[1:] if isinstance(a, ast.Constant)]
            targets = node.targets[0].elts if isinstance(node.targets[0], ast.Tuple) else node.targets
            modules.update({t.id: n for t, n in zip(targets, names) if isinstance(t, ast.Name)})
    for name, module in run.aliases.items():  # from model import model_fn / import model
        if not module.startswith(("common.", "torch", "tensorflow", "keras")):
            modules.setdefault(name, module.lstrip(".").split(".")[0])
    for call in run.calls():
        name = run.call_name(call)
        if name in ("common.pytorch.run.run", "common.tf.run.run"):
            handover.framework = "pytorch" if ".pytorch." in name else "tf"
            handover.line = call.lineno
            for arg in call.args[:4]:
                if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name):
                    handover.fns.append((modules.get(arg.value.id, arg.value.id), arg.attr, arg.lineno))
                elif isinstance(arg, ast.Name):
                    module = run.aliases.get(arg.id, "")
                    handover.fns.append((module.lstrip(".").split(".")[0] or "run", arg.id, arg.lineno))
            break
    return handover


def defines(src: Source, name: str) -> ast.AST | None:
    """The top-level statement that defines ``name`` in ``src`` (def, class, assignment, import)."""
    for node in src.tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return node
    return None


def contract_findings(folder: str, sources: dict[str, Source], framework: str) -> tuple[list[Finding], Handover]:
    """The pieces run.py, model.py, data.py, utils.py and configs/params.yaml, and what they define."""
    findings = []
    template = f"{framework}/mnist"
    for piece in PIECES:
        if not os.path.exists(os.path.join(folder, piece)):
            findings.append(Finding("port", "missing_file", piece, 0, f"{piece} is missing",
                                    f"copy {template}/{piece} (zoo new <name> --from {template} makes the whole "
                                    "skeleton) and fill it in"))
    run = sources.get("run.py")
    handover = read_handover(run)
    if run is not None and handover.framework is None:
        findings.append(Finding("port", "no_runner", "run.py", 0,
                                "run.py does not hand the model to the runner (common.pytorch.run.run or "
                                "common.tf.run.run)", f"copy {template}/run.py: a few lines calling run()"))
    expected = ROLES[framework]
    handed = handover.fns or [(module, name, 0) for name, module in expected]
    for i, (module, name, line) in enumerate(handed[:4]):
        src = sources.get(f"{module}.py")
        if src is None:
            continue  # the missing file is its own finding
        node = defines(src, name)
        role = ROLE_WORDS[i]
        if node is None:
            findings.append(Finding("port", "missing_function", "run.py" if line else src.shown, line,
                                    f"{role} {module}.{name} is not defined in {module}.py",
                                    _define_fix(framework, i, name, module)))
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            findings += _signature(framework, i, src, node)
    if framework == "pytorch" and "model.py" in sources:
        model = sources["model.py"]
        bases = {(model.qualname(b) or "").rsplit(".", 1)[-1] for n in ast.walk(model.tree)
                 if isinstance(n, ast.ClassDef) for b in n.bases}
        if "PyTorchBaseModel" not in bases:
            fn = defines(model, handed[0][1]) if handed else None
            findings.append(Finding("port", "no_base_model", "model.py", getattr(fn, "lineno", 0),
                                    "model.py has no PyTorchBaseModel: the runner trains one, whose __call__(batch) "
                                    "returns the loss",
                                    "class MyModel(PyTorchBaseModel) holding your nn.Module, as pytorch/mnist's "
                                    "MnistModel; model_fn returns it"))
    return findings, handover


def _define_fix(framework: str, role: int, name: str, module: str) -> str:
    signature = {
        ("pytorch", 0): f"def {name}(params, device): return a PyTorchBaseModel",
        ("pytorch", 1): f"def {name}(params): return a DataLoader built from params['train_input']",
        ("pytorch", 2): f"def {name}(params): return a DataLoader built from params['eval_input']",
        ("tf", 0): f"def {name}(features, labels, mode, params): return an EstimatorSpec",
        ("tf", 1): f"def {name}(params, mode): return a tf.data.Dataset of (features, labels)",
        ("tf", 2): f"def {name}(params, mode): return a tf.data.Dataset of (features, labels)",
    }.get((framework, role), f"def {name}(): return a dict of every key with its default (or the vendor's "
                             f"set_defaults(params))")
    return f"in {module}.py: {signature}, as {framework}/mnist/{module}.py does"


def _signature(framework: str, role: int, src: Source, fn: ast.FunctionDef) -> list[Finding]:
    args = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    flexible = fn.args.vararg is not None
    wanted = {("pytorch", 0): 2, ("tf", 0): 4, ("pytorch", 1): 1, ("pytorch", 2): 1}.get((framework, role))
    if wanted is None or flexible or len(args) - len(fn.args.defaults) <= wanted <= len(args):
        return []
    shape = {("pytorch", 0): "(params, device)", ("tf", 0): "(features, labels, mode, params)"}.get(
        (framework, role), "(params)")
    return [Finding("port", "signature", src.shown, fn.lineno,
                    f"{fn.name}({', '.join(args)}): the runner calls it as {fn.name}{shape}",
                    f"def {fn.name}{shape}")]


# --- params ---------------------------------------------------------------------------

@dataclass
class Config:
    path: str
    shown: str
    params: dict | None  # None: did not load
    where: dict  # key path -> "file:line" of the file (and its base files)


def load_configs(folder: str, defaults_fn, framework: str, shown) -> tuple[list[Config], list[Finding]]:
    """Every configs/*.yaml loaded against the folder's defaults, as the runner loads it."""
    from common.cli import default_model_dir
    from common.params import defaults_form, load_params, load_vendor_params, read_params_file, thaw

    configs, findings = [], []
    for path in sorted(glob.glob(os.path.join(folder, "configs", "*.yaml"))):
        try:
            model_dir = default_model_dir(framework, folder, path)
            if defaults_form(defaults_fn) == "vendor":
                params = thaw(load_vendor_params(path, defaults_fn, mode="train", model_dir=model_dir))
            else:
                params = thaw(load_params(path, defaults_fn(), model_dir=model_dir))
            where = read_params_file(path)[1]
        except UserError as e:
            findings.append(params_finding(str(e), shown, path))
            configs.append(Config(path, shown(path), None, {}))
            continue
        except Exception as e:  # noqa: BLE001 - set_defaults is the user's code
            findings.append(Finding("params", "params_invalid", shown(path), 0,
                                    f"the defaults function failed on this config: {type(e).__name__}: {e}",
                                    "make set_defaults fill what the config leaves out"))
            configs.append(Config(path, shown(path), None, {}))
            continue
        configs.append(Config(path, shown(path), params, where))
    return configs, findings


def params_finding(message: str, shown, path: str) -> Finding:
    """A UserError of common.params (``file:line: what``) as a finding at that place."""
    match = _WHERE.match(message)
    if match:
        return Finding("params", "params_invalid", shown(match["path"]), int(match["line"]), match["rest"],
                       "change the key or value as the message says (zoo config check FILE tells the same)")
    file, _, rest = message.partition(": ")
    return Finding("params", "params_invalid", shown(file) if rest else shown(path), 0, rest or message,
                   "change the key or value as the message says (zoo config check FILE tells the same)")


def missing_reads(reads: ParamsReads, configs: list[Config], form: str) -> list[Finding]:
    """Keys the code certainly reads that a config that loaded does not hold."""
    findings, seen = [], set()
    loaded = [c for c in configs if c.params is not None]
    for read in sorted(reads.reads, key=lambda r: (r.src.shown, r.node.lineno, -len(r.path))):
        if not read.required or read.path[:1] == ("runconfig",) and len(read.path) == 1:
            continue
        # a section the config switches off (rope_scaling: null) is read only behind its own check
        lacking = [c.shown for c in loaded if lookup(c.params, read.path) is MISSING
                   and isinstance(lookup(c.params, read.path[:-1]), Mapping)]
        key = ".".join(read.path)
        if not lacking or (read.src.shown, read.node.lineno) in seen:
            continue
        seen.add((read.src.shown, read.node.lineno))
        section, leaf = ".".join(read.path[:-1]), read.path[-1]
        if form == "vendor":
            fix = (f"add {leaf} under {section}: in the config, or params[{section!r}].setdefault({leaf!r}, ...) in "
                   "set_defaults")
        else:
            fix = f"add {leaf!r} to the {section!r} section of default_params() in utils.py, with its default"
        defaults = "set_defaults" if form == "vendor" else "default_params()"
        findings.append(Finding("params", "params_missing", read.src.shown, read.node.lineno,
                                f"reads {key}, which neither {' nor '.join(lacking)} nor {defaults} holds", fix))
    return findings


def drop_last_values(reads: ParamsReads, configs: list[Config], shown_utils: str):
    """For the reader: the values a ``drop_last=input_params["drop_last"]`` takes in each config."""

    def values(src: Source, node: ast.AST) -> list[tuple[object, str, int]]:
        found = []
        for path in reads.paths_of(src, node):
            for config in configs:
                if config.params is None:
                    continue
                value = lookup(config.params, path)
                if value is MISSING:
                    continue
                where = config.where.get(path)
                if where:
                    file, _, line = where.rpartition(":")
                    found.append((value, file, int(line)))
                else:
                    found.append((value, shown_utils, 0))
        return found

    return values


def notes_for_the_zoo(folder: str) -> list[Note]:
    """What a folder needs to join the zoo's own runs (tox), beyond the contract."""
    missing = [f for f in ("configs/params_tiny.yaml", "README.md") if not os.path.exists(os.path.join(folder, f))]
    if not missing:
        return []
    return [Note("", 0, f"to join the zoo's tox runs the folder also needs {' and '.join(missing)} "
                        "(a few steps in seconds; what the model is and the command that trains it)")]
