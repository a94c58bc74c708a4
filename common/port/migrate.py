"""``zoo port migrate SRC --out DEST``: a folder of the vendor's zoo (R1.x) copied and made to run here.

Like ``tf_upgrade_v2`` for TF 1 code, it rewrites only what must change, line by line:

    modelzoo.common.X              -> common.X            (this zoo's module of the same name)
    modelzoo.<family>.<fw>.<mod>   -> .<mod>             (the folder's own module, imported relatively)
    sys.path.append(...)           -> __package__ = ...   (run.py as a script imports its folder as a package)
    tf.estimator.X                 -> tf_estimator.X      (TF 2.16 and later have no tf.estimator; the import
                                                          ``from common.tf import estimator as tf_estimator``
                                                          is added after ``import tensorflow as tf``)
    keras.mixed_precision.experimental -> keras.mixed_precision  (set_policy -> set_global_policy,
                                                          Policy(name, loss_scale=None) -> Policy(name))

Every change is printed with its file:line, before and after, and written to
DEST/MIGRATION.md; what it could not rewrite is listed with the reason. Every other line,
and every file that is not Python, is copied byte for byte. SRC is never written; a DEST
that exists is refused.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from dataclasses import dataclass

from common.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = "MIGRATION.md"
_SKIP_DIRS = {"__pycache__", ".git", "model_dir", ".ipynb_checkpoints"}

# the vendor's module names that differ from this zoo's (the rest keep their name under common.)
MODULE_RENAMES = {
    "modelzoo.common.pytorch.PyTorchBaseModel": "common.pytorch.base_model",
    "modelzoo.common.pytorch.run_utils": "common.pytorch.run",
}
# tf.estimator names common.tf.estimator provides, with tf.estimator's meaning
TF_ESTIMATOR_NAMES = {"ModeKeys", "TrainSpec", "EvalSpec", "train_and_evaluate", "EstimatorSpec", "RunConfig"}
TF_ESTIMATOR_IMPORT = "from common.tf import estimator as tf_estimator  # TF 2.16 and later have no tf.estimator"
_TF_ESTIMATOR = r"(?<![\w.])tf\.estimator\."  # TensorFlow's, not common.tf.estimator
PACKAGE_LINE = ("from common.folder import folder_package; "
                "__package__ = folder_package(os.path.dirname(os.path.abspath(__file__)))")


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


def _module_exists(dotted: str) -> bool:
    """Whether this zoo has ``dotted`` (common.x.y) as a module or package, without importing it."""
    path = os.path.join(ROOT, *dotted.split("."))
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


class FileMigration:
    """One Python file's lines, rewritten rule by rule (the rules below, in order)."""

    def __init__(self, rel: str, text: str, own_modules: set[str]):
        self.rel, self.own_modules = rel, own_modules
        self.lines = text.splitlines(keepends=True)
        self.changes: list[Change] = []
        self.left: list[Left] = []
        self.is_script = bool(re.search(r"^if __name__ == ['\"]__main__['\"]", text, re.M))

    def run(self) -> tuple[str, list[Change], list[Left]]:
        out: list[str] = []
        needs_estimator = False
        for number, line in enumerate(self.lines, 1):
            body, ending = _split_ending(line)
            new, whys = body, []
            for rule in (self._common, self._own_folder, self._sys_path, self._tf_estimator, self._keras_mixed):
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

    def _common(self, line: str, number: int) -> tuple[str, str]:
        """modelzoo.common.X -> common.X, where this zoo has that module."""
        def swap(m: re.Match) -> str:
            name = m.group(0)
            for vendor, ours in MODULE_RENAMES.items():
                if name == vendor or name.startswith(vendor + "."):
                    return ours + name[len(vendor):]
            ours = name.removeprefix("modelzoo.")
            # `from modelzoo.common.pytorch import cb_model`: the package and the name it imports
            imported = re.match(r"\s*from\s+" + re.escape(name) + r"\s+import\s+(\w+)", line)
            candidates = [ours] + ([f"{ours}.{imported.group(1)}"] if imported else [])
            if any(_module_exists(c) for c in candidates):
                return ours
            return name

        new = re.sub(r"\bmodelzoo\.common(?:\.\w+)*", swap, line)
        return new, "the vendor's common modules are this zoo's common" if new != line else ""

    def _own_folder(self, line: str, number: int) -> tuple[str, str]:
        """from modelzoo.<family>.<fw>.<mod> import ... -> from .<mod> import ..., for modules of this folder."""
        m = re.match(r"(\s*from\s+)modelzoo\.(?!common\.)\w+\.(?:pytorch|tf)\.(\w+)(\s+import\b.*)", line)
        if m and m.group(2) in self.own_modules:
            return f"{m.group(1)}.{m.group(2)}{m.group(3)}", "the folder's own module, imported relatively"
        return line, ""

    def _sys_path(self, line: str, number: int) -> tuple[str, str]:
        """A script's sys.path.append(root of the vendor's zoo): its folder becomes its package instead."""
        m = re.match(r"(\s*)sys\.path\.(?:append|insert)\(.*\)\s*$", line)
        if m and self.is_script and not m.group(1):
            return PACKAGE_LINE, "run as a script, the file imports its folder's modules as one package " \
                                 "(common/folder.py), not through sys.path"
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

    def _leftovers(self, line: str, number: int) -> None:
        """What the rules could not rewrite, with the reason."""
        text = line.strip()
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
        elif re.search(r"\bmixed_precision\.experimental\b|loss_scale\s*=", line):
            why = "Keras mixed precision has no loss_scale any more: set optimizer.loss_scaling_factor in params"
        elif re.search(r"^\s*(from|import)\s+(cerebras|torch_xla)\b", line):
            why = "the vendor's system software, not present here: this line must only run on the vendor's system"
        elif re.search(r"\bsys\.path\.(append|insert)\(", line):
            why = "a sys.path change inside code: this folder's modules import each other relatively"
        if why:
            self.left.append(Left(self.rel, number, text, why))

    def _add_estimator_import(self, out: list[str]) -> list[str]:
        """``from common.tf import estimator as tf_estimator`` after ``import tensorflow as tf``."""
        at = next((i for i, line in enumerate(out) if re.match(r"import tensorflow as tf\s*$", line)), None)
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
        return out[:at + 1] + [TF_ESTIMATOR_IMPORT + ending] + out[at + 1:]


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

    def render(self) -> str:
        lines = [f"# Migrated from {self.src}", "",
                 f"{len(self.changes)} lines changed in {len({c.file for c in self.changes})} files; "
                 f"{len(self.copied)} files copied; every other line is as in the source.", "", "## Changes", ""]
        for c in self.changes:
            lines += [f"{c.file}:{c.line}: {c.why}", f"-    {c.before}" if c.before else "-    (added)",
                      f"+    {c.after}", ""]
        lines += ["## Not rewritten", ""]
        if not self.left:
            lines += ["nothing", ""]
        for item in self.left:
            where = f"{item.file}:{item.line}" if item.line else item.file
            lines += [f"{where}: {item.why}", f"     {item.text}", ""]
        return "\n".join(lines)


def migrate(src: str, dest: str) -> Migration:
    """Copy ``src`` to ``dest`` (which must not exist), rewriting its Python files; returns what changed."""
    if not os.path.isdir(src):
        raise UserError(f"{src}: no such folder")
    if os.path.lexists(dest):
        raise UserError(f"{dest} exists: give a new folder to --out (the migration never overwrites)")
    src_abs, dest_abs = os.path.realpath(src), os.path.realpath(dest)
    if dest_abs == src_abs or dest_abs.startswith(src_abs + os.sep):
        raise UserError(f"--out {dest} is inside {src}: give a folder outside it")
    own_modules = {os.path.splitext(f)[0] for f in os.listdir(src) if f.endswith(".py")}
    plan: list[tuple[str, str]] = []
    for root, dirs, files in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        plan += [(os.path.relpath(os.path.join(root, f), src), os.path.join(root, f)) for f in sorted(files)
                 if not f.endswith(".pyc")]
    changes, left, copied = [], [], []
    written: dict[str, bytes] = {}
    for rel, path in plan:
        if rel.endswith(".py"):
            with open(path, "rb") as f:
                raw = f.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise UserError(f"{path}: not UTF-8 text") from None
            new, file_changes, file_left = FileMigration(rel, text, own_modules).run()
            changes += file_changes
            left += file_left
            written[rel] = new.encode("utf-8")
        copied.append(rel)
    migration = Migration(src, dest, changes, left, copied)
    os.makedirs(dest)
    for rel, path in plan:
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if rel in written:
            with open(target, "wb") as f:
                f.write(written[rel])
            shutil.copymode(path, target)
        else:
            shutil.copy2(path, target)
    with open(os.path.join(dest, REPORT), "w", encoding="utf-8") as f:
        f.write(migration.render())
    return migration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", help="a model folder of the vendor's zoo (e.g. modelzoo/fc_mnist/tf)")
    parser.add_argument("--out", required=True, metavar="DEST", help="the new folder (must not exist)")


def run(args: argparse.Namespace) -> int:
    migration = migrate(args.src, args.out)
    sys.stdout.write(migration.render())
    print(f"\nwritten to {os.path.join(args.out, REPORT)}; next: zoo port check {args.out}")
    return 0
