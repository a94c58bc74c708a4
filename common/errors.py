"""The one error type for bad user input: ``zoo_base/errors.py``, re-exported.

The classes live below both ``common/`` and ``device/`` so that the emulator raises the
same ``UserError`` without importing the runners; ``from common.errors import UserError``
is the very same class.
"""

from zoo_base.errors import NonFiniteGradient, NonFiniteLossError, UserError

__all__ = ["NonFiniteGradient", "NonFiniteLossError", "UserError"]
