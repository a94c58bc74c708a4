"""main.py's argparse settings as params: each key the model and data code read, with its default."""
from common.data import DATASETS
from common.params import Typed


def _input(batch_size: int, shuffle: bool) -> dict:
    return {"data_dir": "./data/mnist", "dataset": Typed("auto", (str,), DATASETS), "batch_size": batch_size,
            "shuffle": shuffle, "drop_last": True}


def default_params() -> dict:
    return {
        "model": {"dropout1": 0.25, "dropout2": 0.5},
        "train_input": _input(64, shuffle=True),  # --batch-size
        "eval_input": _input(40, shuffle=False),  # --test-batch-size: 40 divides the 360 embedded test digits
        "optimizer": {"optimizer_type": "adam", "learning_rate": 0.001},  # Adadelta has no device update rule
        "runconfig": {"max_steps": 1000, "log_steps": 10, "seed": 1},  # --log-interval, --seed
    }
