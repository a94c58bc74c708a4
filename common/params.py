"""One strict config path: defaults -> YAML file -> command-line overrides -> validate -> freeze.

The defaults are the schema. A model's ``default_params_fn()`` returns its own keys (its
``model``, ``train_input`` and ``eval_input`` sections); ``COMMON_DEFAULTS`` below adds the
keys every runner reads. A key that is not in the defaults is an error naming the key, the
file and its line, with the closest valid key suggested; so is a value of the wrong type.
The result is frozen: model and data code read params and never write them.

A leaf's type is the type of its default (an int is accepted where a float is expected).
Where a key takes several types or a fixed set of values, its default is a ``Typed``. A
default of ``None`` means "optional, any type".
"""

from __future__ import annotations

import copy
import difflib
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

from common.errors import UserError
from common.io import atomic_write_text


@dataclass(frozen=True)
class Typed:
    """A default that accepts several types, or one of fixed choices."""

    default: Any
    types: tuple[type, ...]
    choices: tuple[Any, ...] | None = None


# Keys every model gets; a model's default_params_fn may override a default value.
COMMON_DEFAULTS: dict[str, Any] = {
    "runconfig": {
        "model_dir": "model_dir",
        "max_steps": 1000,  # train until the global step reaches this
        "steps": None,  # or train this many steps beyond the current step (overrides max_steps)
        "eval_steps": None,  # None: the whole eval set
        "checkpoint_steps": 1000,  # TF spelling: save_checkpoints_steps
        "keep_checkpoint_max": 5,
        "log_steps": 50,  # log line and TensorBoard scalars; TF spelling: save_summary_steps
        "seed": 0,  # TF spelling: tf_random_seed
    },
    "optimizer": {
        "optimizer_type": Typed("adam", (str,), ("sgd", "momentum", "adam", "adamw")),
        # a number, or a schedule: a dict {scheduler: ..., ...} or a list of them run in sequence
        "learning_rate": Typed(0.001, (float, dict, list)),
        "momentum": 0.9,
        "nesterov": False,
        "beta1": 0.9,
        "beta2": 0.999,
        "epsilon": 1.0e-8,
        "weight_decay": 0.0,
        # parameters whose name contains one of these get no weight decay (biases, norms)
        "weight_decay_exclude": ["bias", "norm"],
        "max_gradient_norm": Typed(None, (float,)),
        "max_gradient_value": Typed(None, (float,)),
        # 1.0 (none), a fixed number, or "dynamic"
        "loss_scaling_factor": Typed(1.0, (float, str)),
        "initial_loss_scale": 32768.0,
        "steps_per_increase": 2000,
    },
    "mixed_precision": {
        "enabled": False,
        # bfloat16 on the CPU; float16 needs a GPU (or the emulator); cb16 exists on the device only
        "dtype": Typed("bfloat16", (str,), ("bfloat16", "float16", "cb16")),
    },
    "device": {
        # a profile of device/profiles.py: wse1, wse2, wse3, or the small test profiles
        "profile": "wse2",
        "execution_mode": Typed("pipelined", (str,), ("pipelined", "weight_streaming")),
    },
}

# Each framework's original spelling -> the shared key (both are accepted; giving both is an error).
ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("runconfig", "save_checkpoints_steps"): ("runconfig", "checkpoint_steps"),
    ("runconfig", "save_summary_steps"): ("runconfig", "log_steps"),
    ("runconfig", "tf_random_seed"): ("runconfig", "seed"),
}

MODES = ("train", "eval", "eval_all", "train_and_eval", "predict")


class FrozenDict(dict):
    """A dict that refuses writes: params are read, never written, by model code."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("params are frozen: model and data code read them and never write them")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse  # type: ignore[assignment]

    def __deepcopy__(self, memo):
        return FrozenDict({k: copy.deepcopy(v, memo) for k, v in self.items()})


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """Plain dicts and lists again (for YAML dumps and for code that needs a mutable copy)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def merge_defaults(*layers: Mapping) -> dict:
    """Deep-merge default dicts, later layers winning (a model overriding a common default)."""
    result: dict = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
                result[key] = merge_defaults(result[key], value)
            elif isinstance(result.get(key), Typed) and not isinstance(value, Typed):
                result[key] = Typed(value, result[key].types, result[key].choices)
            else:
                result[key] = copy.deepcopy(value)
    return result


def _default_value(spec: Any) -> Any:
    if isinstance(spec, Typed):
        return copy.deepcopy(spec.default)
    if isinstance(spec, Mapping):
        return {k: _default_value(v) for k, v in spec.items()}
    return copy.deepcopy(spec)


# --- reading YAML with line numbers ---------------------------------------------------

def _lines_of(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path of a composed YAML document to its 1-based line."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (key_node.value,)
            out[key_path] = key_node.start_mark.line + 1
            _lines_of(value_node, key_path, out)
    return out


def read_yaml(path: str) -> tuple[dict, dict[tuple, int]]:
    """Safe-load a params file; returns the mapping and the line of every key."""
    if not os.path.isfile(path):
        raise UserError(f"{path}: params file not found")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"{where}: malformed YAML: {problem}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a text file ({e.reason})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise UserError(f"{path}:1: a params file must be a mapping of sections, got {type(data).__name__}")
    return data, _lines_of(node)


# --- validation -------------------------------------------------------------------------

def _all_paths(spec: Mapping, prefix: tuple = ()) -> list[tuple]:
    paths = []
    for key, value in spec.items():
        paths.append(prefix + (key,))
        if isinstance(value, Mapping):
            paths.extend(_all_paths(value, prefix + (key,)))
    return paths


def _suggest(key_path: tuple, spec: Mapping) -> str:
    dotted = ".".join(map(str, key_path))
    candidates = [".".join(p) for p in _all_paths(spec)]
    close = difflib.get_close_matches(dotted, candidates, n=1, cutoff=0.6)
    if not close:  # the last component alone may match a key in another section
        leaf = str(key_path[-1])
        close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1] or difflib.get_close_matches(
            leaf, [c.rsplit(".", 1)[-1] for c in candidates], n=1, cutoff=0.75)
        close = [c for c in candidates if c.rsplit(".", 1)[-1] in close][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""


def _type_name(types: Iterable[type]) -> str:
    return " or ".join("number" if t is float else "integer" if t is int else
                       "boolean" if t is bool else "string" if t is str else
                       "list" if t is list else "mapping" if t is dict else t.__name__ for t in types)


_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _check_type(value: Any, spec: Any, where: str, dotted: str) -> Any:
    """Return the value (ints widened to float where a float is expected) or raise."""
    if isinstance(spec, Typed):
        types, choices = spec.types, spec.choices
    elif spec is None:
        return value
    else:
        types, choices = (type(spec),), None
    if value is None and (spec is None or (isinstance(spec, Typed) and spec.default is None)):
        return value
    if float in types and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; a user means the number
    for t in types:
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = float(value)
            break
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            break
        if t not in (float, int) and isinstance(value, t):
            break
    else:
        kind = _type_name(types)
        article = "an" if kind[0] in "aeiou" else "a"
        raise UserError(f"{where}: '{dotted}' must be {article} {kind}, got {value!r}")
    if choices is not None and value not in choices:
        valid = ", ".join(map(str, choices))
        raise UserError(f"{where}: '{dotted}' must be one of {valid}, got {value!r}")
    return value


def _apply(target: dict, spec: Mapping, data: Mapping, path: tuple, where_of, root: Mapping) -> None:
    """Copy ``data`` into ``target`` (defaults already there), checking keys and types.

    ``root`` is the whole spec, so that a misplaced key finds its match in another section.
    """
    for key, value in data.items():
        given = path + (key,)
        leaf = ALIASES.get(given, given)[-1]  # aliases stay within their section
        dotted = ".".join(map(str, path + (leaf,)))
        if leaf not in spec:
            raise UserError(f"{where_of(given)}: unknown key '{'.'.join(map(str, given))}'{_suggest(given, root)}")
        leaf_spec = spec[leaf]
        if isinstance(leaf_spec, Mapping):
            if not isinstance(value, Mapping):
                raise UserError(f"{where_of(given)}: '{dotted}' must be a mapping of keys, got {value!r}")
            _apply(target[leaf], leaf_spec, value, path + (leaf,), where_of, root)
        else:
            target[leaf] = _check_type(value, leaf_spec, where_of(given), dotted)


def _check_aliases(data: Mapping, where_of) -> None:
    for alias, canonical in ALIASES.items():
        section = data.get(alias[0])
        if isinstance(section, Mapping) and alias[1] in section and canonical[1] in section:
            raise UserError(f"{where_of(alias)}: '{'.'.join(alias)}' and '{'.'.join(canonical)}' are the same "
                            f"setting; give only one")


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``section.key=value`` (the value is read as YAML: 0.1, true, [500, 300], dynamic)."""
    if "=" not in text or text.startswith("="):
        raise UserError(f"command line: override '{text}' must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise UserError(f"command line: override '{text}': the value is not valid YAML") from None
    return tuple(key.strip().split(".")), value


def _nest(path: tuple, value: Any) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


def load_params(path: str | None, defaults: Mapping, overrides: Iterable[str] = ()) -> FrozenDict:
    """defaults -> the YAML file at ``path`` -> ``overrides`` ("a.b=value") -> validated, frozen params."""
    spec = merge_defaults(COMMON_DEFAULTS, defaults)
    params = _default_value(spec)
    if path is not None:
        data, lines = read_yaml(path)

        def where_of(key_path: tuple) -> str:
            return f"{path}:{lines[key_path]}" if key_path in lines else path

        _check_aliases(data, where_of)
        _apply(params, spec, data, (), where_of, spec)
    for text in overrides:
        key_path, value = parse_override(text)
        _apply(params, spec, _nest(key_path, value), (), lambda _p, t=text: f"command line '{t}'", spec)
    return freeze(params)


def save_params(params: Mapping, model_dir: str, mode: str) -> str:
    """Write the effective params to ``model_dir/params_<mode>.yaml`` (atomically)."""
    out = os.path.join(model_dir, f"params_{mode}.yaml")
    atomic_write_text(out, yaml.safe_dump(thaw(params), sort_keys=False, default_flow_style=None))
    return out
