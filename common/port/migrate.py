"""``zoo port migrate SRC --out DEST``: a folder of the vendor's zoo (R1.x) copied and made to run here.

Like ``tf_upgrade_v2`` for TF 1 code, it rewrites only what must change, line by line:

    modelzoo.common.X              -> common.X            (this zoo's module of the same name; a name it
                                                          has not is listed)
    modelzoo.<...>.<SRC>.<mod>     -> .<mod>, ..<mod>     (the folder's own modules, at any depth, relatively)
    modelzoo.<any other module>    -> .vendor_deps.<...>  (carried: copied from the user's checkout of the
                                                          vendor's zoo, with every module it imports in turn)
    sys.path.append(...)           -> __package__ = ...   (a script imports its folder as a package)
    tf.estimator.X                 -> tf_estimator.X      (TF 2.16 and later have no tf.estimator; the import
                                                          ``from common.tf import estimator as tf_estimator``
                                                          is added after ``import tensorflow as tf``)
    keras.mixed_precision.experimental -> keras.mixed_precision  (set_policy -> set_global_policy,
                                                          Policy(name, loss_scale=None) -> Policy(name))
    from huggingface_hub import HfFolder, Repository  -> from common.pytorch.hf_compat import ...
    from transformers.utils.versions import importlib_metadata -> from importlib import metadata as ...
    from keras_preprocessing.text import Tokenizer     -> from common.keras_text import Tokenizer
                                                          (third-party names since removed: MOVED_NAMES)
    self.variable_dtype = self._dtype_policy.variable_dtype  -> pass  (and dtype_policy, compute_dtype:
                                                          Keras layers have them as read-only properties of
                                                          that value since Keras 2.4)
    import tensorflow as tf    -> import os; os.environ.setdefault("TF_USE_LEGACY_KERAS", "1"); import ...
                                                          (in a script of a folder that carries the vendor's
                                                          Keras 2 model library, vendor_deps/common/tf: tf.keras
                                                          is then tf-keras, Keras 2 for TF 2.16 and later)
    tf.keras.layers.Conv2D(filters, k, s, p, f, d, activation, ...)  -> ..., activation=activation, ...
                                                          (positional arguments after dilation_rate named:
                                                          Keras 2.3 put groups there, before activation)
    DataLoader(..., num_workers=W, prefetch_factor=P)  -> prefetch_factor=P if W > 0 else None
                                                          (torch 2 refuses a prefetch factor without workers;
                                                          torch 1 took its default, 2, and ignored it)

A library the vendor's code imports that this environment has not (nltk, spacy) is listed with
the pip command that installs it; a top-level ``import spacy`` becomes
``spacy = optional_module("spacy", <pip command>)`` and ``from nltk import word_tokenize``
``word_tokenize = optional_name("nltk", "word_tokenize", <pip command>)``
(common/optional_module.py), so that the module imports without it (the vendor's TF bert's
data.py imports its spaCy data processors); ``from nltk import ngrams`` becomes
``from common.ngrams import ngrams``.

The checkout is the folder above the ``modelzoo`` package SRC lies in; a SRC outside one is a
standalone folder whose own modules are ``modelzoo.<family>.<fw>.<mod>``. A carried module
keeps its path under ``modelzoo/`` below ``DEST/vendor_deps/``, an empty __init__.py in each
folder above it.
Every change is printed with its file:line, before and after, and written to
DEST/MIGRATION.md, with each carried file and the import that pulled it in; what it could not
rewrite is listed with the reason. Every other line, and every file that is not Python, is
copied byte for byte. SRC is never written; a DEST that exists is refused.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field

from common.errors import UserError
from common.port import vendor_folders

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = "MIGRATION.md"
VENDOR_DEPS = "vendor_deps"  # DEST's package of the modules carried from the user's checkout
_SKIP_DIRS = {"__pycache__", ".git", "model_dir", ".ipynb_checkpoints"}

# the vendor's module names that differ from this zoo's (the rest keep their name under common.)
MODULE_RENAMES = {
    "modelzoo.common.pytorch.PyTorchBaseModel": "common.pytorch.base_model",
    "modelzoo.common.pytorch.run_utils": "common.pytorch.run",
}
# tf.estimator names common.tf.estimator provides, with tf.estimator's meaning
TF_ESTIMATOR_NAMES = {"ModeKeys", "TrainSpec", "EvalSpec", "train_and_evaluate", "EstimatorSpec", "RunConfig",
                      "WarmStartSettings"}
TF_ESTIMATOR_IMPORT = "from common.tf import estimator as tf_estimator  # TF 2.16 and later have no tf.estimator"
_TF_ESTIMATOR = r"(?<![\w.])tf\.estimator\."  # TensorFlow's, not common.tf.estimator
_LAYER_PROPERTY = re.compile(r"(\s*)self\.(dtype_policy|variable_dtype|compute_dtype)\s*=\s*self\._dtype_policy"
                             r"(?:\.(variable_dtype|compute_dtype))?\s*$")
# the vendor's Keras 2 model library (TFBaseModel, layers, Trainer): carried, it runs on tf-keras
KERAS2_LIBRARY = f"{VENDOR_DEPS}/common/tf/"
LEGACY_KERAS = 'import os; os.environ.setdefault("TF_USE_LEGACY_KERAS", "1"); import tensorflow as tf'
WHY_LEGACY_KERAS = ("the vendor's Keras 2 model library is carried (vendor_deps/common/tf): tf.keras is tf-keras, "
                    "Keras 2 for TF 2.16 and later, in this process")
_STACK_CONFIG = ("the vendor compiler's settings (its system's protobufs): common.tf.stack_config takes them, and "
                 "CSRunConfig ignores them here")
_TF_PYTHON_KERAS = ("tensorflow.python.keras is TF's internal Keras 2, whose layers take no tf-keras dtype "
                    "policy: tf_keras.layers is the Keras 2 that tf.keras is in the migrated folder")
# Third-party API drift: names the vendor's code imports from a library that has since dropped them,
# (library module, name) -> (where the name is now, the name there, why). One import line becomes
# one line of ``;``-separated imports, the names that did not move staying where they were.
MOVED_NAMES = {
    # huggingface_hub 1.0 removed HfFolder (a token store) and Repository (a git clone of a Hub repo)
    ("huggingface_hub", "HfFolder"): ("common.pytorch.hf_compat", "HfFolder",
                                      "huggingface_hub 1.0 removed HfFolder: common.pytorch.hf_compat's get_token "
                                      "reads huggingface_hub.get_token()"),
    ("huggingface_hub", "Repository"): ("common.pytorch.hf_compat", "Repository",
                                        "huggingface_hub 1.0 removed Repository: common.pytorch.hf_compat's is one "
                                        "error line when made (the vendor makes one only in push_to_hub)"),
    # transformers 4.x re-exported the importlib_metadata back-port; 5.x has not, and Python 3.8 on has it
    ("transformers.utils.versions", "importlib_metadata"): ("importlib", "metadata",
                                                            "transformers 5 has no importlib_metadata: it is the "
                                                            "standard library's importlib.metadata"),
    # NLTK (not a dependency here): the one name the vendor calls, written here
    ("nltk", "ngrams"): ("common.ngrams", "ngrams", "nltk is not installed here: common.ngrams has its ngrams"),
    # TF's internal copy of Keras 2 (tensorflow.python.keras): its layers refuse the tf-keras dtype policies
    # that the vendor's carried layers pass (the vendor's unet concatenates with these two)
    ("tensorflow.python.keras.layers", "concatenate"): ("tf_keras.layers", "concatenate", _TF_PYTHON_KERAS),
    ("tensorflow.python.keras.layers", "Flatten"): ("tf_keras.layers", "Flatten", _TF_PYTHON_KERAS),
    # Keras-Preprocessing (unmaintained, not a dependency here): the two names the vendor calls, written here
    ("keras_preprocessing.text", "Tokenizer"): ("common.keras_text", "Tokenizer",
                                                "keras_preprocessing is not installed here: common.keras_text has "
                                                "its Tokenizer"),
    ("keras_preprocessing.text", "text_to_word_sequence"): ("common.keras_text", "text_to_word_sequence",
                                                            "keras_preprocessing is not installed here: "
                                                            "common.keras_text has its text_to_word_sequence"),
    # the vendor compiler's settings, which its folders fill in for --validate_only and --compile_only too
    **{(module, name): ("common.tf.stack_config", name, _STACK_CONFIG) for module, name in (
        ("cerebras.pb.stack.full_pb2", "FullConfig"), ("cerebras.pb.stack.autogen_pb2", "AP_ENABLED"),
        ("cerebras.pb.stack.autogen_pb2", "AP_DISABLED"), ("cerebras.pb.common.tri_state_pb2", "TS_ENABLED"),
        ("cerebras.pb.common.tri_state_pb2", "TS_DISABLED"))},
}
# modules imported whole (``import <module> as <name>``) that are somewhere else now: module -> (where, why)
MOVED_MODULES = {
    "cerebras.pb.common.cerebras_type_pb2": ("from common.tf.stack_config import cerebras_types", _STACK_CONFIG),
}
_MOVED_FROM = {module for module, _ in MOVED_NAMES}
# the vendor's huggingface_common/dependency_versions_check.py checks these at import; neither is imported by the
# vendor's code: sacremoses served HF's own XLM/FSMT tokenizers, tokenizers is pinned <0.11 (transformers 4.9's)
UNCHECKED_PACKAGES = {"sacremoses", "tokenizers"}
# packages the vendor's code imports that this zoo does not install, each with how to install it and what needs it
TO_INSTALL = {
    "nltk": "pip install nltk (the vendor's BERTSUM data processing takes nltk.ngrams)",
    "spacy": "pip install spacy, then python -m spacy download <its spacy_model> (the vendor's BERT "
             "pre-training data scripts split sentences with a spaCy model)",
    "keras_preprocessing": "pip install keras-preprocessing (common.keras_text has only Tokenizer and "
                           "text_to_word_sequence)",
    "pandas": "pip install pandas (the vendor's unet reads the raw DAGM 2007 and Severstal label CSVs with "
              "pandas; its TFRecords readers take none)",
}
WHY_OWN = "the folder's own module, imported relatively"
WHY_CARRIED = "a module of the vendor's checkout, carried into vendor_deps/ and imported relatively"
PACKAGE_LINE = ("from common.folder import folder_package; "
                "__package__ = folder_package(os.path.dirname(os.path.abspath(__file__)))")


def package_line(package: tuple[str, ...]) -> str:
    """The line that makes a script DEST's module ``package`` (its folder's parts below DEST)."""
    if not package:
        return PACKAGE_LINE
    up = ", ".join(['".."'] * len(package))
    return ("from common.folder import folder_package; __package__ = folder_package(os.path.join("
            f"os.path.dirname(os.path.abspath(__file__)), {up})) + \".{'.'.join(package)}\"")


@dataclass(frozen=True)
class Change:
    file: str  # relative to the folder
    line: int  # in DEST (an added line: its number in DEST; ``before`` is empty)
    src_line: int  # in SRC (an added line: the SRC line it follows)
    before: str
    after: str
    why: str


@dataclass(frozen=True)
class Left:
    file: str
    line: int
    text: str
    why: str


@dataclass(frozen=True)
class Carried:
    file: str  # in DEST, e.g. vendor_deps/transformers/pytorch/layers/x.py
    origin: str  # in the checkout, e.g. modelzoo/transformers/pytorch/layers/x.py ("" for an empty package file)
    by: str  # what pulled it in: "file:line" of the import, or "a package above <module>" for an empty one


def installed(package: str) -> bool:
    """Whether ``package`` can be imported in this environment (found, not imported)."""
    return importlib.util.find_spec(package) is not None


def _module_exists(dotted: str) -> bool:
    """Whether this zoo has ``dotted`` (common.x.y) as a module or package, without importing it."""
    path = os.path.join(ROOT, *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


@functools.lru_cache(maxsize=None)
def _our_names(dotted: str) -> frozenset[str] | None:
    """The names this zoo's module ``dotted`` binds at its top level (read, not imported); None if unknown."""
    path = os.path.join(ROOT, *dotted.split("."))
    path = path + ".py" if os.path.isfile(path + ".py") else os.path.join(path, "__init__.py")
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (SyntaxError, UnicodeDecodeError):  # being edited: its names are not known
        return None
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
                blocks += [h.body for h in getattr(node, "handlers", [])]
                if not all(visit(b) for b in blocks):
                    return False
        return True

    if not visit(tree.body) or "__getattr__" in names:  # a star import or a module __getattr__: any name
        return None
    return frozenset(names)


def _ours(module: str, names: list[str]) -> str | None:
    """This zoo's module for the vendor's ``module`` (a modelzoo.common one this zoo has), or None."""
    for vendor, ours in MODULE_RENAMES.items():
        if module == vendor or module.startswith(vendor + "."):
            return ours + module[len(vendor):]
    if module != "modelzoo.common" and not module.startswith("modelzoo.common."):
        return None
    ours = module.removeprefix("modelzoo.")
    # `from modelzoo.common.pytorch import cb_model`: the package and the name it imports
    candidates = [ours] + ([f"{ours}.{names[0]}"] if names else [])
    return ours if any(_module_exists(c) for c in candidates) else None


def _lacking(ours: str, names: list[str]) -> list[str]:
    """The names of ``from <ours> import names`` that this zoo's module has not (neither bound nor a submodule)."""
    if not _module_exists(ours):
        return []
    bound = _our_names(ours)
    if bound is None:
        return []
    return [n for n in names if n not in bound and not _module_exists(f"{ours}.{n}")]


def _relative(package: tuple[str, ...], target: tuple[str, ...]) -> str:
    """``from <this> import``: the module ``target`` (parts below DEST) seen from a module of ``package``."""
    k = 0
    while k < min(len(package), len(target)) and package[k] == target[k]:
        k += 1
    return "." * (len(package) - k + 1) + ".".join(target[k:])


def _catches_import_error(handler: ast.expr | None) -> bool:
    """Whether ``except <handler>:`` catches an ImportError (a bare except, Exception, ImportError, ...)."""
    names = {n.id for n in ast.walk(handler) if isinstance(n, ast.Name)} if handler is not None else {"Exception"}
    return bool(names & {"Exception", "BaseException", "ImportError", "ModuleNotFoundError"})


@dataclass(frozen=True)
class Checkout:
    """The user's checkout of the vendor's zoo that SRC lies in: ``root/modelzoo/...``."""

    root: str  # the folder that holds modelzoo/
    src: tuple[str, ...]  # SRC's dotted name: ("modelzoo", "transformers", "pytorch", "gpt2")

    @classmethod
    def around(cls, src: str) -> Checkout | None:
        """The checkout whose ``modelzoo`` package (the nearest folder of that name with an __init__.py
        at or above SRC) holds SRC; None for a standalone folder."""
        parts = os.path.realpath(src).split(os.sep)
        for i in range(len(parts) - 1, 0, -1):
            if parts[i] == "modelzoo" and os.path.isfile(os.path.join(os.sep.join(parts[:i + 1]), "__init__.py")):
                return cls(os.sep.join(parts[:i]) or os.sep, tuple(parts[i:]))
        return None

    def locate(self, module: tuple[str, ...]) -> str | None:
        """The checkout's file of ``module``: x.py, x/__init__.py, or the folder x/ (a package without one)."""
        base = os.path.join(self.root, *module)
        for path in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(path):
                return path
        return base if os.path.isdir(base) else None

    def place(self, module: tuple[str, ...]) -> tuple[str, ...]:
        """Where ``module`` lies below DEST: SRC's own in place, any other below vendor_deps/."""
        if module[:len(self.src)] == self.src:
            return module[len(self.src):]
        return (VENDOR_DEPS,) + module[1:]

    def module_of(self, package: tuple[str, ...]) -> tuple[str, ...]:
        """The vendor's dotted name of DEST's package ``package`` (inverse of ``place``)."""
        if package[:1] == (VENDOR_DEPS,):
            return ("modelzoo",) + package[1:]
        return self.src + package


@dataclass
class ImportPlan:
    """What to do with one file's import statements, by line: found before the line rules run."""

    rewrites: dict[int, tuple[str, str]] = field(default_factory=dict)  # line -> (new line, why)
    left: dict[int, str] = field(default_factory=dict)  # line -> why it stays
    wanted: list[tuple[tuple[str, ...], int]] = field(default_factory=list)  # (vendor module to carry, line)
    guarded: set[int] = field(default_factory=set)  # imports in a try whose except catches an ImportError


class _Planner:
    """Reads a file's imports (ast) and decides each one naming the vendor's zoo."""

    def __init__(self, rel: str, lines: list[str], checkout: Checkout | None, own_modules: set[str]):
        self.lines, self.checkout, self.own_modules = lines, checkout, own_modules
        self.package = tuple(rel.split("/")[:-1])  # the file's package below DEST
        self.plan = ImportPlan()

    def run(self, tree: ast.Module) -> ImportPlan:
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(_catches_import_error(h.type) for h in node.handlers):
                self.plan.guarded.update(n.lineno for stmt in node.body for n in ast.walk(stmt)
                                         if isinstance(n, (ast.Import, ast.ImportFrom)))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in TO_INSTALL \
                    and not any((node.module, a.name) in MOVED_NAMES for a in node.names) \
                    and node in tree.body and node.lineno not in self.plan.guarded:
                self._optional_from(node)
            elif isinstance(node, ast.ImportFrom):
                self._from(node)
            elif isinstance(node, ast.Import) and any(a.name.split(".")[0] == "modelzoo" for a in node.names):
                self._import(node)
            elif isinstance(node, ast.Import) and node in tree.body and node.lineno not in self.plan.guarded:
                self._optional(node)
        return self.plan

    def _optional(self, node: ast.Import) -> None:
        """A top-level ``import X`` (``as Y``) of a library this zoo does not install (TO_INSTALL): the module
        then imports without it, and the library's first use is one error with its pip command."""
        if len(node.names) != 1 or node.names[0].name not in TO_INSTALL:
            return
        alias = node.names[0]
        m = re.match(r"(\s*)import\s+([\w.]+)(?:\s+as\s+(\w+))?\s*(#.*)?$", self._body(node.lineno))
        if not m or node.end_lineno != node.lineno:
            return
        comment = f"  {m.group(4)}" if m.group(4) else ""
        self._rewrite(node.lineno, f"{m.group(1)}from common.optional_module import optional_module; "
                                   f"{alias.asname or alias.name} = optional_module({json.dumps(alias.name)}, "
                                   f"{json.dumps(TO_INSTALL[alias.name])}){comment}",
                      f"{alias.name} is not installed here ({TO_INSTALL[alias.name]}): common.optional_module "
                      f"imports it where it is, and where it is not the module still imports and the first "
                      f"use of {alias.name} is one error saying so")

    def _optional_from(self, node: ast.ImportFrom) -> None:
        """A top-level ``from X import a, b as c`` of such a library: each name through optional_name, which is
        the library's where it is installed and, where it is not, a stand-in whose use is that one error."""
        m = re.match(r"(\s*)from\s+\w+\s+import\s+[\w\s,]+?\s*(#.*)?$", self._body(node.lineno))
        if not m or node.end_lineno != node.lineno or any(a.name == "*" for a in node.names):
            return
        install = json.dumps(TO_INSTALL[node.module])
        names = "; ".join(f"{a.asname or a.name} = optional_name({json.dumps(node.module)}, {json.dumps(a.name)}, "
                          f"{install})" for a in node.names)
        comment = f"  {m.group(2)}" if m.group(2) else ""
        self._rewrite(node.lineno, f"{m.group(1)}from common.optional_module import optional_name; {names}{comment}",
                      f"{node.module} is not installed here ({TO_INSTALL[node.module]}): common.optional_module "
                      f"imports it where it is, and where it is not the module still imports and the first "
                      f"use of a name of it is one error saying so")

    def _body(self, number: int) -> str:
        return _split_ending(self.lines[number - 1])[0]

    def _rewrite(self, number: int, new: str, why: str) -> None:
        if number in self.plan.rewrites or number in self.plan.left:
            self.plan.rewrites.pop(number, None)
            self.plan.left[number] = "more than one import on the line: split it, then migrate again"
        else:
            self.plan.rewrites[number] = (new, why)

    def _leave(self, number: int, why: str) -> None:
        self.plan.rewrites.pop(number, None)
        self.plan.left.setdefault(number, why)

    def _from(self, node: ast.ImportFrom) -> None:
        names = [a.name for a in node.names]
        number, line = node.lineno, self._body(node.lineno)
        if node.level == 0 and node.end_lineno != number and any((node.module, n) in MOVED_NAMES for n in names):
            return self._leave(number, f"names since removed from {node.module}, imported across lines: put the "
                                       f"import on one line, then migrate again")
        m = re.match(r"(\s*from\s+)([\w.]+)(\s+import\b.*)$", line)
        if node.level == 0 and node.module and node.module.split(".")[0] == "modelzoo":
            if not m or m.group(2) != node.module:
                return self._leave(number, "an import of the vendor's zoo not at the start of its line: "
                                           "rewrite it by hand")
            ours = _ours(node.module, names)
            if ours is not None:
                self._rewrite(number, m.group(1) + ours + m.group(3), "the vendor's common modules are this zoo's "
                                                                      "common")
                if lacking := _lacking(ours, names):  # rewritten all the same: the name is this zoo's to add
                    self.plan.left[number] = (f"this zoo's {ours} has no {', '.join(lacking)}: the vendor's API it "
                                              f"names is not provided here")
                return
            if self.checkout is None:
                return self._standalone(number, m, node.module)
            return self._vendor(number, m, tuple(node.module.split(".")), names, node.module)
        if node.level > 0 and self.checkout is not None:
            # a relative import in the vendor's code: the module it names comes along too
            base = self.checkout.module_of(self.package)
            if node.level - 1 > len(base) - 1:
                return
            module = base[:len(base) - (node.level - 1)] + tuple((node.module or "").split(".") if node.module else ())
            if module[:1] != ("modelzoo",):
                return
            old = re.match(r"(\s*from\s+)(\.+[\w.]*)(\s+import\b.*)$", line)
            self._vendor(number, old, module, names, "." * node.level + (node.module or ""))

    def _vendor(self, number: int, m: re.Match | None, module: tuple[str, ...], names: list[str],
                written: str) -> None:
        """``from <written> import names``, ``module`` in the user's checkout: relative to where it lies in DEST."""
        path = self.checkout.locate(module)
        if path is None:
            return self._leave(number, f"no module {'.'.join(module)} in the vendor's checkout "
                                       f"({self.checkout.root}): nothing to carry")
        self.plan.wanted.append((module, number))
        if not path.endswith(".py") or path.endswith("__init__.py"):  # a package: the names may be its modules
            self.plan.wanted += [(module + (n,), number) for n in names if self.checkout.locate(module + (n,))]
        new = _relative(self.package, self.checkout.place(module))
        if new == written:  # a relative import in the vendor's code that holds in DEST as it is
            return
        if m is None:
            return self._leave(number, "an import of the vendor's zoo not at the start of its line: "
                                       "rewrite it by hand")
        if new != m.group(2):
            own = self.checkout.place(module)[:1] != (VENDOR_DEPS,)
            why = WHY_OWN if own else WHY_CARRIED
            self._rewrite(number, m.group(1) + new + m.group(3), why)

    def _standalone(self, number: int, m: re.Match, module: str) -> None:
        """Outside a checkout: modelzoo.<family>.<fw>.<mod> is the folder's own module when it has one."""
        own = re.fullmatch(r"modelzoo\.(?!common\.)\w+\.(?:pytorch|tf)\.(\w+)", module)
        if own and own.group(1) in self.own_modules:
            self._rewrite(number, m.group(1) + _relative(self.package, (own.group(1),)) + m.group(3),
                          WHY_OWN)

    def _import(self, node: ast.Import) -> None:
        """``import modelzoo.a.b as c``: this zoo's module, or ``from <package> import b as c``."""
        number, line = node.lineno, self._body(node.lineno)
        m = re.match(r"(\s*)import\s+(modelzoo[\w.]*)\s+as\s+(\w+)(.*)$", line)
        if len(node.names) != 1 or not m or m.group(2) != node.names[0].name:
            return self._leave(number, "an `import modelzoo...` statement without one `as` name: its uses name the "
                                       "vendor's package; write it as `from <package> import <module> as <name>`")
        module = m.group(2)
        ours = _ours(module, [])
        if ours is not None:
            return self._rewrite(number, f"{m.group(1)}import {ours} as {m.group(3)}{m.group(4)}",
                                 "the vendor's common modules are this zoo's common")
        if self.checkout is None:
            return
        parts = tuple(module.split("."))
        if self.checkout.locate(parts) is None:
            return self._leave(number, f"no module {module} in the vendor's checkout ({self.checkout.root}): "
                                       f"nothing to carry")
        self.plan.wanted.append((parts, number))
        place = self.checkout.place(parts)
        self._rewrite(number, f"{m.group(1)}from {_relative(self.package, place[:-1])} import {place[-1]} as "
                              f"{m.group(3)}{m.group(4)}",
                      WHY_CARRIED if place[0] == VENDOR_DEPS else WHY_OWN)


class FileMigration:
    """One Python file's lines, rewritten rule by rule (the rules below, in order)."""

    def __init__(self, rel: str, text: str, own_modules: set[str], plan: ImportPlan | None = None):
        self.rel, self.own_modules = rel, own_modules
        self.plan = plan or ImportPlan()
        self.package = tuple(rel.split("/")[:-1])
        self.lines = text.splitlines(keepends=True)
        self.changes: list[Change] = []
        self.left: list[Left] = []
        self.is_script = bool(re.search(r"^if __name__ == ['\"]__main__['\"]", text, re.M))
        self.added_after: int | None = None  # the SRC line after which a line was added (the tf_estimator import)
        self.prefetch = _prefetch_factors(text)
        self.conv_positionals = _conv_positionals(text)

    def dest_line(self, src_line: int) -> int:
        """The number in DEST of SRC's line ``src_line``."""
        return src_line + 1 if self.added_after is not None and src_line > self.added_after else src_line

    def run(self) -> tuple[str, list[Change], list[Left]]:
        out: list[str] = []
        needs_estimator = False
        for number, line in enumerate(self.lines, 1):
            body, ending = _split_ending(line)
            new, whys = body, []
            for rule in (self._imports, self._common, self._sys_path, self._tf_estimator, self._keras_mixed,
                         self._moved_names, self._moved_modules, self._version_checks, self._prefetch_factor,
                         self._layer_properties, self._conv_positionals):
                new, why = rule(new, number)
                if why:
                    whys.append(why)
            needs_estimator |= "tf_estimator." in new and "tf_estimator." not in body
            self._leftovers(new, number)
            if new != body:
                self.changes.append(Change(self.rel, len(out) + 1, number, body, new, "; ".join(whys)))
            out.append(new + ending)
        if needs_estimator:
            out = self._add_estimator_import(out)
        return "".join(out), self.changes, self.left

    # --- the rules: each takes a line (without its ending) and returns (line, why or "") ---------

    def _imports(self, line: str, number: int) -> tuple[str, str]:
        """An import of the vendor's zoo, as the plan (_Planner) decided it."""
        if number in self.plan.rewrites:
            return self.plan.rewrites[number]
        return line, ""

    def _common(self, line: str, number: int) -> tuple[str, str]:
        """modelzoo.common.X -> common.X outside import statements, where this zoo has that module."""
        if number in self.plan.rewrites or number in self.plan.left:
            return line, ""

        def swap(m: re.Match) -> str:
            return _ours(m.group(0), []) or m.group(0)

        new = re.sub(r"\bmodelzoo\.common(?:\.\w+)*", swap, line)
        return new, "the vendor's common modules are this zoo's common" if new != line else ""

    def _sys_path(self, line: str, number: int) -> tuple[str, str]:
        """A script's sys.path.append(root of the vendor's zoo): its folder becomes its package instead."""
        m = re.match(r"(\s*)sys\.path\.(?:append|insert)\(.*\)\s*$", line)
        if m and self.is_script and not m.group(1):
            return package_line(self.package), "run as a script, the file imports its folder's modules as one " \
                                               "package (common/folder.py), not through sys.path"
        return line, ""

    def _tf_estimator(self, line: str, number: int) -> tuple[str, str]:
        names = set(re.findall(_TF_ESTIMATOR + r"(\w+)", line))
        if names and names <= TF_ESTIMATOR_NAMES:
            return re.sub(_TF_ESTIMATOR, "tf_estimator.", line), \
                "TF 2.16 and later have no tf.estimator: common.tf.estimator has the same names"
        return line, ""

    def _keras_mixed(self, line: str, number: int) -> tuple[str, str]:
        """The Keras 2.2 experimental mixed-precision API -> its stable names (TF 2.4 on)."""
        new = re.sub(r"\bmixed_precision\.experimental\.set_policy\b", "mixed_precision.set_global_policy", line)
        new = re.sub(r"\bmixed_precision\.experimental\b", "mixed_precision", new)
        # Policy's loss_scale argument is gone; None meant no loss scaling, which is Policy(name)
        new = re.sub(r"(\bPolicy\([^()]*?),\s*loss_scale\s*=\s*None\s*\)", r"\1)", new)
        return new, "keras.mixed_precision.experimental became keras.mixed_precision" if new != line else ""

    def _moved_names(self, line: str, number: int) -> tuple[str, str]:
        """``from <library> import names`` where some names moved (MOVED_NAMES): each from where it is now."""
        m = re.match(r"(\s*)from\s+([\w.]+)\s+import\s+([\w\s,]+?)\s*(#.*)?$", line)
        if not m or m.group(2) not in _MOVED_FROM:
            return line, ""
        stay, moved, whys = [], {}, []
        for item in m.group(3).split(","):
            name, _, alias = (part.strip() for part in item.strip().partition(" as "))
            if (m.group(2), name) not in MOVED_NAMES:
                stay.append(item.strip())
                continue
            module, new_name, why = MOVED_NAMES[(m.group(2), name)]
            alias = alias or name
            moved.setdefault(module, []).append(new_name if new_name == alias else f"{new_name} as {alias}")
            whys.append(why)
        if not moved:
            return line, ""
        imports = ([f"from {m.group(2)} import {', '.join(stay)}"] if stay else []) + \
            [f"from {module} import {', '.join(names)}" for module, names in moved.items()]
        return m.group(1) + "; ".join(imports) + (f"  {m.group(4)}" if m.group(4) else ""), "; ".join(whys)

    def _moved_modules(self, line: str, number: int) -> tuple[str, str]:
        """``import <module> as <name>`` of a module that is somewhere else now (MOVED_MODULES)."""
        m = re.match(r"(\s*)import\s+([\w.]+)\s+as\s+(\w+)\s*(#.*)?$", line)
        if not m or m.group(2) not in MOVED_MODULES:
            return line, ""
        where, why = MOVED_MODULES[m.group(2)]
        return f"{m.group(1)}{where} as {m.group(3)}" + (f"  {m.group(4)}" if m.group(4) else ""), why

    def _version_checks(self, line: str, number: int) -> tuple[str, str]:
        """The vendor's import-time version check of HF transformers 4.9's dependencies: without the two
        (UNCHECKED_PACKAGES) that its code never imports and this environment has not, or has newer."""
        m = re.match(r"(\s*pkgs_to_check_at_runtime\s*=\s*\")([^\"]*)(\".*)$", line)
        if not m or not set(m.group(2).split()) & UNCHECKED_PACKAGES:
            return line, ""
        kept = " ".join(p for p in m.group(2).split() if p not in UNCHECKED_PACKAGES)
        return m.group(1) + kept + m.group(3), ("sacremoses and tokenizers are checked at import, yet the "
                                                "vendor's code imports neither (tokenizers pinned below 0.11)")

    def _layer_properties(self, line: str, number: int) -> tuple[str, str]:
        """``self.<dtype property> = self._dtype_policy[.<same>]`` in a Keras layer: a read-only property of that
        very value since Keras 2.4, which refuses the assignment."""
        m = _LAYER_PROPERTY.match(line)
        if not m or (m.group(3) or "dtype_policy") != m.group(2):
            return line, ""
        return f"{m.group(1)}pass  # Layer.{m.group(2)} is this already", \
            f"Keras 2.4 and later layers have {m.group(2)} as a read-only property of this value"

    def _conv_positionals(self, line: str, number: int) -> tuple[str, str]:
        """A Keras ConvND given its arguments after dilation_rate by position, in Keras 2.2's order: each named, as
        Keras 2.3 and later put ``groups`` before ``activation`` (its activation would be read as groups)."""
        if number not in self.conv_positionals:
            return line, ""
        for column, name in sorted(self.conv_positionals[number], reverse=True):
            line = f"{line[:column]}{name}={line[column:]}"
        return line, ("Keras 2.3 and later take groups after dilation_rate: the arguments the vendor passes there "
                      "by position (Keras 2.2's order) are named")

    def _prefetch_factor(self, line: str, number: int) -> tuple[str, str]:
        """A DataLoader's prefetch_factor, passed whatever its number of workers: None without workers."""
        if number not in self.prefetch:
            return line, ""
        value, workers = self.prefetch[number]
        old = f"prefetch_factor={value}"
        if not value or line.count(old) != 1:
            return line, ""
        shown = f"({value})" if re.search(r"\bif\b|\blambda\b", value) else value
        return line.replace(old, f"prefetch_factor={shown} if {workers} > 0 else None"), \
            ("torch 2's DataLoader refuses a prefetch_factor without workers (torch 1 took 2 and ignored it): "
             "None when num_workers is 0")

    def _leftovers(self, line: str, number: int) -> None:
        """What the rules could not rewrite, with the reason."""
        text = line.strip()
        if number in self.prefetch and not (self.prefetch[number][0] and
                                            f"if {self.prefetch[number][1]} > 0 else None" in line):
            self.left.append(Left(self.rel, number, text, "a DataLoader's prefetch_factor, which torch 2 refuses "
                                  "without workers: pass None when num_workers is 0"))
        if number in self.plan.left:
            self.left.append(Left(self.rel, number, text, self.plan.left[number]))
            return
        if text.startswith("#"):
            return
        why = None
        if re.search(r"\bmodelzoo\.common\b", line):
            why = "this zoo has no such module under common/: the vendor's API it names is not provided"
        elif m := re.search(r"\bmodelzoo\.(?!common\.)\w+\.(?:pytorch|tf)\.(\w+)", line):
            why = (f"a module of another folder of the vendor's zoo ({m.group(0)}): copy it into this folder and "
                   f"import it relatively" if m.group(1) not in self.own_modules else
                   "an `import modelzoo...` statement: write it as `from .module import name`")
        elif re.search(r"\bmodelzoo\.", line):
            why = "an import of the vendor's zoo that names no module of this folder"
        elif re.search(_TF_ESTIMATOR, line):
            why = "tf.estimator is gone from TF 2.16 on, and common.tf.estimator has not this name"
        elif re.search(r"\bmixed_precision\.experimental\b|\bloss_scale\s*=", line):
            why = "Keras mixed precision has no loss_scale any more: set optimizer.loss_scaling_factor in params"
        elif re.search(r"^\s*(from|import)\s+(cerebras\w*|torch_xla)\b", line):
            why = "the vendor's system software, not present here: this line must only run on the vendor's system"
            if number in self.plan.guarded:
                why = "the vendor's system software, not present here: its try's `except ImportError` runs instead"
        elif re.search(r"\bsys\.path\.(append|insert)\(", line):
            why = "a sys.path change inside code: this folder's modules import each other relatively"
        elif (m := re.match(r"\s*(?:from|import)\s+(\w+)", line)) and m.group(1) in TO_INSTALL \
                and not installed(m.group(1)):
            why = f"{m.group(1)} is not installed here: {TO_INSTALL[m.group(1)]}"
        if why:
            self.left.append(Left(self.rel, number, text, why))

    def _add_estimator_import(self, out: list[str]) -> list[str]:
        """``from common.tf import estimator as tf_estimator`` after ``import tensorflow as tf``."""
        at = next((i for i, line in enumerate(out) if re.match(r"import tensorflow as tf\s*(#.*)?$", line)), None)
        if at is None:
            self.left.append(Left(self.rel, 0, "tf.estimator",
                                  "no top-level `import tensorflow as tf` to add the tf_estimator import after: "
                                  f"add `{TF_ESTIMATOR_IMPORT}` yourself"))
            return out
        _, ending = _split_ending(out[at])
        # the lines after it move down by one; before the insertion DEST and SRC lines correspond one to one
        self.changes = [Change(c.file, c.line + 1 if c.line > at + 1 else c.line, c.src_line, c.before, c.after,
                               c.why) for c in self.changes]
        self.changes.append(Change(self.rel, at + 2, at + 1, "", TF_ESTIMATOR_IMPORT,
                                   "the names tf.estimator had, from this zoo"))
        self.changes.sort(key=lambda c: c.line)
        self.left = [Left(x.file, x.line + 1 if x.line > at + 1 else x.line, x.text, x.why) for x in self.left]
        self.added_after = at + 1
        return out[:at + 1] + [TF_ESTIMATOR_IMPORT + ending] + out[at + 1:]


def _legacy_keras(rel: str, migrated: FileMigration, written: dict[str, bytes]) -> list[Change]:
    """A script's top-level ``import tensorflow as tf``, once the vendor's Keras 2 library is carried: tf.keras
    is tf-keras from there on (LEGACY_KERAS; TensorFlow reads the variable when tf.keras is first touched)."""
    lines = written[rel].decode("utf-8").splitlines(keepends=True)
    for i, line in enumerate(lines):
        body, ending = _split_ending(line)
        m = re.match(r"import tensorflow as tf(\s*#.*)?$", body)
        if m:
            lines[i] = LEGACY_KERAS + (m.group(1) or "") + ending
            written[rel] = "".join(lines).encode("utf-8")
            src_line = i + 1 - (migrated.added_after is not None and i + 1 > migrated.added_after + 1)
            return [Change(rel, i + 1, src_line, body, LEGACY_KERAS + (m.group(1) or ""), WHY_LEGACY_KERAS)]
    return []


def _prefetch_factors(text: str) -> dict[int, tuple[str, str]]:
    """The lines of ``text`` that pass a DataLoader (any call named so) a prefetch_factor along with
    num_workers: line -> (the prefetch_factor's source, num_workers' source), each written on one line."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        keywords = {k.arg: k for k in node.keywords if k.arg}
        if name != "DataLoader" or "prefetch_factor" not in keywords or "num_workers" not in keywords:
            continue
        prefetch, workers = keywords["prefetch_factor"], keywords["num_workers"].value
        if isinstance(prefetch.value, ast.Constant) and prefetch.value.value is None:
            continue
        if prefetch.lineno != prefetch.end_lineno or workers.lineno != workers.end_lineno:
            found[prefetch.lineno] = ("", "")  # written over lines: listed, not rewritten
            continue
        found[prefetch.lineno] = (ast.get_source_segment(text, prefetch.value),
                                  ast.get_source_segment(text, workers))
    return found


# Keras 2.2's Conv1D/2D/3D arguments after dilation_rate (the sixth), by position; Keras 2.3 put groups before them
_CONV_AFTER_DILATION = ("activation", "use_bias", "kernel_initializer", "bias_initializer", "kernel_regularizer",
                        "bias_regularizer", "activity_regularizer", "kernel_constraint", "bias_constraint")


def _conv_positionals(text: str) -> dict[int, list[tuple[int, str]]]:
    """The Keras ConvND calls (``<module>.Conv2D(...)``) of ``text`` given more than six positional arguments:
    line -> (column, Keras 2.2's name) of each one past the sixth, each written on one line."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    found: dict[int, list[tuple[int, str]]] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("Conv1D", "Conv2D", "Conv3D") and len(node.args) > 6):
            continue
        for arg, name in zip(node.args[6:], _CONV_AFTER_DILATION):
            if arg.lineno == arg.end_lineno and not isinstance(arg, ast.Starred):
                found.setdefault(arg.lineno, []).append((arg.col_offset, name))
    return found


def _split_ending(line: str) -> tuple[str, str]:
    body = line.rstrip("\r\n")
    return body, line[len(body):]


@dataclass
class Migration:
    src: str
    dest: str
    changes: list[Change]
    left: list[Left]
    copied: list[str]
    carried: list[Carried] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)  # commands that prepare the folder's data and run it

    def render(self) -> str:
        lines = [f"# Migrated from {self.src}", "",
                 f"{len(self.changes)} lines changed in {len({c.file for c in self.changes})} files; "
                 f"{len(self.copied)} files copied; {len(self.carried)} files carried from the vendor's checkout; "
                 f"every other line is as in the source.", "", "## Changes", ""]
        for c in self.changes:
            lines += [f"{c.file}:{c.line}: {c.why}", f"-    {c.before}" if c.before else "-    (added)",
                      f"+    {c.after}", ""]
        lines += ["## Carried from the vendor's checkout", ""]
        if not self.carried:
            lines += ["nothing", ""]
        for item in self.carried:
            if item.origin:
                lines += [f"{item.file}: from {item.origin}, imported at {item.by}"]
            else:
                lines += [f"{item.file}: empty, so that its folder is {item.by}"]
        if self.carried:
            lines += [""]
        lines += ["## Not rewritten", ""]
        if not self.left:
            lines += ["nothing", ""]
        for item in self.left:
            where = f"{item.file}:{item.line}" if item.line else item.file
            lines += [f"{where}: {item.why}", f"     {item.text}", ""]
        if self.next_steps:
            lines += ["## Next: its data, then a first run at a small size", ""]
            lines += [f"    {command}" for command in self.next_steps] + [""]
        return "\n".join(lines)


def _read_python(path: str, shown: str) -> tuple[str, ast.Module]:
    """A Python file's text and its syntax tree; one line naming file:line if it is not UTF-8 Python."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{shown}: not UTF-8 text") from None
    try:
        return text, ast.parse(text, shown)
    except SyntaxError as e:
        raise UserError(f"{shown}:{e.lineno}: not Python 3 ({e.msg}): fix the file, then migrate again") from None


def migrate(src: str, dest: str) -> Migration:
    """Copy ``src`` to ``dest`` (which must not exist), rewriting its Python files and carrying the vendor's
    modules they import from the checkout SRC lies in; returns what changed."""
    if not os.path.isdir(src):
        raise UserError(f"{src}: no such folder")
    if os.path.lexists(dest):
        raise UserError(f"{dest} exists: give a new folder to --out (the migration never overwrites)")
    src_abs, dest_abs = os.path.realpath(src), os.path.realpath(dest)
    if dest_abs == src_abs or dest_abs.startswith(src_abs + os.sep):
        raise UserError(f"--out {dest} is inside {src}: give a folder outside it")
    checkout = Checkout.around(src)
    own_modules = {os.path.splitext(f)[0] for f in os.listdir(src) if f.endswith(".py")}
    plan: list[tuple[str, str]] = []  # (path in DEST, "/" separated; path in SRC)
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        plan += [(os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/"), os.path.join(root, f))
                 for f in sorted(files) if not f.endswith(".pyc")]
    changes: list[Change] = []
    left: list[Left] = []
    written: dict[str, bytes] = {}
    carried: dict[str, Carried] = {}  # by path in DEST
    carry_paths: dict[str, str] = {}  # path in DEST -> path in the checkout
    file_migrations: dict[str, FileMigration] = {}
    todo = [(rel, path, path) for rel, path in plan if rel.endswith(".py")]

    def want(module: tuple[str, ...], by: str) -> None:
        """Carry the checkout's ``module`` into DEST/vendor_deps, once, with an empty __init__.py in each folder
        above it (the checkout's own __init__.py comes only where its package is imported itself)."""
        place = checkout.place(module)
        if place[:1] != (VENDOR_DEPS,):
            return  # SRC's own
        path = checkout.locate(module)
        is_package = os.path.isdir(path) or os.path.basename(path) == "__init__.py"
        for depth in range(1, len(place) + is_package):
            rel = "/".join(place[:depth]) + "/__init__.py"
            if rel not in carried:
                carried[rel] = Carried(rel, "", f"a package above {'/'.join(place)}")
                written[rel] = b""
        if os.path.isdir(path):  # a package without __init__.py: the empty one above stands for it
            return
        rel = "/".join(place) + ("/__init__.py" if is_package else ".py")
        if rel in carried and carried[rel].origin:
            return
        carried[rel] = Carried(rel, os.path.relpath(path, checkout.root).replace(os.sep, "/"), by)
        carry_paths[rel] = path
        written.pop(rel, None)
        todo.append((rel, path, path))

    if checkout is not None and os.path.exists(os.path.join(src, VENDOR_DEPS)):
        raise UserError(f"{os.path.join(src, VENDOR_DEPS)}: SRC has a {VENDOR_DEPS} of its own, the name the "
                        f"migration gives the modules it carries")
    while todo:
        rel, path, shown = todo.pop(0)
        text, tree = _read_python(path, shown)
        lines = text.splitlines(keepends=True)
        import_plan = _Planner(rel, lines, checkout, own_modules).run(tree)
        file_migration = FileMigration(rel, text, own_modules, import_plan)
        new, file_changes, file_left = file_migration.run()
        for module, number in import_plan.wanted:
            want(module, f"{rel}:{file_migration.dest_line(number)}")
        changes += file_changes
        left += file_left
        written[rel] = new.encode("utf-8")
        file_migrations[rel] = file_migration
    if any(rel.startswith(KERAS2_LIBRARY) for rel in carried):
        for rel, migrated in file_migrations.items():
            if migrated.is_script:
                changes += _legacy_keras(rel, migrated, written)
    copied = [rel for rel, _ in plan]
    order = {rel: i for i, rel in enumerate(copied + sorted(carried))}
    changes.sort(key=lambda c: (order[c.file], c.line))
    left.sort(key=lambda x: (order[x.file], x.line))
    migration = Migration(src, dest, changes, left, copied, [carried[rel] for rel in sorted(carried)],
                          next_steps(checkout, src, dest))
    os.makedirs(dest)
    for rel, path in plan + [(rel, carry_paths.get(rel)) for rel in sorted(carried)]:
        target = os.path.join(dest, *rel.split("/"))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if rel in written:
            with open(target, "wb") as f:
                f.write(written[rel])
            if path is not None:
                shutil.copymode(path, target)
        else:
            shutil.copy2(path, target)
    with open(os.path.join(dest, REPORT), "w", encoding="utf-8") as f:
        f.write(migration.render())
    return migration


def next_steps(checkout: "Checkout | None", src: str, dest: str) -> list[str]:
    """For a folder of the vendor's transformers zoo that vendor_folders.FOLDERS lists: the command that writes
    its data in the vendor's layout (it prints the overrides that point the config at that data), a first run
    of the migrated folder at the small size ``zoo port vendor-check`` uses, and that check itself; [] for any
    other folder."""
    if checkout is None:
        return []
    folder = vendor_folders.folder_of(checkout.root, src)
    if folder is None:
        return []
    rel = folder.name
    steps = []
    data_keys = ""
    if folder.data:
        out = "data/vendor_" + rel.replace("/", "_").replace("fine_tuning_", "")
        command = [a.format(out=out) for a in folder.data[folder.data.index("prepare") + 1:]]
        steps.append("zoo prepare " + " ".join(command) + "    # its last line: the overrides for that data")
        data_keys = " <those overrides>"
    env = "".join(f"{text} " for text, _ in folder.env)  # what no params key reaches (FOLDERS says why)
    run = (f"{env}python {os.path.join(dest, 'run.py')} -m train -p {os.path.join(dest, *folder.config.split('/'))} "
           f"-o model_dir/{os.path.basename(os.path.normpath(dest))}")
    settings = f"{' '.join(folder.override_args())}{data_keys} runconfig.max_steps=10"
    if folder.framework == "tf":  # its run.py takes no overrides: they go into the params file
        steps.append(f"{run}    # after setting in the params file: {settings}")
    else:
        steps.append(f"{run} {settings}")
    steps.append(f"zoo port vendor-check {checkout.root} {rel}    # the same, then eval, --validate_only, "
                 f"--compile_only and the emulator, checked")
    return steps


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="a model folder of the vendor's zoo (e.g. modelzoo/fc_mnist/tf)")
    parser.add_argument("--out", required=True, metavar="DEST", help="the new folder (must not exist)")


def run(args: argparse.Namespace) -> int:
    migration = migrate(args.src, args.out)
    sys.stdout.write(migration.render())
    print(f"\nwritten to {os.path.join(args.out, REPORT)}; next: zoo port check {args.out}")
    return 0
