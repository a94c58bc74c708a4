"""The digit CNN's params: its keys and their defaults."""


def default_params() -> dict:
    return {
        "model": {"channels": 8, "dropout": 0.1},
        "train_input": {"batch_size": 32, "shuffle": True, "drop_last": True},
        "eval_input": {"batch_size": 40, "shuffle": False, "drop_last": True},
    }
