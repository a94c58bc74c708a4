"""The vendor compiler's settings, for folder code that fills them in where no vendor system is installed.

A folder of the vendor's TF zoo builds its system's compiler settings in utils.py
(``get_custom_stack_params``): a ``FullConfig`` protobuf whose nested fields it sets
(``config.matching.kernel.inc_pwt_estimate = True``) or appends to
(``config.matching.match_lair.disabled_converters.append(...)``), with the values of the
compiler's enums (``AP_ENABLED``, ``TS_DISABLED``, ``cb_types.T_F16``), and hands it to
``CSRunConfig(stack_params=...)``, which names it once as ignored here (common/tf/estimator/
run_config.py). The vendor's code imports these behind a ``try``, and off its system the names
are left undefined, so its ``--validate_only`` and ``--compile_only`` stopped at a NameError;
``zoo port migrate`` imports them from here instead. ``FullConfig`` takes any setting and keeps
it (``settings()``); this zoo's compiler (device/) reads none of them. Nothing here imports
TensorFlow.
"""

from __future__ import annotations

from typing import Any

# the compiler's enum values, by name (the system's numbers mean nothing here)
AP_ENABLED = "AP_ENABLED"  # autogen policy
AP_DISABLED = "AP_DISABLED"
TS_ENABLED = "TS_ENABLED"  # tri-state
TS_DISABLED = "TS_DISABLED"


class FullConfig:
    """A settings tree: a field read is a subtree, a field set is kept, a subtree takes ``append``/``extend``
    as a repeated field does."""

    def __init__(self, path: str = "") -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_fields", {})
        object.__setattr__(self, "_items", [])

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # Python's own probes (copy, pickle) get the usual answer
            raise AttributeError(name)
        fields = object.__getattribute__(self, "_fields")
        if name not in fields:
            fields[name] = FullConfig(f"{self._path}.{name}" if self._path else name)
        return fields[name]

    def __setattr__(self, name: str, value: Any) -> None:
        self._fields[name] = value

    def append(self, value: Any) -> None:
        self._items.append(value)

    def extend(self, values) -> None:
        self._items.extend(values)

    def settings(self) -> dict[str, Any]:
        """Every setting made, by its dotted path (a repeated field: the list of its items)."""
        out: dict[str, Any] = {}
        if self._items:
            out[self._path] = list(self._items)
        for value in self._fields.values():
            if isinstance(value, FullConfig):
                out.update(value.settings())
        for name, value in self._fields.items():
            if not isinstance(value, FullConfig):
                out[f"{self._path}.{name}" if self._path else name] = value
        return out


class cerebras_types:  # noqa: N801 (the vendor's module, imported as cb_types)
    """The compiler's data types (``cb_types.T_F16``, ``T_CB16``, ...), by name."""

    T_F16 = "T_F16"
    T_CB16 = "T_CB16"
    T_BF16 = "T_BF16"
    T_F32 = "T_F32"
