"""The digit CNN's params: its keys and their defaults."""


def default_params() -> dict:
    return {
        "model": {"channels": 8},
        "train_input": {"batch_size": 32},
        "eval_input": {"batch_size": 40},
    }
