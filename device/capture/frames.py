"""Which stack frames are the user's code: the folders both frontends skip.

A node's source line is the innermost frame of its stack outside the framework and
outside the zoo's own infrastructure: the runners (``common/``), the bottom package
(``zoo_base/``) and the emulator (``device/``). Those are found as the folders beside
``device/``, not by importing them: device/ imports nothing from the runners.
"""

from __future__ import annotations

import os

import device

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(device.__file__)))

# real paths, no trailing separator
ZOO_DIRS: tuple[str, ...] = tuple(os.path.join(_ROOT, name) for name in ("common", "device", "zoo_base"))
