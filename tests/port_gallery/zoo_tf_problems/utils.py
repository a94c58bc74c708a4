"""Defaults in the vendor's form: filled into the loaded params."""


def set_defaults(params, mode=None):
    params["model"].setdefault("hidden_units", [256, 128])
    for section in ("train_input", "eval_input"):
        params[section].setdefault("batch_size", 128)
    return params
