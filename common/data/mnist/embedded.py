"""The UCI handwritten digits committed in the repository, in MNIST's layout: the data a
run falls back to when its data_dir holds no MNIST (datasets/make_embedded_digits.py)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from common.data.mnist.layout import MnistLocation, missing_files, split_sizes
from common.data.mnist.prepare import PREPARE_SCRIPT
from common.errors import UserError

# The embedded digits live in the repository, found relative to this file: the zoo is
# installed editable (`pip install -e .`), so common/ stays inside the checkout and
# ../../../datasets is the checkout's datasets/ folder.
EMBEDDED_DIGITS_ROOT = Path(__file__).resolve().parents[3] / "datasets" / "embedded" / "uci_digits"
_REGENERATE_COMMAND = f"python {shlex.quote(str(PREPARE_SCRIPT.with_name('make_embedded_digits.py')))}"


def embedded_digits() -> MnistLocation:
    """The UCI handwritten digits committed under datasets/embedded/uci_digits."""
    root = str(EMBEDDED_DIGITS_ROOT)
    missing = missing_files(root)
    if missing:
        raise UserError(
            f"the embedded digits are missing: no {os.path.join(root, 'MNIST', 'raw', missing[0])} (they ship "
            f"with the repository; install the zoo from a checkout with `pip install -e .`, or regenerate them "
            f"with {_REGENERATE_COMMAND})"
        )
    num_train, num_test = split_sizes(root)
    return MnistLocation(
        root=root,
        kind="uci_digits",
        description=(
            f"embedded UCI handwritten digits ({num_train:,} train / {num_test:,} test, 28x28, upscaled from 8x8)"
        ),
        num_train=num_train,
        num_test=num_test,
    )
