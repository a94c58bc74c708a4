"""Which params keys a folder's code reads, found in its source: ``params["model"]["x"]``,
``p = params["model"]; p["x"]``, ``input_params = params["train_input"] if train else
params["eval_input"]``, a sub-mapping passed to a function of the folder
(``cnn(features, params["model"])``), ``.get("x")`` (optional: it has a fallback).

Every function parameter named ``params`` is the whole params (the contract's name in
model_fn, the data functions, the PyTorchBaseModel and set_defaults). What cannot be
followed (a key held in a variable, params stored on an object) is not counted: the check
reports a key only when the code certainly reads it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from common.port.source import Source

Path = tuple[str, ...]


@dataclass(frozen=True)
class Read:
    src: Source
    node: ast.AST
    path: Path
    required: bool  # params[...] (a KeyError without it), not .get(...) or `in`


class ParamsReads:
    def __init__(self, sources: list[Source]):
        self.sources = sources
        self.functions: dict[str, list[tuple[Source, ast.AST]]] = {}
        for src in sources:
            for node in ast.walk(src.tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions.setdefault(node.name, []).append((src, node))
        # function -> parameter name -> the params paths it holds
        self.bound: dict[ast.AST, dict[str, set[Path]]] = {}
        self.reads: list[Read] = []
        self._envs: dict[ast.AST, dict[str, set[Path]]] = {}
        for _ in range(4):  # passing sub-mappings on through calls: a few rounds reach a fixpoint
            if not self._pass(record=False):
                break
        self._pass(record=True)

    def paths_of(self, src: Source, node: ast.AST) -> set[Path]:
        """The params paths ``node`` evaluates to, in the function that holds it."""
        fn = src.enclosing(node, ast.FunctionDef, ast.AsyncFunctionDef)
        return self._paths(node, self._envs.get(fn, {}), None, src)

    # --- one pass over every function ---------------------------------------------------

    def _pass(self, record: bool) -> bool:
        changed = False
        self.reads = []
        for src in self.sources:
            for fn in ast.walk(src.tree):
                if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                env: dict[str, set[Path]] = {k: set(v) for k, v in self.bound.get(fn, {}).items()}
                for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
                    if arg.arg == "params":
                        env.setdefault("params", set()).add(())
                self._envs[fn] = env
                for stmt in _statements(fn.body):
                    changed |= self._statement(stmt, env, src, record)
        return changed

    def _statement(self, stmt: ast.stmt, env: dict[str, set[Path]], src: Source, record: bool) -> bool:
        changed = False
        if record:
            for node in (n for part in _own_parts(stmt) for n in ast.walk(part)):
                if isinstance(node, (ast.Subscript, ast.Call)):
                    self._paths(node, env, self.reads, src, shallow=True)
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            paths = self._paths(stmt.value, env, None, src)
            if paths:
                env[stmt.targets[0].id] = paths
            else:
                env.pop(stmt.targets[0].id, None)
        for call in (n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
            for _, callee in self.functions.get(call.func.id, []):
                names = [a.arg for a in [*callee.args.posonlyargs, *callee.args.args]]
                given = list(zip(names, call.args)) + [(k.arg, k.value) for k in call.keywords if k.arg]
                for name, value in given:
                    paths = self._paths(value, env, None, src)
                    if paths and not paths <= self.bound.setdefault(callee, {}).setdefault(name, set()):
                        self.bound[callee][name] |= paths
                        changed = True
        return changed

    def _paths(self, node: ast.AST, env, reads: list | None, src: Source, shallow: bool = False) -> set[Path]:
        """Paths of ``node``; with ``reads``, record each read (``shallow``: only ``node``'s own)."""
        if isinstance(node, ast.Name):
            return set(env.get(node.id, set()))
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
            base = self._paths(node.value, env, None, src)
            if isinstance(key, ast.Constant) and isinstance(key.value, str) and base:
                paths = {p + (key.value,) for p in base}
                if reads is not None:
                    reads.extend(Read(src, node, p, True) for p in paths)
                return paths
            return set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "pop") \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            base = self._paths(node.func.value, env, None, src)
            paths = {p + (node.args[0].value,) for p in base}
            if reads is not None:
                reads.extend(Read(src, node, p, False) for p in paths)
            return paths
        if isinstance(node, ast.IfExp) and not shallow:
            return self._paths(node.body, env, reads, src) | self._paths(node.orelse, env, reads, src)
        if isinstance(node, ast.BoolOp) and not shallow:
            return set().union(*(self._paths(v, env, reads, src) for v in node.values))
        return set()


def _statements(body: list[ast.stmt]):
    """The statements of a function body in order, nested blocks included, nested functions not."""
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        yield stmt
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], (ast.stmt, ast.excepthandler)):
                yield from _statements([s for h in inner for s in (h.body if isinstance(h, ast.excepthandler)
                                                                   else [h])])


def _own_parts(stmt: ast.stmt) -> list[ast.AST]:
    """What a statement evaluates itself: a block's header, not its body (visited on its own)."""
    if isinstance(stmt, (ast.If, ast.While)):
        return [stmt.test]
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return [stmt.iter]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [item.context_expr for item in stmt.items]
    if isinstance(stmt, ast.Try) or hasattr(ast, "TryStar") and isinstance(stmt, ast.TryStar):
        return []
    return [stmt]


def lookup(params, path: Path):
    """The value at ``path`` in nested mappings, or a sentinel when a key is missing."""
    value = params
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return MISSING
        value = value[key]
    return value


MISSING = object()
