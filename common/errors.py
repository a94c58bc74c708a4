"""The one error type for bad user input: ``zoo_base/errors.py``, re-exported; and ``where``,
which names a user's function in such an error.

The classes live below both ``common/`` and ``device/`` so that the emulator raises the
same ``UserError`` without importing the runners; ``from common.errors import UserError``
is the very same class.
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from zoo_base.errors import NonFiniteGradient, NonFiniteLossError, UserError

__all__ = ["NonFiniteGradient", "NonFiniteLossError", "UserError", "where"]


def where(fn: Callable) -> str:
    """``name (file:line)`` of a user function (a model_fn, an input_fn, a data function), for
    error messages in both frameworks' runners: a functools.partial is named by the function
    it binds, a callable object by its class's __call__, a class by its ``class`` line."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    fn = inspect.unwrap(fn)
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    if isinstance(fn, type):  # a class: where its source says ``class``
        try:
            return f"{name} ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
        except (OSError, TypeError):  # defined in a shell, or built in
            return name
    # a function's own code, or an object's __call__'s (a builtin has neither; every class has a
    # __call__, its metaclass's at least)
    code = getattr(fn, "__code__", None) or getattr(type(fn).__call__, "__code__", None)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name
