"""Test-wide set-up.

torch must be imported before TensorFlow in a process that holds both: importing
TensorFlow first and then anything that loads triton (torchvision, torch.compile)
crashes. Importing torch here, first, when it is installed, makes the order right for
every test module. The decoupled environments (tox -e tf, tox -e pytorch) have one
framework only; there this is a no-op.
"""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

if importlib.util.find_spec("torch") is not None:
    import torch  # noqa: F401  (import order: torch before tensorflow)
    # torch.optim's first step loads torch._dynamo (and with it triton) lazily: load it now,
    # before any test imports TensorFlow, or that first step crashes the process.
    import torch._dynamo  # noqa: F401


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/ from the models' current lowered graphs")
