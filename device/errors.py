"""Errors of the device compiler that the user can act on."""

from zoo_base.errors import UserError


class DeviceCompileError(UserError):
    """The graph cannot be compiled for the device: unsupported ops, or it does not fit.

    The message's first line says what failed; for a failed validation the following
    lines are the findings, one per line, each pointing at the user's file and line.
    """
