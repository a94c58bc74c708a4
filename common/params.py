"""One strict config path: defaults -> YAML file -> command-line overrides -> validate -> freeze.

The defaults are the schema. A model's ``default_params_fn()`` returns its own keys (its
``model``, ``train_input`` and ``eval_input`` sections); ``COMMON_DEFAULTS`` below adds the
keys every runner reads. A key that is not in the defaults is an error naming the key, the
file and its line, with the closest valid key suggested; so is a value of the wrong type.
The vendor's config keys (common/vendor_keys.py) are the exception: its spellings are read as
this zoo's keys, and its system's keys are accepted, named once as ignored.
The result is frozen: model and data code read params and never write them.

A leaf's type is the type of its default (an int is accepted where a float is expected).
Where a key takes several types or a fixed set of values, its default is a ``Typed``. A
default of ``None`` means "optional, any type".
"""

from __future__ import annotations

import copy
import difflib
import inspect
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

from common.errors import UserError
from common.io import atomic_write_text
from common.vendor_keys import IGNORED, SPELLINGS
from device.api import (DEFAULT_INITIAL_LOSS_SCALE, DEFAULT_STEPS_PER_INCREASE, EXECUTION_MODES, HALF_PRECISIONS,
                        KINDS, MAX_LOSS_SCALE)

logger = logging.getLogger("zoo")


@dataclass(frozen=True)
class Range:
    """Bounds of a number: ``low <= x`` (``low < x`` when ``low_open``), ``x <= high`` (``x < high``
    when ``high_open``); ``special`` values are accepted beyond them (e.g. -1, tf.data.AUTOTUNE)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    special: tuple = ()

    def admits(self, x: float) -> bool:
        if x in self.special:
            return True
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def __str__(self) -> str:
        if self.high is None:
            text = f"{'greater than' if self.low_open else 'at least'} {self.low:g}"
        elif self.low is None:
            text = f"{'below' if self.high_open else 'at most'} {self.high:g}"
        else:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        return text + "".join(f" (or {s:g})" for s in self.special)


@dataclass(frozen=True)
class Typed:
    """A default that accepts several types, one of fixed choices, or numbers in a range."""

    default: Any
    types: tuple[type, ...]
    choices: tuple[Any, ...] | None = None
    range: Range | None = None


AT_LEAST_0, AT_LEAST_1, POSITIVE = Range(0), Range(1), Range(0, low_open=True)
UNIT_OPEN = Range(0.0, 1.0, high_open=True)  # a probability that must leave something: dropout, momentum, betas

# Sizes, counts and rates, checked by their name wherever they appear: the zoo's keys and a
# model's own, in either defaults form, so that no model hand-checks them. The first rule
# whose pattern matches the whole key wins; a ``Typed`` with a range of its own overrides
# them. Lists of numbers (``hidden_sizes: [500, 300]``) are checked element by element.
NAME_RULES: tuple[tuple[str, Range], ...] = (
    (r"num_parallel_calls|.*buffer_size", Range(1, special=(-1, 0))),  # -1: tf.data.AUTOTUNE; 0: the zoo's "auto"
    (r"num_workers", AT_LEAST_0),  # DataLoader worker processes; 0: load in the main process
    (r".*_steps?|.*_epochs?|keep_checkpoint_max|seed", AT_LEAST_0),  # num_warmup_steps: 0 is no warm-up
    (r"(.*_)?batch_size|.*_sizes?|num_.*|.*_(length|len)|depth|width|height|.*_dim|.*_dims", AT_LEAST_1),
    (r"(.*_)?dropout(_.*)?|label_smoothing", UNIT_OPEN),
    (r".*_prob|.*_probability|.*_fraction", Range(0.0, 1.0)),
    (r"learning_rate|weight_decay", AT_LEAST_0),
)


def name_rule(key: str) -> Range | None:
    """The range the name of ``key`` implies (NAME_RULES), if any."""
    for pattern, bounds in NAME_RULES:
        if re.fullmatch(pattern, key):
            return bounds
    return None


# Keys every model gets; a model's default_params_fn may override a default value.
COMMON_DEFAULTS: dict[str, Any] = {
    "runconfig": {
        # None: model_dir/<framework>_<folder>[_<config>] (common/cli.py), so that a copied
        # folder or another config never resumes or overwrites the checkpoints of the original
        "model_dir": Typed(None, (str,)),
        "max_steps": 1000,  # train until the global step reaches this
        "steps": Typed(None, (int,), range=AT_LEAST_1),  # or train this many steps beyond the current step
        "eval_steps": Typed(None, (int,), range=AT_LEAST_1),  # None: the whole eval set
        "checkpoint_steps": 1000,  # TF spelling: save_checkpoints_steps; 0: only at the end
        "keep_checkpoint_max": 5,  # 0: keep every checkpoint
        "log_steps": Typed(50, (int,), range=AT_LEAST_1),  # log line and TensorBoard scalars; TF: save_summary_steps
        "seed": 0,  # TF spelling: tf_random_seed
        # TF: train data parallel with a tf.distribute strategy (mirrored) over num_devices local
        # devices (common/tf/estimator/distribute.py); PyTorch runs data parallel through torchrun
        "train_distribute": Typed(None, (str,), ("mirrored", "multi_worker_mirrored")),
        "num_devices": Typed(None, (int,), range=AT_LEAST_1),
        # PyTorch: every dropout at rate 0, whatever the model's code says, to compare runs step by step
        # (common/pytorch/dropout_off.py); TF refuses it
        "disable_dropout": False,
    },
    "optimizer": {
        "optimizer_type": Typed("adam", (str,), KINDS),
        # a number, or a schedule: a dict {scheduler: ..., ...} or a list of them run in sequence
        "learning_rate": Typed(0.001, (float, dict, list), range=AT_LEAST_0),
        "momentum": Typed(0.9, (float,), range=UNIT_OPEN),
        "nesterov": False,
        "beta1": Typed(0.9, (float,), range=UNIT_OPEN),
        "beta2": Typed(0.999, (float,), range=UNIT_OPEN),
        "epsilon": Typed(1.0e-8, (float,), range=POSITIVE),
        # adam, adamw: divide the moments by 1 - beta^step (false: not, as the vendor's BERT configs ask)
        "correct_bias": True,
        "weight_decay": 0.0,
        # parameters whose name contains one of these get no weight decay (biases, norms)
        "weight_decay_exclude": ["bias", "norm"],
        "max_gradient_norm": Typed(None, (float,), range=POSITIVE),
        "max_gradient_value": Typed(None, (float,), range=POSITIVE),
        # 1.0 (none), a fixed number, or "dynamic"
        "loss_scaling_factor": Typed(1.0, (float, str), range=POSITIVE),
        "initial_loss_scale": Typed(DEFAULT_INITIAL_LOSS_SCALE, (float,), range=POSITIVE),
        "steps_per_increase": Typed(DEFAULT_STEPS_PER_INCREASE, (int,), range=AT_LEAST_1),
        "max_loss_scale": Typed(MAX_LOSS_SCALE, (float,), range=Range(1.0)),  # dynamic scaling grows no further
        # a learning_rate list: true: each schedule reads the global step (the vendor's key), not its own steps
        "disable_lr_steps_reset": False,
    },
    "mixed_precision": {
        "enabled": False,
        # bfloat16 on the CPU; float16 needs a GPU (or the emulator); cb16 exists on the device only
        "dtype": Typed("bfloat16", (str,), HALF_PRECISIONS),  # the device's 16-bit formats
    },
    "device": {
        # a profile of device/profiles.py: wse1, wse2, wse3, or the small test profiles
        "profile": "wse2",
        "execution_mode": Typed("pipelined", (str,), EXECUTION_MODES),
        # weight streaming: samples per pass over the layers (gradients accumulate over the passes);
        # null: the largest whose activations fit beside a weight tile (device/place.py)
        "micro_batch_size": Typed(None, (int,), range=AT_LEAST_1),
    },
}

# Each framework's original spelling -> the shared key (both are accepted; giving both is an error),
# and the vendor's spellings of this zoo's keys (common/vendor_keys.py).
ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("runconfig", "save_checkpoints_steps"): ("runconfig", "checkpoint_steps"),
    ("runconfig", "save_summary_steps"): ("runconfig", "log_steps"),
    ("runconfig", "tf_random_seed"): ("runconfig", "seed"),
    **SPELLINGS,
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
    """Plain dicts and lists again (for YAML dumps and for code that needs a mutable copy).

    Reads through ``dict.items`` itself, so that thawing tracked params (the vendor form
    below) to save them does not count as the model reading every key."""
    if isinstance(value, dict):
        return {k: thaw(v) for k, v in dict.items(value)}
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
                old = result[key]
                result[key] = Typed(value, old.types, old.choices, old.range)
            else:
                result[key] = copy.deepcopy(value)
    return result


def _default_value(spec: Any) -> Any:
    if isinstance(spec, Typed):
        return copy.deepcopy(spec.default)
    if isinstance(spec, Mapping):
        return {k: _default_value(v) for k, v in spec.items()}
    return copy.deepcopy(spec)


def shown(text: Any) -> str:
    """A key or a command-line argument as a user typed it, inside a one-line message: with
    its control characters (a newline, a tab) escaped, so that the message stays one line."""
    text = str(text)
    return text if text.isprintable() else repr(text)[1:-1]


def dotted(key_path: Iterable) -> str:
    """``('model', 'hidden_sizes', 1)`` -> ``model.hidden_sizes[1]``."""
    text = ""
    for part in key_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{shown(part)}" if text else shown(part))
    return text


# --- reading YAML with line numbers ---------------------------------------------------

def _lines_of(node: yaml.Node, path: tuple = (), out: dict | None = None) -> dict[tuple, int]:
    """Map each key path of a composed YAML document to its 1-based line (list items by index)."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key_path = path + (_key_of(key_node),)
            out[key_path] = key_node.start_mark.line + 1
            _lines_of(value_node, key_path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.setdefault(path + (i,), item.start_mark.line + 1)
            _lines_of(item, path + (i,), out)
    return out


def _key_of(node: yaml.Node) -> Any:
    """A mapping key as the loaded data holds it: ``0:`` is the int 0, ``true:`` True, not text."""
    if isinstance(node, yaml.ScalarNode) and node.tag != "tag:yaml.org,2002:str":
        try:
            return yaml.safe_load(yaml.serialize(node))
        except (yaml.YAMLError, TypeError):
            pass
    return node.value


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


BASE_KEY = "base"  # `base: params.yaml` at the top of a params file: only what differs is written


def _deep_update(target: dict, data: Mapping) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def read_params_file(path: str, _seen: tuple = ()) -> tuple[dict, dict[tuple, str]]:
    """A params file with its ``base`` files merged under it: the mapping, and ``file:line``
    of every key (each key where it was last set)."""
    data, lines = read_yaml(path)
    where = {key_path: f"{path}:{line}" for key_path, line in lines.items()}
    if BASE_KEY not in data:
        return data, where
    base = data.pop(BASE_KEY)
    if not isinstance(base, str):
        raise UserError(f"{where[(BASE_KEY,)]}: '{BASE_KEY}' must be the path of a params file, got {base!r}")
    base_path = os.path.normpath(os.path.join(os.path.dirname(path), base))
    if os.path.realpath(base_path) in _seen + (os.path.realpath(path),):
        raise UserError(f"{where[(BASE_KEY,)]}: '{BASE_KEY}: {base}' includes itself")
    if not os.path.isfile(base_path):
        raise UserError(f"{where[(BASE_KEY,)]}: base params file {base_path} not found")
    merged, merged_where = read_params_file(base_path, _seen + (os.path.realpath(path),))
    for alias, canonical in ALIASES.items():  # this file's spelling of a setting replaces the base's other one
        for mine, theirs in ((alias, canonical), (canonical, alias)):
            section = data.get(mine[0])  # not a mapping: _apply names it as the error it is
            if isinstance(section, dict) and mine[1] in section and isinstance(merged.get(theirs[0]), dict):
                merged[theirs[0]].pop(theirs[1], None)
    _deep_update(merged, data)
    for key_path in list(merged_where):  # a list or value replaced here loses the base's lines below it
        if any(key_path[:n] in where and not isinstance(_get(data, key_path[:n]), Mapping)
               for n in range(1, len(key_path))):
            del merged_where[key_path]
    merged_where.update({k: v for k, v in where.items() if k != (BASE_KEY,)})
    return merged, merged_where


def _get(data: Any, key_path: tuple) -> Any:
    for key in key_path:
        data = data[key] if isinstance(data, (Mapping, list)) else None
    return data


# --- validation -------------------------------------------------------------------------

def _all_paths(spec: Mapping, prefix: tuple = ()) -> list[tuple]:
    paths = []
    for key, value in spec.items():
        paths.append(prefix + (key,))
        if isinstance(value, Mapping):
            paths.extend(_all_paths(value, prefix + (key,)))
    return paths


def _closest(key_path: tuple, candidates: list[tuple]) -> str | None:
    """The dotted candidate closest to ``key_path``, or one with the same last component.

    Never the key's own section (nor a section above it): 'train_input.seed' is close to
    'train_input' as text, but the section is where the unknown key already is."""
    ancestors = {tuple(key_path[:i]) for i in range(1, len(key_path))}
    names = [".".join(map(str, p)) for p in candidates if tuple(p) not in ancestors]
    close = difflib.get_close_matches(".".join(map(str, key_path)), names, n=1, cutoff=0.6)
    if not close:  # the last component alone may match a key in another section
        leaf, leaves = str(key_path[-1]), [c.rsplit(".", 1)[-1] for c in names]
        near = [leaf] if leaf in leaves else difflib.get_close_matches(leaf, leaves, n=1, cutoff=0.75)
        close = [c for c in names if c.rsplit(".", 1)[-1] in near][:1]
    return close[0] if close else None


def _suggest(key_path: tuple, spec: Mapping) -> str:
    close = _closest(key_path, _all_paths(spec))
    return f" (did you mean '{close}'?)" if close else ""


def _type_name(types: Iterable[type]) -> str:
    return " or ".join("number" if t is float else "integer" if t is int else
                       "boolean" if t is bool else "string" if t is str else
                       "list" if t is list else "mapping" if t is dict else t.__name__ for t in types)


_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coerce(value: Any, types: tuple[type, ...], where: str, name: str) -> Any:
    """``value`` as one of ``types`` (an int widened where a float is expected) or a UserError."""
    if float in types and isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-3 (no dot) as a string; a user means the number
    for t in types:
        if t is float and _is_number(value):
            return float(value)
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t not in (float, int) and isinstance(value, t):
            return value
    kind = _type_name(types)
    article = "an" if kind[0] in "aeiou" else "a"
    raise UserError(f"{where}: '{name}' must be {article} {kind}, got {value!r}")


def _element_types(default: list) -> tuple[type, ...] | None:
    """The element type of a list default whose elements share one (ints, numbers, strings)."""
    kinds = {float if _is_number(v) and isinstance(v, float) else type(v) for v in default}
    if kinds == {int}:
        return (int,)
    if kinds <= {int, float} and kinds:
        return (float,)
    if kinds in ({str}, {bool}):
        return tuple(kinds)
    return None


def _check_type(value: Any, spec: Any, where_of, key_path: tuple) -> Any:
    """Return the value (ints widened to float where a float is expected) or raise; a list is
    checked element by element against the type of its default's elements."""
    name = dotted(key_path)
    where = where_of(key_path)
    if isinstance(spec, Typed):
        types, choices = spec.types, spec.choices
    elif spec is None:
        return value
    else:
        types, choices = (type(spec),), None
    if value is None and (spec is None or (isinstance(spec, Typed) and spec.default is None)):
        return value
    value = _coerce(value, types, where, name)
    if choices is not None and value not in choices:
        valid = ", ".join(map(str, choices))
        raise UserError(f"{where}: '{name}' must be one of {valid}, got {value!r}")
    if isinstance(value, list) and isinstance(spec, list) and (element := _element_types(spec)):
        value = [_coerce(v, element, where_of(key_path + (i,)), dotted(key_path + (i,))) for i, v in enumerate(value)]
    return value


def check_ranges(params: Mapping, spec: Mapping | None, where_of, path: tuple = ()) -> None:
    """Every number (and number in a list) within its Typed range, else the range its name
    implies (NAME_RULES); a UserError naming the key, where it was set and the bounds."""
    for key, value in params.items():
        key_path = path + (key,)
        leaf_spec = spec.get(key) if isinstance(spec, Mapping) else None
        if isinstance(value, Mapping):
            check_ranges(value, leaf_spec if isinstance(leaf_spec, Mapping) else None, where_of, key_path)
            continue
        bounds = leaf_spec.range if isinstance(leaf_spec, Typed) and leaf_spec.range else name_rule(str(key))
        if bounds is None:
            continue
        items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
        for i, item in items:
            if _is_number(item) and not bounds.admits(item):
                at = key_path if i is None else key_path + (i,)
                raise UserError(f"{where_of(at)}: '{dotted(at)}' must be {bounds}, got {item!r}")


def _apply(target: dict, spec: Mapping, data: Mapping, path: tuple, where_of, root: Mapping) -> None:
    """Copy ``data`` into ``target`` (defaults already there), checking keys and types.

    ``root`` is the whole spec, so that a misplaced key finds its match in another section.
    """
    for key, value in data.items():
        given = path + (key,)
        leaf = ALIASES.get(given, given)[-1]  # aliases stay within their section
        name = ".".join(map(shown, path + (leaf,)))
        if leaf not in spec and given in IGNORED:
            _ignore(given, value, where_of)
            continue
        if leaf not in spec:
            raise UserError(f"{where_of(given)}: unknown key '{'.'.join(map(shown, given))}'{_suggest(given, root)}")
        leaf_spec = spec[leaf]
        if isinstance(leaf_spec, Mapping):
            if not isinstance(value, Mapping):
                raise UserError(f"{where_of(given)}: '{name}' must be a mapping of keys, got {value!r}")
            _apply(target[leaf], leaf_spec, value, path + (leaf,), where_of, root)
        else:
            target[leaf] = _check_type(value, leaf_spec, lambda p, g=given: where_of(g + p[len(given):]),
                                       path + (leaf,))


def _ignore(key_path: tuple, value: Any, where_of) -> Any:
    """A vendor key that means nothing here (common/vendor_keys.py): its type checked, and named
    once (a warning where its value asks for something, else an info line); returns the value."""
    entry = IGNORED[key_path]
    value = _check_type(value, Typed(None, entry.types), where_of, key_path)
    named = getattr(where_of, "named", set())
    if key_path not in named:
        named.add(key_path)
        logger.log(logging.INFO if value in (None, False) else logging.WARNING, "%s: %s is ignored: %s",
                   where_of(key_path), dotted(key_path), entry.reason)
    return value


def _check_aliases(data: Mapping, where_of, allowed: Iterable[tuple] = ()) -> None:
    for alias, canonical in ALIASES.items():
        section = data.get(alias[0])
        if alias in allowed:
            continue
        if isinstance(section, Mapping) and alias[1] in section and canonical[1] in section:
            raise UserError(f"{where_of(alias)}: '{'.'.join(alias)}' and '{'.'.join(canonical)}' are the same "
                            f"setting; give only one")


def parse_override(text: str) -> tuple[tuple[str, ...], Any]:
    """``section.key=value`` (the value is read as YAML: 0.1, true, [500, 300], dynamic)."""
    if "=" not in text or text.startswith("="):
        raise UserError(f"command line: override '{shown(text)}' must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        raise UserError(f"command line: override '{shown(text)}': the value is not valid YAML") from None
    return tuple(key.strip().split(".")), value


def _nest(path: tuple, value: Any) -> dict:
    for key in reversed(path):
        value = {key: value}
    return value


class _Origins:
    """Where each key path was set: ``file:line``, ``command line '...'``, or the defaults."""

    def __init__(self):
        self.where: dict[tuple, str] = {}
        self.named: set[tuple] = set()  # the ignored vendor keys already named in the log

    def __call__(self, key_path: tuple) -> str:
        for n in range(len(key_path), 0, -1):  # a list item set on the command line: the override
            if key_path[:n] in self.where:
                return self.where[key_path[:n]]
        return "params defaults"

    def add_file(self, where: Mapping[tuple, str]) -> None:
        self.where.update(where)

    def add_override(self, key_path: tuple, text: str) -> None:
        for known in [k for k in self.where if k[:len(key_path)] == key_path]:
            del self.where[known]
        self.where[key_path] = f"command line '{shown(text)}'"


def _model_dir_spec(spec: dict, model_dir: str | None) -> None:
    if model_dir is not None and spec["runconfig"]["model_dir"].default is None:
        spec["runconfig"]["model_dir"] = Typed(model_dir, (str,))


def load_params(path: str | None, defaults: Mapping, overrides: Iterable[str] = (),
                model_dir: str | None = "model_dir") -> FrozenDict:
    """defaults -> the YAML file at ``path`` (and its base files) -> ``overrides`` ("a.b=value")
    -> validated, frozen params. ``model_dir`` is runconfig.model_dir when nothing sets it."""
    spec = merge_defaults(COMMON_DEFAULTS, defaults)
    _model_dir_spec(spec, model_dir)
    params = _default_value(spec)
    origins = _Origins()
    if path is not None:
        data, where = read_params_file(path)
        origins.add_file(where)
        _check_aliases(data, origins)
        _apply(params, spec, data, (), origins, spec)
    for text in overrides:
        key_path, value = parse_override(text)
        origins.add_override(key_path, text)
        _apply(params, spec, _nest(key_path, value), (), origins, spec)
    check_ranges(params, spec, origins)
    return freeze(params)


# --- the vendor's form: set_defaults(params) fills a plain dict in place -----------------

ZOO_SECTIONS = tuple(COMMON_DEFAULTS)

_SUMMARY_STEPS = (("runconfig", "save_summary_steps"), ("runconfig", "log_steps"))
# runconfig keys that configured the vendor's system or its runner (common/vendor_keys.py), by
# name, with why this zoo ignores them (the vendor's TF run_utils reads them)
VENDOR_SYSTEM_KEYS = {key: entry.reason for (section, key), entry in IGNORED.items() if section == "runconfig"}


def _vendor_spellings(zoo_data: dict, where_of) -> dict[str, dict]:
    """The vendor's optimizer_type spellings mapped in place, its runconfig's log_steps beside
    save_summary_steps made one, and its eval_steps of 0 or less (all) made None; returns, by
    section, the vendor's keys that mean nothing here (common/vendor_keys.py), taken out of
    ``zoo_data`` (each type checked and named once, with its line), for the code that reads them."""
    optimizer = zoo_data.get("optimizer")
    if isinstance(optimizer, dict):
        kind = optimizer.get("optimizer_type")
        if isinstance(kind, str):
            optimizer["optimizer_type"] = kind = kind.lower()  # the vendor's "SGD", "Adam", "AdamW"
            # the vendor's sgd takes its momentum from the same section: with one, it is this zoo's momentum
            if kind == "sgd" and optimizer.get("momentum"):
                optimizer["optimizer_type"] = "momentum"
    runconfig = zoo_data.get("runconfig")
    if isinstance(runconfig, dict):
        (vendor, ours) = (key for _, key in _SUMMARY_STEPS)
        if _is_number(runconfig.get(vendor)) and _is_number(runconfig.get(ours)):
            # the vendor's PyTorch runner logged every log_steps and wrote summaries every
            # save_summary_steps; here log_steps does both: at the shorter interval, so neither comes less often
            given = (runconfig.pop(vendor), runconfig[ours])
            runconfig[ours] = min(given)
            logger.info("%s, %s: runconfig.save_summary_steps: %s and log_steps: %s are one setting here, "
                        "runconfig.log_steps (the log line and the TensorBoard scalars): %s", where_of(
                            ("runconfig", vendor)), where_of(("runconfig", ours)), *given, runconfig[ours])
        eval_steps = runconfig.get("eval_steps")
        if _is_number(eval_steps) and eval_steps <= 0:
            runconfig["eval_steps"] = None
            logger.info("%s: runconfig.eval_steps: %s is the whole eval set (the vendor's meaning of 0 or less)",
                        where_of(("runconfig", "eval_steps")), eval_steps)
    ignored: dict[str, dict] = {}
    for section, data in zoo_data.items():
        if isinstance(data, dict):
            for key in [k for k in data if (section, k) in IGNORED]:
                ignored.setdefault(section, {})[key] = _ignore((section, key), data.pop(key), where_of)
    return ignored


class _ReadLog:
    """The key paths that code read from tracked params."""

    def __init__(self):
        self.paths: set[tuple] = set()
        self.reported = False


class TrackedDict(dict):
    """A plain, mutable dict that records which keys code reads (``params["model"]["x"]``,
    ``.get``, ``in``, ``setdefault``, ``pop``; iterating counts every key below; a copy or a
    deep copy goes on counting into the same record).

    Code written for the vendor's zoo gets its params as these: it may write keys into them,
    as the vendor's folders do, and what it ran with is what gets saved. The runner reports
    the keys of the params file that no model or data code read (``report_unused``)."""

    def __init__(self, data: Mapping, log: _ReadLog | None = None, path: tuple = ()):
        super().__init__()
        self._log, self._path = log or _ReadLog(), path
        for key, value in data.items():
            dict.__setitem__(self, key, self._wrap(key, value))

    def _wrap(self, key, value):
        if isinstance(value, Mapping) and not isinstance(value, TrackedDict):
            return TrackedDict(value, self._log, self._path + (key,))
        return value

    def _read(self, key) -> None:
        self._log.paths.add(self._path + (key,))

    def _read_all(self) -> None:
        for key, value in dict.items(self):
            self._read(key)
            if isinstance(value, TrackedDict):
                value._read_all()

    def __getitem__(self, key):
        self._read(key)
        return dict.__getitem__(self, key)

    def get(self, key, default=None):
        self._read(key)
        return dict.get(self, key, default)

    def __contains__(self, key) -> bool:
        self._read(key)
        return dict.__contains__(self, key)

    def setdefault(self, key, default=None):
        self._read(key)
        if not dict.__contains__(self, key):
            dict.__setitem__(self, key, self._wrap(key, default))
        return dict.__getitem__(self, key)

    def pop(self, key, *default):
        self._read(key)
        return dict.pop(self, key, *default)

    def __setitem__(self, key, value) -> None:
        dict.__setitem__(self, key, self._wrap(key, value))

    def update(self, *args, **kwargs) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __iter__(self):
        self._read_all()  # a loop over the keys, or **params: every key counts as read
        return dict.__iter__(self)

    def keys(self):
        self._read_all()
        return dict.keys(self)

    def items(self):
        self._read_all()
        return dict.items(self)

    def values(self):
        self._read_all()
        return dict.values(self)

    def copy(self) -> "TrackedDict":
        # a copy keeps counting into the same log: ``params["model"].copy()`` (as the vendor's
        # models do) reads nothing by itself
        return TrackedDict(dict(dict.items(self)), self._log, self._path)

    def __deepcopy__(self, memo):
        return TrackedDict(copy.deepcopy(thaw(self), memo), self._log, self._path)

    def __reduce__(self):
        return dict, (thaw(self),)

    def __repr__(self) -> str:
        return repr(thaw(self))


def defaults_form(default_params_fn) -> str:
    """"zoo": ``default_params() -> dict`` (the schema); "vendor": ``set_defaults(params[, mode])``,
    which fills the loaded params in place. Told apart by the signature, never by calling it."""
    if not callable(default_params_fn):
        raise UserError(f"default_params_fn must be a function, got {default_params_fn!r}")
    try:
        signature = inspect.signature(default_params_fn)
    except (TypeError, ValueError):  # a builtin such as dict: called with no argument
        return "zoo"
    positional = [p for p in signature.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        return "zoo"
    first = positional[0]
    if first.kind is first.VAR_POSITIONAL or first.default is first.empty:
        return "vendor"
    return "zoo"


def _accepts_mode(fn) -> bool:
    parameters = inspect.signature(fn).parameters
    return "mode" in parameters or any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def load_vendor_params(path: str | None, set_defaults, overrides: Iterable[str] = (), mode: str | None = None,
                       model_dir: str | None = "model_dir") -> TrackedDict:
    """The vendor's path: the YAML file -> overrides -> ``set_defaults(params[, mode=mode])`` (None: none),
    then the zoo's own sections (runconfig, optimizer, mixed_precision, device) validated as
    strictly as in the zoo's form, and every size, count and rate checked by name. The
    model's own sections stay as the file and set_defaults made them; the keys of the file
    that no model or data code reads are reported by ``report_unused``."""
    data, where = read_params_file(path) if path is not None else ({}, {})
    origins = _Origins()
    origins.add_file(where)
    _check_aliases(data, origins, allowed=[_SUMMARY_STEPS[0]])  # the vendor's PyTorch configs give both
    for text in overrides:
        key_path, value = parse_override(text)
        origins.add_override(key_path, text)
        target = data
        for key in key_path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[key_path[-1]] = value
    for section in ZOO_SECTIONS:
        if section in data and not isinstance(data[section], Mapping):
            raise UserError(f"{origins((section,))}: '{section}' must be a mapping of keys, got {data[section]!r}")
    log = _ReadLog()
    params = TrackedDict(data, log)
    kwargs = {"mode": mode} if set_defaults is not None and _accepts_mode(set_defaults) else {}
    returned = set_defaults(params, **kwargs) if set_defaults is not None else None  # None: the file as it is
    if returned is not None and returned is not params:
        if not isinstance(returned, Mapping):
            raise UserError(f"set_defaults returned {type(returned).__name__}; it must return the params "
                            f"(a mapping) or nothing")
        params = TrackedDict(returned, log)
    # the zoo's sections: validated against the common schema, alias spellings included
    spec = merge_defaults(COMMON_DEFAULTS)
    _model_dir_spec(spec, model_dir)
    validated = _default_value(spec)
    zoo_data = {s: thaw(dict.get(params, s)) for s in ZOO_SECTIONS if dict.get(params, s) is not None}
    system = _vendor_spellings(zoo_data, origins)
    _check_aliases(zoo_data, origins)
    model = dict.get(params, "model")
    vendor_mixed = isinstance(model, Mapping) and dict.get(model, "mixed_precision") is True
    if vendor_mixed and "enabled" not in zoo_data.get("mixed_precision", {}):
        # the vendor's model.mixed_precision: 16-bit compute, here on the CPU as on the emulator
        zoo_data.setdefault("mixed_precision", {})["enabled"] = True
        logger.info("model.mixed_precision: true is mixed_precision.enabled: true (16-bit compute in "
                    "mixed_precision.dtype, %s unless set, on the CPU and the emulator alike)",
                    zoo_data["mixed_precision"].get("dtype", "bfloat16"))
    _apply(validated, spec, zoo_data, (), origins, spec)
    for section, keys in system.items():
        validated[section].update(keys)  # for the code that reads them, as the vendor's runner left them
    for section in ZOO_SECTIONS:
        dict.__setitem__(params, section, TrackedDict(validated[section], log, (section,)))
    check_ranges(thaw(params), spec, origins)
    params._file_keys = {k: v for k, v in where.items() if k[0] not in ZOO_SECTIONS}  # type: ignore[attr-defined]
    log.paths.clear()  # what set_defaults read does not count as read by the model
    if vendor_mixed:
        log.paths.add(("model", "mixed_precision"))  # read here, as the vendor's runner read it
    return params


def fill_zoo_sections(params: dict) -> None:
    """A plain params dict that a vendor run.py loaded itself: the keys of the zoo's optimizer,
    mixed_precision and device sections that it leaves out, filled in place with their
    defaults (the device compiler reads them); what the file gives stays as given, for the
    model_fn that reads it."""
    defaults = _default_value(merge_defaults(COMMON_DEFAULTS))
    for section in ("optimizer", "mixed_precision", "device"):
        target = params.setdefault(section, {})
        if not isinstance(target, dict):
            raise UserError(f"params: '{section}' must be a mapping of keys, got {target!r}")
        for key, value in defaults[section].items():
            target.setdefault(key, value)


def report_unused(params: Mapping) -> list[str]:
    """Warn once about each key of the params file (outside the zoo's own sections, which are
    strict) that no model or data code has read; returns the warnings. A no-op for the
    zoo's frozen params, where every key is declared by the model's defaults."""
    if not isinstance(params, TrackedDict) or params._log.reported:
        return []
    params._log.reported = True
    read = params._log.paths
    file_keys = getattr(params, "_file_keys", {})
    # the leaves: keys holding a value, not a mapping (the items of a list are read with the list)
    leaves = [k for k in file_keys
              if not any(isinstance(part, int) for part in k)
              and not any(len(o) > len(k) and o[:len(k)] == k and isinstance(o[len(k)], str) for o in file_keys)]
    # an input section that no code touched belongs to another mode (eval_input in a train run)
    touched = {p[0] for p in read}
    warnings = []
    for key_path in sorted(leaves, key=lambda k: file_keys[k]):
        if key_path in read or (str(key_path[0]).endswith("_input") and key_path[0] not in touched):
            continue
        close = _closest(key_path, [p for p in read if p[0] not in ZOO_SECTIONS])
        hint = f" (did you mean '{close}'?)" if close else ""
        warnings.append(f"{file_keys[key_path]}: '{'.'.join(map(str, key_path))}' is never read by the model or "
                        f"data code{hint}")
    for line in warnings:
        logger.warning(line)
    return warnings


def save_params(params: Mapping, model_dir: str, mode: str) -> str:
    """Write the effective params to ``model_dir/params_<mode>.yaml`` (atomically)."""
    out = os.path.join(model_dir, f"params_{mode}.yaml")
    atomic_write_text(out, yaml.safe_dump(thaw(params), sort_keys=False, default_flow_style=None))
    return out
