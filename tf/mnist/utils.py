"""tf/mnist's params: its own keys and the common defaults it changes.

The same keys and defaults as pytorch/mnist (pytorch/mnist/utils.py), except that the
input's parallelism is tf.data's ``num_parallel_calls`` where PyTorch has ``num_workers``.
"""

from common.data import DATASETS
from common.params import Typed

ACTIVATIONS = ("relu", "tanh", "elu", "selu", "linear")


# A deliberate twin of pytorch/mnist/utils.py (each model folder stands alone when copied);
# tests/test_model_folders.py checks that the two keep the same defaults.
def _input(shuffle: bool, batch_size: int) -> dict:
    return {
        "data_dir": "./data/mnist",  # a tfds-prepared mnist, or MNIST/raw IDX files; else the embedded digits
        "dataset": Typed("auto", (str,), DATASETS),  # auto: MNIST if data_dir holds it, else UCI digits
        "batch_size": batch_size,
        "shuffle": shuffle,
        "drop_last": True,  # batch(drop_remainder=True): static batch shapes, as the device needs
        "num_parallel_calls": 0,  # of the batch map; 0: tf.data.AUTOTUNE
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
