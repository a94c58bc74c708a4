"""The bottom of the zoo: what both ``common/`` (the runners) and ``device/`` (the emulator) need.

    errors.py   UserError, NonFiniteLossError: bad input, reported in one line
    io.py       atomic file writes

It imports nothing from the zoo, so that ``device/`` can use it without importing the
runners (``common/`` re-exports both modules under their old names).
"""
