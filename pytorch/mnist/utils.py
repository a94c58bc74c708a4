"""pytorch/mnist's params: its own keys and the common defaults it changes.

The TF mnist (tf/mnist/utils.py) has the same keys and the same defaults, but for the
input's num_workers (tf.data's num_parallel_calls there).
"""

from common.data import DATASETS
from common.params import Typed

ACTIVATIONS = ("relu", "tanh", "elu", "selu", "linear")


# A deliberate twin of tf/mnist/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(shuffle: bool, batch_size: int) -> dict:
    return {
        "data_dir": "./data/mnist",  # holds MNIST/raw (datasets/prepare_mnist.py); else the embedded digits
        "dataset": Typed("auto", (str,), DATASETS),  # auto: MNIST if data_dir holds it, else UCI digits
        "batch_size": batch_size,
        "shuffle": shuffle,
        "drop_last": True,  # static batch shapes, as the device needs
        "num_workers": 0,
    }


def default_params() -> dict:
    return {
        "model": {
            "hidden_sizes": [500, 300],
            "dropout": 0.2,
            "activation_fn": Typed("relu", (str,), ACTIVATIONS),
        },
        "train_input": _input(shuffle=True, batch_size=256),
        # 40 divides both test sets (360 embedded digits, 10,000 MNIST): drop_last drops none
        "eval_input": _input(shuffle=False, batch_size=40),
        "optimizer": {"optimizer_type": "adam", "learning_rate": 0.001},
        "runconfig": {
            "max_steps": 1000,
            "checkpoint_steps": 500,
            "log_steps": 100,
            "keep_checkpoint_max": 2,
            "seed": 0,
        },
    }
