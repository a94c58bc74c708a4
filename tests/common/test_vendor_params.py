"""The vendor's defaults form, ``set_defaults(params)``, beside the zoo's ``default_params()``."""

import copy
import logging

import pytest
import yaml

from common.errors import UserError
from common.params import defaults_form, fill_zoo_sections, load_vendor_params, report_unused, save_params, thaw


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


# --- the vendor's spellings, its system keys and its model.mixed_precision ------------------

def test_the_vendors_optimizer_spellings_are_this_zoos(tmp_path):
    path = write(tmp_path, "optimizer:\n  optimizer_type: SGD\n  momentum: 0.8\n  weight_decay_rate: 0.01\n"
                           "  use_nesterov: true\nmodel: {}\n")
    optimizer = load_vendor_params(path, lambda params: None)["optimizer"]
    assert (optimizer["optimizer_type"], optimizer["momentum"], optimizer["weight_decay"], optimizer["nesterov"]) == (
        "momentum", 0.8, 0.01, True)  # the vendor's sgd with a momentum is this zoo's momentum
    assert "weight_decay_rate" not in dict(optimizer) and "use_nesterov" not in dict(optimizer)
    optimizer = load_vendor_params(write(tmp_path, "optimizer:\n  optimizer_type: SGD\n"), lambda p: None)["optimizer"]
    assert optimizer["optimizer_type"] == "sgd"  # no momentum given: plain sgd
    assert load_vendor_params(None, lambda p: None, ["optimizer.optimizer_type=AdamW"])["optimizer"][
        "optimizer_type"] == "adamw"
    both = write(tmp_path, "optimizer:\n  weight_decay: 0.1\n  weight_decay_rate: 0.01\n")
    with pytest.raises(UserError) as e:
        load_vendor_params(both, lambda params: None)
    assert str(e.value) == (f"{both}:3: 'optimizer.weight_decay_rate' and 'optimizer.weight_decay' are the same "
                            f"setting; give only one")


def test_the_vendors_system_keys_are_kept_and_warned_about_once_each(tmp_path, caplog):
    path = write(tmp_path, "model: {}\nruncon" + "fig:\n  max_steps: 3\n  cs_ip: 10.0.0.1\n  save_losses: false\n"
                           "  mode: eval\n")
    with caplog.at_level(logging.WARNING, logger="zoo"):
        params = load_vendor_params(path, lambda params: None)
    assert caplog.messages == [
        f"{path}:4: runconfig.cs_ip is ignored: it configures the vendor's system; --device picks cpu, gpu or "
        f"emulator here",
        f"{path}:6: runconfig.mode is ignored: --mode sets the mode here"]  # save_losses: false asks for nothing
    assert (params["runconfig"]["cs_ip"], params["runconfig"]["save_losses"], params["runconfig"]["mode"],
            params["runconfig"]["max_steps"]) == ("10.0.0.1", False, "eval", 3)


def test_the_vendors_model_mixed_precision_is_mixed_precision_enabled(tmp_path, caplog):
    def set_defaults_new(params):  # returns a new mapping: its reads go on counting
        return {**params, "model": {**params["model"]}}

    path = write(tmp_path, "model:\n  mixed_precision: true\n  units: 3\n")
    for set_defaults_fn in (lambda params: None, set_defaults_new):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="zoo"):
            params = load_vendor_params(path, set_defaults_fn)
        assert params["mixed_precision"]["enabled"] is True
        assert "model.mixed_precision: true is mixed_precision.enabled: true (16-bit compute in mixed_precision." \
               "dtype, bfloat16 unless set, on the CPU and the emulator alike)" in caplog.messages
        assert [w.split(": ", 1)[1] for w in report_unused(params)] == [  # mixed_precision was read, units not
            "'model.units' is never read by the model or data code"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        load_vendor_params(path, lambda params: None, ["mixed_precision.dtype=float16"])
    assert any("in mixed_precision.dtype, float16 unless set" in m for m in caplog.messages)
    off = load_vendor_params(path, lambda params: None, ["mixed_precision.enabled=false"])
    assert off["mixed_precision"]["enabled"] is False  # the zoo's own key, given, wins
    assert load_vendor_params(path, lambda params: None, ["model.mixed_precision=false"])[
        "mixed_precision"]["enabled"] is False


def test_the_vendor_forms_file_overrides_and_defaults(tmp_path):
    params = load_vendor_params(None, lambda params: None, ["model.encoder.depth=2", "train_input.batch_size=4"])
    assert thaw(params["model"]) == {"encoder": {"depth": 2}} and params["train_input"]["batch_size"] == 4
    assert params["runconfig"]["model_dir"] == "model_dir"
    assert load_vendor_params(None, lambda p: None, model_dir="model_dir/tf_x")["runconfig"]["model_dir"] == \
        "model_dir/tf_x"
    path = write(tmp_path, VENDOR_YAML)
    params = load_vendor_params(path, set_defaults, ["model.dropout=0.3"])
    assert (params["model"]["num_classes"], params["model"]["dropout"]) == (10, 0.3)  # the file's other keys stay
    with pytest.raises(UserError) as e:  # a range of the zoo's schema, not only of the key's name
        load_vendor_params(path, set_defaults, ["optimizer.epsilon=0"])
    assert str(e.value) == "command line 'optimizer.epsilon=0': 'optimizer.epsilon' must be greater than 0, got 0.0"
    both = write(tmp_path, VENDOR_YAML + "  checkpoint_steps: 5\n  save_checkpoints_steps: 6\n", name="both.yaml")
    with pytest.raises(UserError) as e:
        load_vendor_params(both, set_defaults)
    assert str(e.value) == (f"{both}:15: 'runconfig.save_checkpoints_steps' and 'runconfig.checkpoint_steps' are "
                            f"the same setting; give only one")

    def adds_the_alias(params):
        params["runconfig"]["save_checkpoints_steps"] = 7

    with pytest.raises(UserError) as e:
        load_vendor_params(path, adds_the_alias, ["runconfig.checkpoint_steps=5"])
    assert str(e.value) == (f"{path}:11: 'runconfig.save_checkpoints_steps' and 'runconfig.checkpoint_steps' "
                            f"are the same setting; give only one")  # set_defaults' key: its section's line


def test_reads_of_the_zoo_sections_are_never_offered_for_an_unread_key(tmp_path):
    params = load_vendor_params(write(tmp_path, "model:\n  max_step: 3\n"), lambda params: None)
    _ = params["runconfig"]["max_steps"]
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.max_step' is never read by the model or data code"]


def test_tracked_params_behave_as_a_dict_and_count_what_is_read(tmp_path):
    import pickle

    from common.params import TrackedDict

    params = load_vendor_params(write(tmp_path, VENDOR_YAML + "  keep_checkpoint_max: 2\n"
                                     "eval_input:\n  data_dir: ./eval\n"), set_defaults)
    params["model"]["extra"] = {"a": 1}
    model = params["model"]
    assert model.pop("hiden_size") == 32 and "hiden_size" not in dict(model) and model.pop("absent", 7) == 7
    model.update({"encoder": {"depth": 2}}, units=4)
    assert isinstance(model["encoder"], TrackedDict) and model["units"] == 4
    assert (model.get("num_classes"), model.get("missing"), model.get("missing", 3)) == (10, None, 3)
    assert model.setdefault("dropout", 0.5) == 0.1 and model.setdefault("extras", {"b": 2}) == {"b": 2}
    assert isinstance(model["extras"], TrackedDict) and model["extras"]["b"] == 2
    train = params["train_input"]
    assert repr(train) == repr({"data_dir": "./data", "batch_size": 16, "shuffle": True})  # reads nothing
    restored = pickle.loads(pickle.dumps(train))
    assert type(restored) is dict and restored == {"data_dir": "./data", "batch_size": 16, "shuffle": True}
    assert train.setdefault("shuffle", False) is True  # the section is touched, by setdefault alone
    assert params["eval_input"].get("data_dir") == "./eval"
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'train_input.data_dir' is never read by the model or data code (did you mean 'eval_input.data_dir'?)",
        "'train_input.batch_size' is never read by the model or data code (did you mean 'train_input.shuffle'?)"]


def test_a_key_set_by_setdefault_counts_its_reads_under_its_own_name(tmp_path):
    params = load_vendor_params(write(tmp_path, "model:\n  extra:\n    a: 1\n"), lambda params: None)
    assert params["model"].setdefault("extras", {"a": 2})["a"] == 2  # 'extra' misspelt in the file
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.extra.a' is never read by the model or data code (did you mean 'model.extras.a'?)"]


def test_in_tells_whether_a_key_is_there_and_counts_as_a_read(tmp_path):
    params = load_vendor_params(write(tmp_path, "model:\n  units: 3\n  depth: 2\n"), lambda params: None)
    assert "units" in params["model"] and "width" not in params["model"]
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.depth' is never read by the model or data code (did you mean 'model.width'?)"]


def test_a_mapping_set_by_item_counts_its_reads_under_its_own_name(tmp_path):
    params = load_vendor_params(write(tmp_path, "model:\n  extra:\n    a: 1\n"), lambda params: None)
    params["model"]["extras"] = {"a": 2}  # 'extra' misspelt in the file
    assert params["model"]["extras"]["a"] == 2
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.extra.a' is never read by the model or data code (did you mean 'model.extras.a'?)"]


def test_a_mapping_of_the_base_file_replaced_by_a_value_leaves_no_keys_behind(tmp_path):
    write(tmp_path, "model:\n  units: 3\n  encoder:\n    depth: 2\n  unused: 1\n", name="base.yaml")
    params = load_vendor_params(write(tmp_path, "base: base.yaml\nmodel:\n  encoder: 5\n"), lambda params: None)
    assert (params["model"]["units"], params["model"]["encoder"]) == (3, 5)
    assert report_unused(params) == [f"{tmp_path / 'base.yaml'}:5: 'model.unused' is never read by the model or "
                                     "data code (did you mean 'model.units'?)"]
    write(tmp_path, "data:\n  path: ./data\n", name="base.yaml")  # a whole section replaced by a value
    params = load_vendor_params(write(tmp_path, "base: base.yaml\ndata: none\n"), lambda params: None)
    assert params["data"] == "none" and report_unused(params) == []


def test_fill_zoo_sections_fills_what_a_vendor_run_py_left_out():
    params = {"optimizer": {"learning_rate": 0.5}, "model": {"units": 3}}
    fill_zoo_sections(params)
    assert params["optimizer"]["learning_rate"] == 0.5 and params["optimizer"]["optimizer_type"] == "adam"
    assert params["mixed_precision"] == {"enabled": False, "dtype": "bfloat16"}
    assert params["device"] == {"profile": "wse2", "execution_mode": "pipelined", "micro_batch_size": None}
    assert params["model"] == {"units": 3} and "runconfig" not in params
    with pytest.raises(UserError) as e:
        fill_zoo_sections({"device": 5})
    assert str(e.value) == "params: 'device' must be a mapping of keys, got 5"


def test_defaults_form_of_a_builtin_and_of_no_function():
    assert defaults_form(dict) == "zoo"  # no signature to read: called with no argument
    with pytest.raises(UserError) as e:
        defaults_form(5)
    assert str(e.value) == "default_params_fn must be a function, got 5"


def test_list_items_and_sections_are_not_keys_of_their_own(tmp_path):
    from common.params import TrackedDict

    assert report_unused(TrackedDict({"model": {"a": 1}})) == []  # built by hand: no file keys
    params = load_vendor_params(write(tmp_path, "model:\n  sizes: [1, 2]\n  encoder:\n    depth: 2\n  width: 3\n"),
                                lambda params: None)
    _ = (params["model"]["sizes"], params["model"]["encoder"]["depth"])
    assert [w.split(": ", 1)[1] for w in report_unused(params)] == [
        "'model.width' is never read by the model or data code (did you mean 'model.sizes'?)"]
