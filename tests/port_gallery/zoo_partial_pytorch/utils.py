"""The ConvNet's params: its own keys and their defaults."""


def default_params():
    return {
        "model": {"channels": 32},
        "train_input": {"data_dir": "./data/fashion", "batch_size": 64},
        "eval_input": {"data_dir": "./data/fashion", "batch_size": 100},
    }
