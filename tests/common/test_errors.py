"""common/errors.py: ``where`` names a user's function in both runners' one-line errors."""

import functools

from common.errors import UserError, where
from zoo_base.errors import UserError as BaseUserError


def model_fn(params, device):
    return None


class CallableModelFn:
    def __call__(self, params, device):
        return None


def decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)
    return wrapper


LINE = model_fn.__code__.co_firstlineno


def test_a_function_is_named_with_its_file_and_line():
    assert where(model_fn) == f"model_fn ({__file__}:{LINE})"
    assert where(decorated(model_fn)) == f"model_fn ({__file__}:{LINE})"  # functools.wraps: the user's own


def test_a_partial_is_named_by_the_function_it_binds():
    assert where(functools.partial(model_fn, {})) == f"model_fn ({__file__}:{LINE})"
    assert where(functools.partial(functools.partial(model_fn), {})) == f"model_fn ({__file__}:{LINE})"


def test_a_callable_object_is_named_by_its_class_and_its_call():
    call_line = CallableModelFn.__call__.__code__.co_firstlineno
    assert where(CallableModelFn()) == f"CallableModelFn ({__file__}:{call_line})"
    assert where(CallableModelFn.__call__) == f"CallableModelFn.__call__ ({__file__}:{call_line})"


def test_a_class_is_named_by_its_class_line():
    assert where(CallableModelFn) == f"CallableModelFn ({__file__}:{CallableModelFn.__call__.__code__.co_firstlineno - 1})"


def test_a_builtin_or_anything_else_has_its_name_alone():
    assert where(len) == "len"
    assert where(int) == "int"
    assert where(42) == "int"  # not callable at all: what was handed in, by its type
    assert where(type("Made", (), {})) == "Made"  # a class with no ``class`` line to point at


def test_the_error_type_is_the_one_below_common_and_device():
    assert UserError is BaseUserError and UserError.exit_code == 2
