"""Build a plain script's model without running the script.

Of the script (and of the sibling modules it imports from its folder) only the imports,
the definitions (functions, classes) and the top-level settings whose values need no call
beyond a small safe list are executed; everything else, the data loading and the
training loop included, is skipped. Then the model's construction (``model = Net(args.hidden)``,
``model = keras.Sequential([...])``) is evaluated as a slice: each name it uses is taken
from its latest assignment before that line, in the same function or the module,
evaluated the same way; argparse's ``args`` are the defaults of its add_argument calls.
A slice may call the frameworks' layer and tensor constructors and the user's own
classes and functions (not a data function); anything else (a download, a file read,
``len(tokenizer)``) stops it, and the check says which name it could not determine.

The fake batch is shaped from the script's data code where that can be read (a
torchvision data set and its transforms, a TensorDataset of torch.randn, Keras' data sets,
a Keras Input), or from the model itself (its first Linear layer, a Keras model's input
shape, a token model's block size), and the loss from the training code (a criterion or
functional loss applied to the model's output, or a model that returns its loss). What
could not be found is said in a note; nothing is guessed.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import contextlib
import importlib.abc
import importlib.util
import os
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from common.port.capture import NotBuilt, one_line, quiet
from common.port.source import NOT_LITERAL, Source, keyword, literal
from common.port.static import Construction, Reader, assignment_targets, find_construction

# builtins a setting or a model's construction may call
SAFE_BUILTINS = {"int", "float", "str", "bool", "dict", "list", "tuple", "set", "frozenset", "range", "len", "min",
                 "max", "abs", "round", "sum", "sorted", "enumerate", "zip", "getattr", "isinstance", "print",
                 "super", "type", "vars", "reversed", "map", "any", "all", "divmod", "pow"}
# library calls a setting or a model's construction may make (qualified names, by prefix)
SAFE_PREFIXES = ("os.path.", "math.", "torch.device", "os.environ.get", "os.getenv", "dataclasses.", "typing.",
                 "torch.nn.", "torchvision.models.", "keras.", "torch.tensor", "torch.zeros", "torch.ones",
                 "torch.randn", "torch.rand", "torch.arange", "torch.tril", "torch.triu", "torch.full", "torch.empty",
                 "torch.cuda.is_available", "torch.backends.", "functools.partial", "collections.",
                 "tensorflow.constant", "tensorflow.ones", "tensorflow.zeros", "tensorflow.nn.", "tensorflow.math.",
                 "tensorflow.initializers.", "tensorflow.keras", "torch.float", "torch.manual_seed", "transformers.",
                 "numpy.sqrt", "numpy.prod")
UNSAFE_PREFIXES = ("keras.datasets.", "keras.utils.get_file", "keras.models.load_model", "keras.utils.image_dataset",
                   "keras.utils.text_dataset", "keras.preprocessing.")
# method calls that read data or the network, wherever the object came from
UNSAFE_METHODS = {"from_pretrained", "load", "load_state_dict", "download", "read", "open", "fetch", "load_data",
                  "fit", "train", "backward", "step", "cuda"}
# attributes a token model keeps its longest sequence in (the length of a fake batch)
SEQUENCE_ATTRIBUTES = ("block_size", "max_seq_len", "max_seq_length", "seq_len", "max_len", "context_length",
                       "n_ctx", "max_position_embeddings", "max_length", "sequence_length")
# methods that read an object without changing it
PURE_METHODS = {"get", "keys", "items", "values", "copy", "index", "count", "__len__", "to_dict", "size", "dim"}
# torchvision data sets: (channels, height, width) of one image as the data set gives it
TORCHVISION_SHAPES = {"MNIST": (1, 28, 28), "FashionMNIST": (1, 28, 28), "KMNIST": (1, 28, 28), "QMNIST": (1, 28, 28),
                      "EMNIST": (1, 28, 28), "CIFAR10": (3, 32, 32), "CIFAR100": (3, 32, 32), "SVHN": (3, 32, 32),
                      "STL10": (3, 96, 96)}
# Keras' and tfds' data sets: one example's shape (before the script's own reshaping)
KERAS_SHAPES = {"mnist": (28, 28), "fashion_mnist": (28, 28), "cifar10": (32, 32, 3), "cifar100": (32, 32, 3)}
TFDS_SHAPES = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3), "cifar100": (32, 32, 3)}
# losses the training code may apply to (model output, labels), and the labels each takes
CLASS_LOSSES = {"cross_entropy", "nll_loss", "CrossEntropyLoss", "NLLLoss", "sparse_categorical_crossentropy",
                "SparseCategoricalCrossentropy"}
REGRESSION_LOSSES = {"mse_loss", "l1_loss", "smooth_l1_loss", "MSELoss", "L1Loss", "SmoothL1Loss", "mse",
                     "mean_squared_error", "MeanSquaredError", "mae", "mean_absolute_error", "MeanAbsoluteError",
                     "binary_cross_entropy_with_logits", "BCEWithLogitsLoss"}


class Undetermined(Exception):
    """What the slice could not evaluate, in the user's terms."""


class Missing:
    """A module the script imports that is not installed here: using it is Undetermined."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr):
        raise Undetermined(f"{object.__getattribute__(self, '_name')} is not installed here")

    def __call__(self, *args, **kwargs):
        raise Undetermined(f"{object.__getattribute__(self, '_name')} is not installed here")

    def __mro_entries__(self, bases):
        raise Undetermined(f"{object.__getattribute__(self, '_name')} is not installed here")


# --- the definitions of the script and its sibling modules ------------------------------

def _safe_call(src: Source, call: ast.Call, user_names: set[str]) -> bool:
    name = src.call_name(call)
    if isinstance(call.func, ast.Name) and (call.func.id in SAFE_BUILTINS or call.func.id in user_names):
        return True
    return name.startswith(SAFE_PREFIXES) and not name.startswith(UNSAFE_PREFIXES)


def _settings_statement(src: Source, stmt: ast.stmt, user_names: set[str]) -> bool:
    """A top-level assignment whose value needs no call beyond the safe ones (``BATCH = 64``)."""
    if not isinstance(stmt, (ast.Assign, ast.AnnAssign)) or stmt.value is None:
        return False
    return all(_safe_call(src, c, user_names) and not _model_call(src, c) for c in src.calls(stmt.value))


def _model_call(src: Source, call: ast.Call) -> bool:
    """Constructing layers at import time belongs to the model's slice, built later in its graph."""
    return src.call_name(call).startswith(("keras.", "torch.nn."))


def _is_main_guard(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.If) and "__name__" in ast.unparse(stmt.test)


class _Loader(importlib.abc.Loader):
    def __init__(self, runner: "Definitions", path: str):
        self.runner, self.path = runner, path

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        self.runner.execute(self.path, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Modules of the script's folder load as definitions only, like the script."""

    def __init__(self, runner: "Definitions"):
        self.runner = runner

    def find_spec(self, name, path=None, target=None):
        base = os.path.join(self.runner.folder, *name.split("."))
        for candidate, package in ((base + ".py", False), (os.path.join(base, "__init__.py"), True)):
            if os.path.isfile(candidate):
                spec = importlib.util.spec_from_file_location(
                    name, candidate, loader=_Loader(self.runner, candidate),
                    submodule_search_locations=[base] if package else None)
                return spec
        return None


class Definitions:
    """Executes the definitions of the user's files; remembers what it had to skip."""

    def __init__(self, folder: str, sources: dict[str, Source]):
        self.folder = os.path.realpath(folder)
        self.sources = sources  # by absolute path
        self.missing: set[str] = set()
        self.skipped: list[str] = []
        self.modules: dict[str, types.ModuleType] = {}

    @contextlib.contextmanager
    def installed(self):
        """The folder's modules importable (as definitions) while building; sys.modules restored after."""
        finder = _Finder(self)
        before = set(sys.modules)
        sys.meta_path.insert(0, finder)
        try:
            yield
        finally:
            sys.meta_path.remove(finder)
            for name in set(sys.modules) - before:
                module = sys.modules.get(name)
                if os.path.realpath(getattr(module, "__file__", "") or "").startswith(self.folder + os.sep):
                    del sys.modules[name]

    def module_of(self, src: Source) -> types.ModuleType:
        if src.path not in self.modules:
            module = types.ModuleType(f"zoo_port_{abs(hash(src.path))}")
            module.__file__ = src.path
            self.execute(src.path, module)
        return self.modules[src.path]

    def execute(self, path: str, module: types.ModuleType) -> None:
        real = os.path.realpath(path)
        src = self.sources.get(real) or Source.read(real, os.path.relpath(real, self.folder))
        self.sources[real] = src
        self.modules[real] = module
        user_names: set[str] = set()
        for stmt in src.tree.body:
            if _is_main_guard(stmt):
                continue
            if isinstance(stmt, (ast.Import, ast.ImportFrom)):
                self._import(src, stmt, module)
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                user_names.add(stmt.name)
            elif isinstance(stmt, ast.Try) and all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in stmt.body):
                for s in stmt.body:
                    self._import(src, s, module)
                continue
            elif not _settings_statement(src, stmt, user_names) and not (
                    isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            try:
                exec(compile(ast.Module([stmt], []), src.path, "exec"), module.__dict__)
            except Undetermined as e:
                self.skipped.append(f"{src.shown}:{stmt.lineno}: {e}")
            except Exception as e:  # noqa: BLE001 - a definition failing is the user's: noted, then skipped
                self.skipped.append(f"{src.shown}:{stmt.lineno}: {one_line(e)}")

    def _import(self, src: Source, stmt: ast.stmt, module: types.ModuleType) -> None:
        try:
            exec(compile(ast.Module([stmt], []), src.path, "exec"), module.__dict__)
        except ImportError as e:
            name = getattr(e, "name", None) or ast.unparse(stmt)
            self.missing.add(name.split(".")[0])
            for alias in stmt.names:
                module.__dict__[alias.asname or alias.name.split(".")[0]] = Missing(name)


# --- the model's slice ---------------------------------------------------------------------

def argparse_defaults(src: Source) -> argparse.Namespace | None:
    """The namespace ``parser.parse_args()`` would give with no arguments, from add_argument's defaults."""
    values: dict[str, Any] = {}
    for call in src.calls():
        if src.call_name(call) != ".add_argument" or not call.args:
            continue
        flags = [literal(a) for a in call.args if isinstance(literal(a), str)]
        if not flags:
            continue
        dest = literal(keyword(call, "dest")) or next((f for f in flags if f.startswith("--")), flags[0])
        dest = dest.lstrip("-").replace("-", "_")
        action = literal(keyword(call, "action"))
        default = literal(keyword(call, "default"), NOT_LITERAL)
        if default is NOT_LITERAL:
            default = False if action == "store_true" else True if action == "store_false" else None
        values[dest] = default
    return argparse.Namespace(**values) if values else None


@dataclass
class Slice:
    """Evaluates expressions of one file at one line, each name from its latest assignment."""

    src: Source
    module: types.ModuleType
    reader: Reader
    args: argparse.Namespace | None = None
    cache: dict[int, Any] = field(default_factory=dict)
    depth: int = 0

    def value(self, expr: ast.AST, line: int) -> Any:
        scope = self.src.enclosing(expr, ast.FunctionDef, ast.AsyncFunctionDef) or self.src.tree
        return self._eval(expr, scope, line)

    def _eval(self, expr: ast.AST, scope: ast.AST, line: int) -> Any:
        self._check_calls(expr)
        bound_inside = {a.arg for n in ast.walk(expr) if isinstance(n, ast.Lambda) for a in n.args.args} | {
            t.id for n in ast.walk(expr) if isinstance(n, ast.comprehension) for t in ast.walk(n.target)
            if isinstance(t, ast.Name)}
        local: dict[str, Any] = {}
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound_inside \
                    and node.id not in local and node.id not in self.module.__dict__ and not hasattr(builtins, node.id):
                local[node.id] = self._resolve(node.id, scope, line)
        for node in ast.walk(expr):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound_inside:
                value = local.get(node.id, self.module.__dict__.get(node.id))
                if isinstance(value, (dict, list, set, bytearray)):  # what data code fills (a vocabulary)
                    self._unchanged(node.id, scope, line)
        try:
            return eval(compile(ast.Expression(body=expr), self.src.path, "eval"), self.module.__dict__, local)
        except Undetermined:
            raise
        except Exception as e:  # noqa: BLE001 - the user's construction failed: say where
            raise Undetermined(f"{self.src.segment(expr)} failed: {one_line(e)}") from None

    def _check_calls(self, expr: ast.AST) -> None:
        """Only calls that build a model: layers, tensors, the user's own classes and functions."""
        for call in self.src.calls(expr):
            name, func = self.src.call_name(call), call.func
            refused = (isinstance(func, ast.Attribute) and func.attr in UNSAFE_METHODS) or name.startswith(
                UNSAFE_PREFIXES) or name.startswith("torchvision.models.") and (
                literal(keyword(call, "pretrained")) is True or
                keyword(call, "weights") is not None and literal(keyword(call, "weights"), 0) is not None)
            if not refused and isinstance(func, ast.Name):
                if func.id in self.src.aliases:
                    refused = not (name.startswith(SAFE_PREFIXES) or self._sibling(self.src.aliases[func.id]))
                elif func.id in self.module.__dict__:
                    refused = self._data_function(func.id)
                elif hasattr(builtins, func.id):
                    refused = func.id not in SAFE_BUILTINS
            elif not refused and self.src.is_imported(func):
                head = self.src.aliases[_head(func)]
                refused = not (name.startswith(SAFE_PREFIXES) or self._sibling(head))
            if refused:
                raise Undetermined(f"{self.src.segment(call)} is not model construction (data, files or the "
                                   "network), which the check does not run")

    def _sibling(self, module: str) -> bool:
        """Whether ``module`` (an import's target) is a module of the user's own folder."""
        head = module.lstrip(".").split(".")[0]
        folder = os.path.dirname(self.src.path)
        return module.startswith(".") or os.path.isfile(os.path.join(folder, head + ".py")) or \
            os.path.isfile(os.path.join(folder, head, "__init__.py"))

    def _unchanged(self, name: str, scope: ast.AST, line: int) -> None:
        """A mutable value the skipped code changes before ``line`` (a vocabulary a Dataset fills) is
        not the value the script would build with: Undetermined."""
        scopes = [scope] if scope is self.src.tree else [scope, self.src.tree]
        for s in scopes:
            bound = [n.lineno for n in _scope_statements(s) if isinstance(n, (ast.Assign, ast.AnnAssign)) and
                     n.lineno < line and any(isinstance(t, ast.Name) and t.id == name for t in assignment_targets(n))]
            start = max(bound, default=0)
            for stmt in _scope_statements(s):
                if not start < stmt.lineno < line or isinstance(stmt, (ast.If, ast.For, ast.While, ast.With,
                                                                       ast.Try)):
                    continue
                for call in self.src.calls(stmt):
                    passed = any(isinstance(a, ast.Name) and a.id == name for a in
                                 [*call.args, *(k.value for k in call.keywords)])
                    method = isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name) and \
                        call.func.value.id == name and call.func.attr not in PURE_METHODS
                    if passed or method:
                        raise Undetermined(f"{name} is changed by {self.src.segment(call)} "
                                           f"({self.src.shown}:{call.lineno}), which the check does not run")

    def _data_function(self, name: str) -> bool:
        return any(isinstance(n, ast.FunctionDef) and n.name == name and r == "data" for n, r in self.reader.marks.items())

    def _resolve(self, name: str, scope: ast.AST, line: int) -> Any:
        if self.depth > 40:
            raise Undetermined(f"{name}: too many steps back to find its value")
        assigns = [n for n in _scope_statements(scope) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
                   and n.lineno < line and any(isinstance(t, ast.Name) and t.id == name for t in assignment_targets(n))]
        if assigns:
            stmt = max(assigns, key=lambda n: n.lineno)
            if isinstance(stmt, ast.AugAssign) or stmt.value is None:
                raise Undetermined(f"{name} ({self.src.shown}:{stmt.lineno}) changes in place")
            if self.args is not None and isinstance(stmt.value, ast.Call) and \
                    isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "parse_args":
                return self.args  # argparse's defaults: the script run with no arguments
            if any(isinstance(t, (ast.Tuple, ast.List)) for t in assignment_targets(stmt)):
                raise Undetermined(f"{name} comes from {self.src.segment(stmt.value)} ({self.src.shown}:{stmt.lineno})")
            if id(stmt) not in self.cache:
                self.depth += 1
                try:
                    self.cache[id(stmt)] = self._eval(stmt.value, scope, stmt.lineno)
                finally:
                    self.depth -= 1
            return self.cache[id(stmt)]
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in [*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs]]
            if name in params:
                if self.args is not None and name in ("args", "opt", "opts", "flags", "hparams", "cfg", "config"):
                    return self.args
                raise Undetermined(f"{name} is a parameter of {scope.name}() ({self.src.shown}:{scope.lineno})")
            loops = [n for n in _scope_statements(scope) if isinstance(n, (ast.For, ast.With)) and n.lineno < line]
            if any(name in {t.id for t in ast.walk(n.target if isinstance(n, ast.For) else n) if isinstance(t, ast.Name)}
                   for n in loops):
                raise Undetermined(f"{name} is set by a loop or with-statement")
            return self._resolve(name, self.src.tree, 10**9)
        if name == "args" and self.args is not None:
            return self.args
        raise Undetermined(f"{name} has no value the check can find before {self.src.shown}:{line}")


def _head(node: ast.AST) -> str:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


def _scope_statements(scope: ast.AST):
    """Every statement of a function or module, nested blocks included, nested functions and classes not."""
    stack = list(scope.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt
        for name in ("body", "orelse", "finalbody"):
            stack.extend(getattr(stmt, name, []) or [])
        for handler in getattr(stmt, "handlers", []) or []:
            stack.extend(handler.body)


# --- finding the model, its data and its loss -------------------------------------------

@dataclass
class BatchPlan:
    """The fake batch, and where each of its facts came from (for the report)."""

    batch_size: int | None = None
    features: tuple | None = None  # one example's shape
    features_dtype: str = "float32"
    labels: str | None = None  # "class" (int64 (B,)), "tokens" (int64 like the features), "regression"
    said: list[str] = field(default_factory=list)  # where each fact came from


def plan_torch_batch(reader: Reader, construction: Construction, module, slice_of) -> BatchPlan:
    plan = BatchPlan()
    loader = next(((s, c) for s in reader.sources for c in sorted(s.calls(), key=lambda c: c.lineno)
                   if s.call_name(c) == "torch.utils.data.DataLoader"), None)
    if loader is not None:
        src, call = loader
        size = keyword(call, "batch_size", 1)
        if size is None:
            plan.batch_size, source = 1, "DataLoader's default batch_size 1"
        else:
            try:
                plan.batch_size = int(slice_of(src).value(size, call.lineno))
                source = f"batch {plan.batch_size} from {src.shown}:{call.lineno}"
            except (Undetermined, TypeError, ValueError) as e:
                source = f"batch size not determined ({e})"
        plan.said.append(source)
        dataset = keyword(call, "dataset", 0)
        plan.features, plan.features_dtype, where = _torch_dataset_shape(src, dataset, call.lineno, slice_of)
        if where:
            plan.said.append(where)
    if plan.features is None:
        first = _first_layer(module)
        if first is not None:
            kind, shape, text = first
            if kind == "unknown":
                plan.said.append(text)
                return plan
            if kind == "tokens":
                plan.features, plan.features_dtype, plan.labels = shape, "int64", None
            else:
                plan.features = shape
            plan.said.append(f"input shape {shape} from the model's first layer, {text}")
    return plan


def _torch_dataset_shape(src: Source, dataset: ast.AST | None, line: int, slice_of):
    """(shape, dtype, where) of one example of the DataLoader's data set, when it can be read."""
    if isinstance(dataset, ast.Name):
        dataset = _assigned(src, dataset, line)[0]
    if not isinstance(dataset, ast.Call):
        return None, "float32", ""
    name = src.call_name(dataset)
    leaf = name.rsplit(".", 1)[-1]
    if name.startswith("torchvision.datasets."):
        shape = TORCHVISION_SHAPES.get(leaf)
        size = _transform_size(src, keyword(dataset, "transform"), line)
        if shape is None and size is None:
            return None, "float32", f"{leaf}'s image size not determined (no Resize or crop in its transform)"
        channels, height, width = shape or (3, None, None)
        if size is not None:
            height, width = size
        return (channels, height, width), "float32", f"images {(channels, height, width)} from {leaf} " \
                                                     f"({src.shown}:{dataset.lineno})"
    if name == "torch.utils.data.TensorDataset" and dataset.args:
        first = dataset.args[0]
        dims, dtype, made = _tensor_dims(src, first, line, slice_of)
        if dims:
            return dims[1:], dtype, f"features {dims[1:]} from {made} ({src.shown}:{dataset.lineno})"
    return None, "float32", ""


def _assigned(src: Source, name: ast.Name, line: int) -> tuple[ast.AST | None, int]:
    """(value, line) of the latest ``name = value`` before ``line`` in the function that uses the
    name, else at the module's top level (which has run before any function is called); (None, 0)
    when there is none. What the data code hands on by a name is read at its assignment."""
    scope = src.enclosing(name, ast.FunctionDef, ast.AsyncFunctionDef) or src.tree
    assigns = [n for n in _scope_statements(scope) if isinstance(n, ast.Assign) and n.lineno < line and
               any(isinstance(t, ast.Name) and t.id == name.id for t in n.targets)]
    if not assigns and scope is not src.tree:
        assigns = [n for n in _scope_statements(src.tree) if isinstance(n, ast.Assign) and
                   any(isinstance(t, ast.Name) and t.id == name.id for t in n.targets)]
    if not assigns:
        return None, 0
    stmt = max(assigns, key=lambda n: n.lineno)
    return stmt.value, stmt.lineno


def _transform_size(src: Source, transform: ast.AST | None, line: int):
    if isinstance(transform, ast.Name):
        assigns = [n for n in ast.walk(src.tree) if isinstance(n, ast.Assign) and
                   any(isinstance(t, ast.Name) and t.id == transform.id for t in n.targets)]
        transform = max(assigns, key=lambda n: n.lineno).value if assigns else None
    if transform is None:
        return None
    size = None
    for call in sorted(src.calls(transform), key=lambda c: (c.lineno, c.col_offset)):
        if src.call_name(call).rsplit(".", 1)[-1] in ("Resize", "CenterCrop", "RandomResizedCrop", "RandomCrop"):
            value = literal(keyword(call, "size", 0))
            if isinstance(value, int):
                size = (value, value)
            elif isinstance(value, (tuple, list)) and len(value) == 2:
                size = tuple(value)
    return size


def _tensor_dims(src: Source, node: ast.AST, line: int, slice_of):
    """(dims, dtype, the expression that made it) of ``torch.randn(N, d, ...)``,
    ``torch.from_numpy(np.random.rand(N, d))`` and the like, each name followed to its latest
    assignment before ``line`` (``x = torch.randn(...)``; ``TensorDataset(x, y)``); (None, ...)
    where the dims cannot be read. The dtype is the last conversion applied (``.float()``,
    ``.double()``, ``.astype(np.float32)``, ``dtype=``), else numpy's float64 for numpy data,
    else torch's float32."""
    dtype = None  # set by the outermost conversion met on the way in
    for _ in range(8):
        if isinstance(node, ast.Name):
            node, line = _assigned(src, node, line)
            if node is None:
                return None, "float32", ""
        elif isinstance(node, ast.Call) and src.call_name(node) in ("torch.from_numpy", "torch.tensor",
                                                                   "torch.as_tensor") and node.args:
            dtype = dtype or _dtype_named(src, keyword(node, "dtype"))
            node = node.args[0]
        elif isinstance(node, ast.Call) and src.call_name(node) in (".float", ".astype", ".double") and \
                isinstance(node.func, ast.Attribute):
            conversion = {".float": "float32", ".double": "float64"}.get(src.call_name(node)) or \
                _dtype_named(src, keyword(node, "dtype", 0))
            dtype = dtype or conversion
            node = node.func.value
        else:
            break
    if not isinstance(node, ast.Call):
        return None, "float32", ""
    name = src.call_name(node)
    if name in ("torch.randn", "torch.rand", "torch.zeros", "torch.ones", "torch.empty", "numpy.random.rand",
                "numpy.random.randn", "numpy.zeros", "numpy.ones"):
        args = node.args[0].elts if len(node.args) == 1 and isinstance(node.args[0], (ast.Tuple, ast.List)) \
            else node.args
        dtype = dtype or _dtype_named(src, keyword(node, "dtype")) or (
            "float64" if name.startswith("numpy.") else "float32")
        try:
            return tuple(int(slice_of(src).value(a, line)) for a in args), dtype, src.segment(node)
        except (Undetermined, TypeError, ValueError):
            return None, "float32", ""
    return None, "float32", ""


def _dtype_named(src: Source, node: ast.AST | None) -> str | None:
    """"float32" or "float64" for a dtype argument that names one (``torch.float64``, ``np.float32``,
    ``"float64"``, numpy's ``float``), else None."""
    if node is None:
        return None
    text = src.segment(node).strip("'\"")
    if text == "float":  # Python's float as a numpy dtype
        return "float64"
    return {"float32": "float32", "float": "float32", "float64": "float64", "double": "float64"}.get(
        text.rsplit(".", 1)[-1])  # torch.float is float32


def _first_layer(module):
    """("features" | "tokens", one example's shape, the layer) from the model's first parameterised layer."""
    import torch

    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            return "features", (layer.in_features,), f"Linear({layer.in_features}, {layer.out_features})"
        if isinstance(layer, torch.nn.Embedding):
            length = sequence_length(module)
            if length is None:
                return "unknown", None, (f"the model starts with Embedding({layer.num_embeddings}, "
                                         f"{layer.embedding_dim}) and keeps no sequence length ("
                                         f"{', '.join(SEQUENCE_ATTRIBUTES[:3])}, ...)")
            return "tokens", (length,), f"Embedding({layer.num_embeddings}, {layer.embedding_dim}) with a sequence " \
                                        f"of {length} (the model's {length_attribute(module)})"
        if any(True for _ in layer.parameters(recurse=False)):
            return None  # a convolution or a norm first: its spatial size is not in the layer
    return None


def length_attribute(model) -> str | None:
    for holder in (model, getattr(model, "config", None), getattr(model, "cfg", None)):
        for attr in SEQUENCE_ATTRIBUTES:
            if holder is not None and isinstance(getattr(holder, attr, None), int):
                return attr if holder is model else f"config.{attr}"
    return None


def sequence_length(model) -> int | None:
    attr = length_attribute(model)
    if attr is None:
        return None
    holder = model.config if attr.startswith("config.") and hasattr(model, "config") else model
    return getattr(holder, attr.split(".")[-1])


@dataclass
class LossPlan:
    kind: str  # "criterion": loss_fn(output, labels); "returned": the model returns it; "none"
    fn: Any = None
    index: Any = None  # "returned": the loss's position in what the model returns, or an attribute name
    labels: str | None = None
    said: str = ""


def plan_torch_loss(reader: Reader, construction: Construction, slice_of) -> LossPlan:
    model_name = construction.name
    for src in reader.sources:
        for node in sorted(ast.walk(src.tree), key=lambda n: getattr(n, "lineno", 0)):
            if not isinstance(node, ast.Assign) or reader.region(src, node) not in ("train",) and not (
                    reader.training_calls(src, src.enclosing(node, ast.FunctionDef) or src.tree)):
                continue
            value = node.value
            if not isinstance(value, ast.Call):
                continue
            name = src.call_name(value)
            leaf = name.rsplit(".", 1)[-1]
            target = node.targets[0]
            if isinstance(value.func, ast.Name) and value.func.id == model_name or \
                    isinstance(value.func, ast.Attribute) and value.func.attr == "forward":
                if isinstance(target, ast.Tuple):  # logits, loss = model(X, Y)
                    names = [t.id if isinstance(t, ast.Name) else "" for t in target.elts]
                    if "loss" in names:
                        return LossPlan("returned", index=names.index("loss"), labels="tokens" if len(value.args) >= 2
                                        else None, said=f"the model returns its loss ({src.shown}:{node.lineno})")
                elif isinstance(target, ast.Name) and target.id == "loss":
                    return LossPlan("returned", index=None, said=f"the model returns its loss ({src.shown}:{node.lineno})")
            if leaf in CLASS_LOSSES | REGRESSION_LOSSES and name.startswith("torch.nn.functional."):
                import torch.nn.functional as F

                return LossPlan("criterion", fn=getattr(F, leaf), labels="class" if leaf in CLASS_LOSSES else
                                "regression", said=f"loss {name.split('.')[-1]} ({src.shown}:{node.lineno})")
            if isinstance(value.func, ast.Name):  # criterion(output, target)
                try:
                    fn = slice_of(src).value(value.func, node.lineno)
                except Undetermined:
                    continue
                kind = type(fn).__name__
                if kind in CLASS_LOSSES | REGRESSION_LOSSES:
                    return LossPlan("criterion", fn=fn, labels="class" if kind in CLASS_LOSSES else "regression",
                                    said=f"loss {kind} ({src.shown}:{node.lineno})")
    return LossPlan("none", said="no loss found in the training code")


def torch_optimizer(reader: Reader, module, slice_of):
    """The script's optimizer, built over ``module``'s parameters, when the device has its rule."""
    import torch

    for src in reader.sources:
        for call in src.calls():
            name = src.call_name(call)
            if not name.startswith("torch.optim.") or name.count(".") != 2:
                continue
            cls = getattr(torch.optim, name.rsplit(".", 1)[-1], None)
            if cls is None or cls.__name__ not in ("SGD", "Adam", "AdamW"):
                return None, f"optimizer {name.rsplit('.', 1)[-1]} not captured (see its finding)"
            try:
                args = [slice_of(src).value(a, call.lineno) for a in call.args[1:]]
                kwargs = {k.arg: slice_of(src).value(k.value, call.lineno) for k in call.keywords if k.arg}
                return cls(module.parameters(), *args, **kwargs), f"optimizer {cls.__name__} ({src.shown}:{call.lineno})"
            except (Undetermined, TypeError, ValueError) as e:
                return None, f"optimizer {cls.__name__}'s settings not determined ({e})"
    return None, "no torch.optim optimizer found"


# --- building and capturing ---------------------------------------------------------------

@dataclass
class Built:
    graph: Any
    said: list[str]


def build_torch(reader: Reader, folder: str) -> Built:
    import torch

    from device.api import capture_torch as capture

    sources = {os.path.realpath(s.path): s for s in reader.sources}
    definitions = Definitions(folder, sources)
    construction = find_construction(reader)
    if construction is None:
        raise NotBuilt("no construction of the model found (model = Net(...)): the model was read, not built")
    with definitions.installed(), quiet():
        modules = {s.path: definitions.module_of(s) for s in reader.sources}
        args = next((a for a in (argparse_defaults(s) for s in reader.sources) if a is not None), None)

        def slice_of(src: Source) -> Slice:
            return Slice(src, modules[src.path], reader, args)

        src = construction.src
        try:
            torch.manual_seed(0)
            model = slice_of(src).value(construction.expr, construction.stmt.lineno)
        except Undetermined as e:
            raise NotBuilt(f"the model ({src.segment(construction.expr)}, {src.shown}:{construction.stmt.lineno}) "
                           f"was not built: {e}") from None
        if not isinstance(model, torch.nn.Module):
            raise NotBuilt(f"{src.segment(construction.expr)} ({src.shown}:{construction.stmt.lineno}) built a "
                           f"{type(model).__name__}, not an nn.Module")
        plan = plan_torch_batch(reader, construction, model, slice_of)
        loss = plan_torch_loss(reader, construction, slice_of)
        optimizer, said_optimizer = torch_optimizer(reader, model, slice_of)
    said = [f"model {src.segment(construction.expr)} ({src.shown}:{construction.stmt.lineno})", *plan.said,
            loss.said, said_optimizer]
    if definitions.missing:
        said.append(f"not installed here: {', '.join(sorted(definitions.missing))}")
    if plan.features is None or plan.batch_size is None or any(d is None for d in plan.features):
        raise NotBuilt("the model was built, but the shape of its input batch could not be read from the data code "
                       f"({'; '.join(plan.said) or 'no DataLoader found'}): not captured")
    dtype = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}[plan.features_dtype]
    features = torch.zeros((plan.batch_size, *plan.features), dtype=dtype)
    if plan.features_dtype == "float64" and not any(p.dtype == torch.float64 for p in model.parameters()):
        features = features.float()  # the data's float64 is its own finding; the model is captured as it computes
    param_dtype = next((p.dtype for p in model.parameters()), torch.float32)
    if features.is_floating_point():
        features = features.to(param_dtype)
    labels_kind = loss.labels or plan.labels
    if loss.kind == "none":
        said.append("the forward pass was compiled with the mean of its output standing in for the loss")
    with quiet():
        try:
            labels = _torch_labels(model, features, labels_kind)
            batch = (features,) if labels is None else (features, labels)

            def step(b):
                if loss.kind == "criterion":
                    return loss.fn(model(b[0]), b[1])
                out = model(*b) if loss.kind == "returned" else model(b[0])
                if loss.kind == "returned":
                    return out[loss.index] if loss.index is not None else out
                first = out[0] if isinstance(out, (tuple, list)) else out
                return first.float().mean()

            graph = capture(step, model, batch, optimizer=optimizer)
        except NotBuilt:
            raise
        except Exception as e:  # noqa: BLE001 - tracing the user's model failed: say so, with its line
            from common.port.capture import user_frame

            path, line = user_frame(e, folder)
            raise NotBuilt(f"capturing the model on a batch {tuple(features.shape)} failed: {one_line(e)}",
                           path, line) from None
    return Built(graph, [s for s in said if s])


def _torch_labels(model, features, kind: str | None):
    import torch

    if kind in (None, "class"):
        return torch.zeros(features.shape[0], dtype=torch.int64) if kind == "class" else None
    if kind == "tokens":
        return torch.zeros(features.shape[:2], dtype=torch.int64)
    with torch.no_grad():  # a regression target is shaped like the output: one forward pass on zeros
        out = model(features)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return torch.zeros_like(out)


def build_keras(reader: Reader, folder: str) -> Built:
    import common.tf.run  # noqa: F401 - TensorFlow's first import, its CUDA start-up lines kept out of stderr
    import keras
    import tensorflow as tf

    from device import api

    sources = {os.path.realpath(s.path): s for s in reader.sources}
    definitions = Definitions(folder, sources)
    construction = find_construction(reader)
    if construction is None:
        raise NotBuilt("no construction of the Keras model found (model = keras.Sequential(...)): the model was "
                       "read, not built")
    src = construction.src
    said = [f"model {src.segment(construction.expr)} ({src.shown}:{construction.stmt.lineno})"]
    compile_call = next(((s, c) for s in reader.sources for c in s.calls() if s.call_name(c) == ".compile"
                         and keyword(c, "loss") is not None), None)
    fit = next(((s, c) for s in reader.sources for c in s.calls() if s.call_name(c) == ".fit"), None)
    keras.backend.clear_session()
    graph = tf.Graph()
    with definitions.installed(), quiet(), graph.as_default():
        modules = {s.path: definitions.module_of(s) for s in reader.sources}
        args = next((a for a in (argparse_defaults(s) for s in reader.sources) if a is not None), None)

        def slice_of(s: Source) -> Slice:
            return Slice(s, modules[s.path], reader, args)

        try:
            tf.compat.v1.set_random_seed(0)
            model = slice_of(src).value(construction.expr, construction.stmt.lineno)
        except Undetermined as e:
            raise NotBuilt(f"the model ({src.segment(construction.expr)}, {src.shown}:{construction.stmt.lineno}) "
                           f"was not built: {e}") from None
        shape, where_shape = _keras_input_shape(model, reader)
        said.append(where_shape)
        batch_size, where = _keras_batch_size(reader, fit, slice_of)
        said.append(where)
        if shape is None or any(d is None for d in shape):
            raise NotBuilt(f"the Keras model was built, but not captured: {where_shape}" +
                           (", a dimension of None" if shape else ""))
        loss_fn, from_logits, where = _keras_loss(compile_call, slice_of)
        said.append(where)
        if loss_fn is None:
            raise NotBuilt("the Keras model was built, but its loss could not be read from compile(loss=...): "
                           "not captured")
        try:
            x = tf.compat.v1.placeholder(tf.float32, (batch_size, *shape), name="features")
            y = tf.compat.v1.placeholder(tf.int64, (batch_size,), name="labels")
            out = model(x, training=True)
            loss = tf.reduce_mean(loss_fn(y, out))
            optimizer, where = _keras_optimizer(compile_call, slice_of)
            said.append(where)
            train_op = None
            if optimizer is not None:
                train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
            session = tf.compat.v1.Session(graph=graph)
            session.run(tf.compat.v1.global_variables_initializer())
            try:
                ir = api.capture_tf(graph, inputs=[x, y], loss=loss, train_op=train_op, session=session)
            finally:
                session.close()
        except Exception as e:  # noqa: BLE001
            from common.port.capture import user_frame

            path, line = user_frame(e, folder)
            raise NotBuilt(f"capturing the Keras model on a batch {(batch_size, *shape)} failed: {one_line(e)}",
                           path, line) from None
    if definitions.missing:
        said.append(f"not installed here: {', '.join(sorted(definitions.missing))}")
    return Built(ir, [s for s in said if s])


def _keras_input_shape(model, reader: Reader):
    try:
        shape = tuple(model.input_shape)[1:]
        return shape, f"input shape {shape} from the model"
    except Exception:  # noqa: BLE001 - a model not built yet has no input shape
        pass
    for src in reader.sources:
        for call in src.calls():
            name = src.call_name(call)
            if name.startswith("keras.datasets.") and name.endswith(".load_data"):
                key = name.split(".")[-2]
                if key in KERAS_SHAPES:
                    return KERAS_SHAPES[key], f"examples {KERAS_SHAPES[key]} of keras.datasets.{key}"
            if name == "tensorflow_datasets.load":
                key = literal(keyword(call, "name", 0))
                if key in TFDS_SHAPES:
                    return TFDS_SHAPES[key], f"examples {TFDS_SHAPES[key]} of tfds {key}"
    return None, "input shape not found (no Input shape, no known data set)"


def _keras_batch_size(reader: Reader, fit, slice_of):
    for src in reader.sources:
        for call in src.calls():
            if src.call_name(call) == ".batch" and call.args:
                try:
                    size = int(slice_of(src).value(call.args[0], call.lineno))
                    return size, f"batch {size} from {src.shown}:{call.lineno}"
                except (Undetermined, TypeError, ValueError):
                    pass
    if fit is not None:
        src, call = fit
        size = keyword(call, "batch_size")
        if size is not None:
            try:
                value = int(slice_of(src).value(size, call.lineno))
                return value, f"batch {value} from {src.shown}:{call.lineno}"
            except (Undetermined, TypeError, ValueError):
                pass
        return 32, f"batch 32: fit's default ({src.shown}:{call.lineno} gives none)"
    return 32, "batch 32 (no batch size found; Keras' default)"


def _keras_loss(compile_call, slice_of):
    import keras

    if compile_call is None:
        return None, False, "no compile(loss=...) found"
    src, call = compile_call
    node = keyword(call, "loss")
    value = literal(node, NOT_LITERAL)
    try:
        loss = keras.losses.get(value) if isinstance(value, str) else slice_of(src).value(node, call.lineno)
    except (Undetermined, ValueError) as e:
        return None, False, f"the loss {src.segment(node)} not determined ({e})"
    return loss, False, f"loss {src.segment(node)} ({src.shown}:{call.lineno})"


def _keras_optimizer(compile_call, slice_of):
    """compile's optimizer as the TF1 optimizer the device capture reads (Adam, SGD, momentum)."""
    import tensorflow as tf

    if compile_call is None:
        return None, "no optimizer"
    src, call = compile_call
    node, line = keyword(call, "optimizer", 0), call.lineno
    if isinstance(node, ast.Name):  # opt = keras.optimizers.SGD(...); model.compile(optimizer=opt)
        node, line = _assigned(src, node, line)
    name, lr, momentum = None, 0.001, 0.0
    value = literal(node, NOT_LITERAL)
    if isinstance(value, str):
        name, lr = value.lower(), 0.01 if value.lower() == "sgd" else 0.001
    elif isinstance(node, ast.Call):
        name = src.call_name(node).rsplit(".", 1)[-1].lower()
        try:
            lr = float(slice_of(src).value(keyword(node, "learning_rate", 0), line)) \
                if keyword(node, "learning_rate", 0) is not None else (0.01 if name == "sgd" else 0.001)
            momentum = float(slice_of(src).value(keyword(node, "momentum"), line)) \
                if keyword(node, "momentum") is not None else 0.0
        except (Undetermined, TypeError, ValueError) as e:
            return None, f"optimizer's settings not determined ({e})"
    v1 = tf.compat.v1.train
    if name == "adam":
        return v1.AdamOptimizer(lr), f"optimizer Adam({lr:g})"
    if name == "sgd":
        return (v1.MomentumOptimizer(lr, momentum) if momentum else v1.GradientDescentOptimizer(lr)), \
            f"optimizer SGD({lr:g})"
    return None, f"optimizer {name} not captured" if name else "no optimizer"
