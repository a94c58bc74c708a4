"""resolve_mnist: which MNIST-layout folder a run reads. Nothing is downloaded at run time:
a data_dir that holds no MNIST falls back to the embedded digits, with one log line.

check_set_data_dirs: the runners' check, before any data loads, that a data_dir the user set
exists where ``dataset: auto`` would otherwise fall back: a mistyped path is an error, not
a run on the embedded digits (the default data_dir, absent, still falls back)."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Callable, Collection, Mapping

from common.data.mnist.embedded import embedded_digits
from common.data.mnist.layout import ALL_FILES, DATASETS, MnistLocation, missing_files, mnist_location
from common.data.mnist.prepare import PREPARE_COMMAND
from common.errors import UserError

logger = logging.getLogger("common.data.mnist")


def resolve_mnist(data_dir: str, dataset: str = "auto") -> MnistLocation:
    """Which MNIST-layout folder to read, for both frameworks' data.py.

    dataset "auto": data_dir if it holds the four MNIST files (data_dir may also name its
    MNIST or MNIST/raw folder), else the embedded UCI digits with one log line saying so;
    "mnist": data_dir must hold them (UserError otherwise); "uci_digits": the embedded digits.
    """
    if dataset not in DATASETS:
        raise UserError(f"dataset {dataset!r} is unknown; valid: {', '.join(DATASETS)}")
    if dataset == "uci_digits":
        return embedded_digits()
    data_dir = os.fspath(data_dir) if data_dir else ""
    if data_dir and os.path.exists(data_dir) and not os.path.isdir(data_dir):
        # a file is never what was meant (an IDX or archive file named instead of its folder);
        # "auto" would otherwise fall back to the embedded digits and hide the mistake
        raise UserError(f"data_dir {data_dir} is a file, not a folder: give the folder that holds MNIST/raw "
                        f"(or that MNIST/raw folder itself)")
    root = _mnist_root(data_dir) if data_dir else None
    if root is not None:
        return mnist_location(root)
    expected = os.path.join(data_dir or "<data_dir>", "MNIST", "raw")
    if dataset == "mnist":
        prepare = PREPARE_COMMAND.format(data_dir or "<data_dir>")
        if not data_dir:
            raise UserError(f"dataset 'mnist' needs a data_dir holding {expected}; prepare one with: {prepare}")
        if not os.path.isdir(data_dir):
            raise UserError(
                f"data_dir {data_dir} does not exist (dataset 'mnist' reads {expected}); "
                f"prepare it with: {prepare}"
            )
        missing = os.path.join(expected, missing_files(data_dir)[0])
        raise UserError(f"data_dir {data_dir} has no {missing} (dataset 'mnist'); prepare it with: {prepare}")
    location = embedded_digits()
    missing = missing_files(data_dir) if data_dir else list(ALL_FILES)
    if len(missing) == len(ALL_FILES):
        what = "no MNIST"
    else:
        what = f"an incomplete MNIST (no {', '.join(missing)} in {expected})"
    logger.warning(
        "data: %s holds %s; using the embedded UCI handwritten digits (%s train / %s test, 28x28). "
        "For full MNIST run: %s",
        data_dir or "(no data_dir)",
        what,
        f"{location.num_train:,}",
        f"{location.num_test:,}",
        PREPARE_COMMAND.format(shlex.quote(os.path.abspath(data_dir)) if data_dir else "<data_dir>"),
    )
    return location


def check_set_data_dirs(params: Mapping, where_set: Callable[[tuple], str | None],
                        unread: Collection[str] = ()) -> None:
    """Each section of ``params`` with ``dataset: auto`` whose data_dir the user set and that
    does not exist: a UserError naming the key, the path and ``where_set((section, "data_dir"))``
    (a params file's ``file:line``, or the command line's override; None for a data_dir left
    at its default, which falls back to the embedded digits as before). The ``unread``
    sections are passed over (an eval reads no train_input: its data may be elsewhere)."""
    for section, values in dict.items(params):  # dict's own: a vendor-form read counts no key as read
        if section in unread or not isinstance(values, Mapping) or dict.get(values, "dataset") != "auto":
            continue
        data_dir = dict.get(values, "data_dir")
        if not isinstance(data_dir, (str, os.PathLike)) or not os.fspath(data_dir) or os.path.exists(data_dir):
            continue
        where = where_set((section, "data_dir"))
        if where is None:
            continue
        raise UserError(f"{where}: {section}.data_dir {os.fspath(data_dir)} does not exist; with dataset: auto the run "
                        f"would read the embedded UCI digits instead. Correct the path, prepare MNIST there "
                        f"(python datasets/prepare_mnist.py), or set {section}.dataset: uci_digits")


def _mnist_root(data_dir: str) -> str | None:
    """The torchvision root for data_dir: data_dir itself, or its grandparent/parent
    when data_dir names the MNIST/raw or MNIST folder; None when none holds all four."""
    path = Path(data_dir)
    candidates = [path]
    if path.name == "MNIST":
        candidates.append(path.parent)
    if path.name == "raw" and path.parent.name == "MNIST":
        candidates.append(path.parent.parent)
    for candidate in candidates:
        if not missing_files(str(candidate)):
            return str(candidate)
    return None
