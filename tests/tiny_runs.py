"""What the model folders' tests share: a folder's run.py called in-process on a config, the
data overrides of a prepared folder, and the training losses a run wrote to TensorBoard.

    train_tiny = tiny_runner(GPT2, TINY)
    train_tiny(tmp_path, "--mode", "train", *with_data(data_dir))
    assert train_losses(tmp_path)[-1] < train_losses(tmp_path)[0]
"""

from __future__ import annotations

import os

from common.folder import load_run_module
from common.summaries import read_scalars


def with_data(folder, *overrides) -> tuple[str, ...]:
    """The overrides that point both inputs at the prepared data ``folder``, then ``overrides``."""
    return (f"train_input.data_dir={folder}", f"eval_input.data_dir={folder}", *overrides)


def tiny_runner(folder: str, params: str):
    """``run(model_dir, *argv)``: the folder's run.py main() on ``params`` with that model_dir and
    the further command-line words ``argv``; it returns what main() returns (eval: the metrics)."""

    def run(model_dir, *argv):
        return load_run_module(folder).main(["--params", params, "--model_dir", str(model_dir), *argv])

    return run


def train_losses(model_dir) -> list[float]:
    """The training losses the run in ``model_dir`` logged, in step order."""
    return [v for _, v in read_scalars(os.path.join(str(model_dir), "train"))["loss"]]
