"""Test-wide set-up.

torch must be imported before TensorFlow in a process that holds both: importing
TensorFlow first and then anything that loads triton (torchvision, torch.compile)
crashes. Importing torch here, first, when it is installed, makes the order right for
every test module. The decoupled environments (tox -e tf, tox -e pytorch) have one
framework only; there this is a no-op.
"""

import importlib.util
import logging
import os

import pytest

from tests import passed_once

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401  (import order: torch before tensorflow)
    # torch.optim's first step loads torch._dynamo (and with it triton) lazily: load it now,
    # before any test imports TensorFlow, or that first step crashes the process.
    import torch._dynamo  # noqa: F401


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/ from the models' current lowered graphs")
    passed_once.add_options(parser)  # tox runs each test once, where it needs the fewest frameworks


def pytest_configure(config):
    passed_once.register(config)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """A run's set-up (common/cli.py: setup_logging) points the root logger at the sys.stderr of
    the moment, in a test the capture stream that closes with it, and may leave the "zoo" logger
    at INFO: after each test, drop the handlers that basicConfig added and put the levels back, so
    that a later test's log line meets no closed stream ("Logging error") and no stray level."""
    root, zoo = logging.getLogger(), logging.getLogger("zoo")
    handlers, levels = list(root.handlers), (root.level, zoo.level)
    yield
    for handler in list(root.handlers):
        if type(handler) is logging.StreamHandler and handler not in handlers:  # pytest's own are subclasses
            root.removeHandler(handler)
    root.setLevel(levels[0])
    zoo.setLevel(levels[1])
