"""The vendor's defaults form, ``set_defaults(params)``, beside the zoo's ``default_params()``."""

import copy
import logging

import pytest
import yaml

from common.errors import UserError
from common.params import defaults_form, load_vendor_params, report_unused, save_params


def write(tmp_path, text, name="params.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


VENDOR_YAML = """\
train_input:
  data_dir: ./data
  batch_size: 16
model:
  num_classes: 10
  hiden_size: 32
  dropout: 0.1
optimizer:
  optimizer_type: sgd
  learning_rate: 0.1
runconfig:
  max_steps: 20
  save_summary_steps: 5
"""


def set_defaults(params):
    """As the vendor's folders wrote it: fills in place, returns nothing."""
    params["model"].setdefault("hidden_size", 64)
    params["train_input"].setdefault("shuffle", True)


def test_the_two_forms_are_told_apart_by_signature():
    assert defaults_form(lambda: {}) == "zoo"
    assert defaults_form(lambda params=None: {}) == "zoo"
    assert defaults_form(set_defaults) == "vendor"
    assert defaults_form(lambda params, mode=None: params) == "vendor"
    assert defaults_form(lambda *args: None) == "vendor"

    def never_called(params):
        raise AssertionError("told apart without calling it")

    assert defaults_form(never_called) == "vendor"


def test_set_defaults_fills_in_place_and_the_zoo_sections_are_validated(tmp_path):
    params = load_vendor_params(write(tmp_path, VENDOR_YAML), set_defaults, ["model.dropout=0.2"])
    assert params["model"]["hidden_size"] == 64 and params["train_input"]["shuffle"] is True
    assert params["model"]["dropout"] == 0.2  # the override wins over the file and set_defaults
    assert params["runconfig"]["log_steps"] == 5  # the TF spelling, read as the shared key
    assert params["runconfig"]["checkpoint_steps"] == 1000  # a zoo default filled in
    assert params["optimizer"]["learning_rate"] == 0.1
    params["model"]["built_by_the_model"] = 3  # vendor model code writes keys into params
    assert params["model"]["built_by_the_model"] == 3


def test_set_defaults_may_return_the_params_or_a_new_mapping_and_gets_the_mode(tmp_path):
    path = write(tmp_path, VENDOR_YAML)
    seen = {}

    def tf_style(params, mode=None):
        seen["mode"] = mode
        out = copy.deepcopy(dict(params))
        out["model"] = {**params["model"], "extra": 1}
        return out

    params = load_vendor_params(path, tf_style, mode="eval")
    assert seen["mode"] == "eval" and params["model"]["extra"] == 1
    with pytest.raises(UserError, match="set_defaults returned int"):
        load_vendor_params(path, lambda params: 5)


def test_the_zoo_sections_stay_strict_in_the_vendor_form(tmp_path):
    path = write(tmp_path, VENDOR_YAML + "  max_stesp: 3\n")
    with pytest.raises(UserError) as e:
        load_vendor_params(path, set_defaults)
    assert str(e.value) == f"{path}:14: unknown key 'runconfig.max_stesp' (did you mean 'runconfig.max_steps'?)"
    with pytest.raises(UserError, match=r"params.yaml:3: 'train_input.batch_size' must be at least 1, got -3"):
        load_vendor_params(write(tmp_path, VENDOR_YAML.replace("16", "-3")), set_defaults)
    with pytest.raises(UserError, match="'runconfig' must be a mapping of keys, got 5"):
        load_vendor_params(path, set_defaults, ["runconfig=5"])

    def reads_runconfig(params):  # vendor code reaches into the zoo's sections too
        params["runconfig"].setdefault("max_steps", 10)

    # checked before set_defaults runs, which would otherwise stop at 5.setdefault with a traceback
    with pytest.raises(UserError, match="command line 'runconfig=5': 'runconfig' must be a mapping of keys, got 5"):
        load_vendor_params(path, reads_runconfig, ["runconfig=5"])


def test_keys_no_code_read_are_reported_with_line_and_closest_read_key(tmp_path, caplog):
    path = write(tmp_path, VENDOR_YAML)
    params = load_vendor_params(path, set_defaults)
    model = params["model"]
    _ = (model["num_classes"], model["hidden_size"], model.get("dropout"), params["train_input"]["batch_size"])
    _ = "data_dir" in params["train_input"]
    with caplog.at_level(logging.WARNING, logger="zoo"):
        warnings = report_unused(params)
    assert warnings == [f"{path}:6: 'model.hiden_size' is never read by the model or data code "
                        f"(did you mean 'model.hidden_size'?)"]
    assert caplog.messages == warnings
    assert report_unused(params) == []  # once per run


def test_reading_a_whole_section_counts_every_key_in_it(tmp_path):
    params = load_vendor_params(write(tmp_path, VENDOR_YAML), set_defaults)

    def build(num_classes, hiden_size, dropout, hidden_size):
        return num_classes

    build(**params["model"])
    for _key, _value in params["train_input"].items():
        pass
    assert report_unused(params) == []


def test_what_set_defaults_reads_does_not_count_and_saving_reads_nothing(tmp_path):
    def reads_everything(params):
        for section in params.values():
            dict(section)

    params = load_vendor_params(write(tmp_path, VENDOR_YAML), reads_everything)
    params["model"]["added"] = [1, 2]
    out = save_params(params, str(tmp_path / "md"), "train")
    saved = yaml.safe_load(open(out))
    assert saved["model"]["added"] == [1, 2] and saved["runconfig"]["log_steps"] == 5
    assert len(report_unused(params)) == 3  # every key of model (train_input, untouched, is another mode's)


def test_an_input_section_no_code_touched_belongs_to_another_mode(tmp_path):
    params = load_vendor_params(write(tmp_path, VENDOR_YAML + "eval_input:\n  batch_size: 8\n"), set_defaults)
    list(params["model"])
    params["train_input"]["batch_size"]  # a train run: eval_input untouched, train_input half read
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'train_input.data_dir' is never read by the model or data code (did you mean 'train_input.batch_size'?)"]


def test_a_copy_goes_on_counting_reads(tmp_path):
    params = load_vendor_params(write(tmp_path, VENDOR_YAML), set_defaults)
    model = params["model"].copy()  # as the vendor's models do
    deep = copy.deepcopy(params["train_input"])
    _ = (model["num_classes"], model["dropout"], deep["batch_size"], deep["data_dir"])
    model["hidden_size"] = 3  # the copy is the model's own: params keep set_defaults' value
    assert params["model"]["hidden_size"] == 64
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.hiden_size' is never read by the model or data code (did you mean 'model.hidden_size'?)"]
