"""train.py's settings as params: each key the model and data code read, with its default."""
from common.data import DATASETS
from common.params import Typed


def _input(batch_size: int) -> dict:
    return {"data_dir": "./data/mnist", "dataset": Typed("auto", (str,), DATASETS), "batch_size": batch_size}


def default_params() -> dict:
    return {
        "model": {"hidden_units": 128, "dropout": 0.2},
        "train_input": _input(32),  # fit's default batch size
        "eval_input": _input(40),  # 40 divides the 360 embedded test digits
        "optimizer": {"optimizer_type": "adam", "learning_rate": 0.001},  # compile(optimizer="adam")
    }
