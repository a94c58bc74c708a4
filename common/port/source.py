"""A user's Python file, parsed once: its syntax tree, what its imported names stand for, and
the parent of every node, so that the reader's rules match calls by what they call
(``nn.functional.relu`` and ``F.relu`` are both ``torch.nn.functional.relu``) and ask
where a call sits (inside a model class, a data function, a training loop).

Nothing here imports or runs the user's code.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import Iterator

from common.port.findings import Unreadable

# Spellings of one API under several module paths, reduced to one (prefix -> replacement),
# so that the rule tables name each call once.
_CANONICAL = (
    ("tensorflow.compat.v1.", "tensorflow."),  # tf.compat.v1.summary.scalar is tf.summary.scalar's TF1 twin
    ("tensorflow.compat.v2.", "tensorflow."),
    ("tensorflow.keras.", "keras."),  # tf.keras is Keras in TF 2.x
    ("tensorflow.python.keras.", "keras."),
    ("tf_keras.", "keras."),  # the Keras 2 package tf.keras became
    ("keras.src.", "keras."),
)


def canonical(name: str) -> str:
    for prefix, replacement in _CANONICAL:
        if name.startswith(prefix):
            return replacement + name[len(prefix):]
    if name in ("tensorflow.keras", "tf_keras"):
        return "keras"
    return name


@dataclass
class Source:
    path: str  # absolute
    shown: str  # as findings name it
    text: str
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)  # local name -> the module or object it imports
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str, shown: str) -> "Source":
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise Unreadable(f"{shown}: cannot read ({getattr(e, 'strerror', None) or e})") from None
        try:
            tree = ast.parse(text, filename=path)
        except SyntaxError as e:
            raise Unreadable(f"{shown}:{e.lineno or 0}: cannot parse: {e.msg}") from None
        source = cls(os.path.abspath(path), shown, text, tree)
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                source.parents[child] = node
            if isinstance(node, ast.Import):
                for a in node.names:
                    # `import torch.nn` binds `torch`; `import torch.nn as nn` binds nn to torch.nn
                    source.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                for a in node.names:
                    source.aliases[a.asname or a.name] = f"{module}.{a.name}" if module else a.name
        for node in tree.body:  # mnist = tf.keras.datasets.mnist: a local name for an imported module
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Attribute) and source.is_imported(node.value) \
                    and node.targets[0].id not in source.aliases:
                source.aliases[node.targets[0].id] = source.qualname(node.value)
        return source

    # --- names --------------------------------------------------------------------------

    def imports(self, *modules: str) -> bool:
        """Whether the file imports any of ``modules`` (or something under them)."""
        heads = {canonical(v).split(".")[0] for v in self.aliases.values()}
        return any(m in heads for m in modules)

    def qualname(self, node: ast.AST) -> str | None:
        """``F.relu`` -> ``torch.nn.functional.relu``; a chain whose head is not imported keeps
        the local name (``model.fit``); None for anything but a chain of names."""
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id, node.id)
        return canonical(".".join([head, *reversed(parts)]))

    def call_name(self, call: ast.Call) -> str:
        """The qualified name of what ``call`` calls, or ``.method`` for a method of an object
        the reader cannot name (``x.topk(2)`` -> ``.topk``; ``ds.batch(32)`` -> ``.batch``)."""
        name = self.qualname(call.func)
        if name is not None and (isinstance(call.func, ast.Name) or self.is_imported(call.func)):
            return name
        if isinstance(call.func, ast.Attribute):
            return "." + call.func.attr
        return name or ""

    def is_imported(self, node: ast.AST) -> bool:
        """Whether the head of a chain of names is an imported module or object."""
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in self.aliases

    # --- where a node sits --------------------------------------------------------------

    def ancestors(self, node: ast.AST) -> Iterator[ast.AST]:
        while node in self.parents:
            node = self.parents[node]
            yield node

    def enclosing(self, node: ast.AST, *types: type) -> ast.AST | None:
        return next((a for a in self.ancestors(node) if isinstance(a, types)), None)

    def calls(self, root: ast.AST | None = None) -> Iterator[ast.Call]:
        for node in ast.walk(root or self.tree):
            if isinstance(node, ast.Call):
                yield node

    def segment(self, node: ast.AST, limit: int = 60) -> str:
        """The source text of ``node`` on one line, shortened to ``limit`` characters."""
        text = " ".join((ast.get_source_segment(self.text, node) or ast.unparse(node)).split())
        return text if len(text) <= limit else text[:limit - 3] + "..."


def keyword(call: ast.Call, name: str, position: int | None = None) -> ast.AST | None:
    """The argument ``name`` of ``call``, by keyword or at ``position``; None if not given."""
    for k in call.keywords:
        if k.arg == name:
            return k.value
    if position is not None and len(call.args) > position and not any(
            isinstance(a, ast.Starred) for a in call.args[:position + 1]):
        return call.args[position]
    return None


def literal(node: ast.AST | None, default=None):
    """The value of a literal (``True``, ``32``, ``(None, 10)``, ``-1``), else ``default``."""
    if node is None:
        return default
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return default


NOT_LITERAL = object()  # literal()'s default where None is a possible literal value
