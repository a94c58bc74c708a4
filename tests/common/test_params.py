"""The strict config path: defaults -> YAML -> overrides -> validated, frozen params."""

import numpy as np
import pytest
import yaml

from common.errors import UserError
from common.params import load_params, save_params

MODEL_DEFAULTS = {"model": {"hidden_sizes": [500, 300], "dropout": 0.2, "activation_fn": "relu"},
                  "train_input": {"batch_size": 256, "shuffle": True}}


def write(tmp_path, text, name="params.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_defaults_file_then_overrides(tmp_path):
    path = write(tmp_path, "model:\n  dropout: 0.5\nrunconfig:\n  max_steps: 7\n")
    params = load_params(path, MODEL_DEFAULTS, ["runconfig.max_steps=9", "model.hidden_sizes=[4, 2]"])
    assert params["model"]["dropout"] == 0.5  # the file beats the default
    assert params["runconfig"]["max_steps"] == 9  # the command line beats the file
    assert params["model"]["hidden_sizes"] == (4, 2)
    assert params["train_input"]["batch_size"] == 256  # untouched default
    assert params["optimizer"]["optimizer_type"] == "adam"  # common default


def test_int_is_accepted_for_float_and_stored_as_float(tmp_path):
    params = load_params(write(tmp_path, "model:\n  dropout: 0\n"), MODEL_DEFAULTS)
    assert params["model"]["dropout"] == 0.0 and isinstance(params["model"]["dropout"], float)


def test_unknown_key_names_file_line_and_suggestion(tmp_path):
    path = write(tmp_path, "model:\n  dropout: 0.1\n  hiden_sizes: [1]\n")
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS)
    assert str(e.value) == f"{path}:3: unknown key 'model.hiden_sizes' (did you mean 'model.hidden_sizes'?)"


def test_key_in_the_wrong_section_suggests_its_section(tmp_path):
    path = write(tmp_path, "model:\n  max_steps: 3\n")
    with pytest.raises(UserError, match=r":2: unknown key 'model.max_steps' \(did you mean 'runconfig.max_steps'\?\)"):
        load_params(path, MODEL_DEFAULTS)


def test_an_unknown_key_is_never_offered_its_own_section(tmp_path):
    # 'train_input.seed' is close to 'train_input' as text; the section is where it already is
    path = write(tmp_path, "train_input:\n  seed: 3\n")
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS)
    assert "unknown key 'train_input.seed'" in str(e.value)
    assert "did you mean 'train_input'?" not in str(e.value)


def test_a_misspelt_section_is_offered_the_section(tmp_path):
    path = write(tmp_path, "trian_input:\n  batch_size: 3\n")
    with pytest.raises(UserError, match=r"unknown key 'trian_input' \(did you mean 'train_input'\?\)"):
        load_params(path, MODEL_DEFAULTS)


def test_wrong_type_names_key_and_line(tmp_path):
    path = write(tmp_path, "runconfig:\n  max_steps: ten\n")
    with pytest.raises(UserError, match=r"params.yaml:2: 'runconfig.max_steps' must be an integer, got 'ten'"):
        load_params(path, MODEL_DEFAULTS)


def test_bool_is_not_an_integer(tmp_path):
    with pytest.raises(UserError, match="must be an integer"):
        load_params(write(tmp_path, "runconfig:\n  seed: true\n"), MODEL_DEFAULTS)


def test_choices_are_enforced(tmp_path):
    with pytest.raises(UserError, match="must be one of sgd, momentum, adam, adamw, got 'rmsprop'"):
        load_params(None, MODEL_DEFAULTS, ["optimizer.optimizer_type=rmsprop"])


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = write(tmp_path, "model:\n  dropout: [0.1\nrunconfig: {}\n")
    with pytest.raises(UserError, match=r"params.yaml:\d+: malformed YAML"):
        load_params(path, MODEL_DEFAULTS)


def test_unsafe_yaml_tag_is_rejected(tmp_path):
    path = write(tmp_path, "model:\n  dropout: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(UserError, match="malformed YAML"):
        load_params(path, MODEL_DEFAULTS)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match="nope.yaml: params file not found"):
        load_params(str(tmp_path / "nope.yaml"), MODEL_DEFAULTS)


def test_framework_spellings_are_aliases(tmp_path):
    path = write(tmp_path, "runconfig:\n  save_checkpoints_steps: 5\n  tf_random_seed: 3\n  save_summary_steps: 2\n")
    params = load_params(path, MODEL_DEFAULTS)
    assert (params["runconfig"]["checkpoint_steps"], params["runconfig"]["seed"], params["runconfig"]["log_steps"]) == (5, 3, 2)


def test_alias_and_shared_spelling_together_is_an_error(tmp_path):
    path = write(tmp_path, "runconfig:\n  checkpoint_steps: 5\n  save_checkpoints_steps: 6\n")
    with pytest.raises(UserError, match="are the same setting"):
        load_params(path, MODEL_DEFAULTS)


def test_bad_override_syntax():
    with pytest.raises(UserError, match="must look like section.key=value"):
        load_params(None, MODEL_DEFAULTS, ["runconfig.max_steps"])


def test_params_are_frozen():
    params = load_params(None, MODEL_DEFAULTS)
    with pytest.raises(TypeError, match="frozen"):
        params["model"]["dropout"] = 0.0
    with pytest.raises(TypeError):
        params["model"].update(dropout=0.0)


def test_schedule_learning_rate_accepts_a_mapping(tmp_path):
    path = write(tmp_path, "optimizer:\n  learning_rate:\n    scheduler: Exponential\n    initial_learning_rate: 0.1\n")
    params = load_params(path, MODEL_DEFAULTS)
    assert params["optimizer"]["learning_rate"]["scheduler"] == "Exponential"


def test_effective_params_round_trip(tmp_path):
    params = load_params(None, MODEL_DEFAULTS, ["model.dropout=0.3"])
    out = save_params(params, str(tmp_path / "md"), "train")
    assert out.endswith("params_train.yaml")
    assert load_params(out, MODEL_DEFAULTS) == params
    assert yaml.safe_load(open(out))["model"]["hidden_sizes"] == [500, 300]


def test_exponent_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 (PyYAML) reads 1e-3 as a string; a user writing it means 0.001
    params = load_params(write(tmp_path, "optimizer:\n  learning_rate: 1e-3\n  epsilon: 1E-7\n"), MODEL_DEFAULTS)
    assert params["optimizer"]["learning_rate"] == 0.001 and params["optimizer"]["epsilon"] == 1e-7
    with pytest.raises(UserError, match="must be an integer"):
        load_params(write(tmp_path, "runconfig:\n  max_steps: 1e3\n"), MODEL_DEFAULTS)


# --- sizes, counts and rates (issue: the check belongs to params, not to each model) ---------

@pytest.mark.parametrize("text, message", [
    ("train_input:\n  batch_size: -3\n", ":2: 'train_input.batch_size' must be at least 1, got -3"),
    ("train_input:\n  batch_size: 0\n", ":2: 'train_input.batch_size' must be at least 1, got 0"),
    ("model:\n  dropout: 1.0\n", ":2: 'model.dropout' must be in [0, 1), got 1.0"),
    ("model:\n  hidden_sizes: [32,\n    0]\n", ":3: 'model.hidden_sizes[1]' must be at least 1, got 0"),
    ("runconfig:\n  log_steps: 0\n", ":2: 'runconfig.log_steps' must be at least 1, got 0"),
    ("runconfig:\n  max_steps: -1\n", ":2: 'runconfig.max_steps' must be at least 0, got -1"),
    ("optimizer:\n  learning_rate: -0.1\n", ":2: 'optimizer.learning_rate' must be at least 0, got -0.1"),
    ("optimizer:\n  beta2: 1\n", ":2: 'optimizer.beta2' must be in [0, 1), got 1.0"),
    ("optimizer:\n  epsilon: 0\n", ":2: 'optimizer.epsilon' must be greater than 0, got 0.0"),
])
def test_sizes_counts_and_rates_are_checked_by_params(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS)
    assert str(e.value) == path + message


def test_a_range_error_from_the_command_line_names_the_override():
    with pytest.raises(UserError, match=r"^command line 'train_input.batch_size=-3': 'train_input.batch_size' must "
                                        r"be at least 1, got -3$"):
        load_params(None, MODEL_DEFAULTS, ["train_input.batch_size=-3"])


def test_name_rules_leave_the_usual_special_values_alone():
    defaults = {"train_input": {"num_workers": 1, "num_parallel_calls": 4, "shuffle_buffer_size": 10,
                                "num_warmup_steps": 5}}
    params = load_params(None, defaults, ["train_input.num_workers=0", "train_input.num_parallel_calls=-1",
                                          "train_input.shuffle_buffer_size=-1", "train_input.num_warmup_steps=0"])
    assert params["train_input"]["num_parallel_calls"] == -1 and params["train_input"]["num_workers"] == 0
    with pytest.raises(UserError, match="'train_input.num_workers' must be at least 0, got -1"):
        load_params(None, defaults, ["train_input.num_workers=-1"])


def test_a_wrong_type_inside_a_list_names_its_line(tmp_path):
    path = write(tmp_path, "model:\n  hidden_sizes:\n    - 32\n    - wide\n")
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS)
    assert str(e.value) == f"{path}:4: 'model.hidden_sizes[1]' must be an integer, got 'wide'"


def test_a_boolean_is_not_a_number_and_a_section_must_be_a_mapping():
    with pytest.raises(UserError, match="'model.dropout' must be a number, got True"):
        load_params(None, MODEL_DEFAULTS, ["model.dropout=true"])
    with pytest.raises(UserError, match="'runconfig' must be a mapping of keys, got 5"):
        load_params(None, MODEL_DEFAULTS, ["runconfig=5"])


# --- a config that holds only what differs from its base ----------------------------------

def test_base_file_holds_the_rest_and_lines_name_the_right_file(tmp_path):
    base = write(tmp_path, "model:\n  dropout: 0.3\n  hidden_sizes: [8, 4]\nruncon" + "fig:\n  save_checkpoints_steps: 9\n")
    tiny = write(tmp_path, "base: params.yaml\nmodel:\n  hidden_sizes: [2]\nruncon" + "fig:\n  checkpoint_steps: 3\n",
                 name="params_tiny.yaml")
    params = load_params(tiny, MODEL_DEFAULTS)
    assert params["model"]["dropout"] == 0.3 and params["model"]["hidden_sizes"] == (2,)
    assert params["runconfig"]["checkpoint_steps"] == 3  # the tiny file's spelling replaces the base's alias
    write(tmp_path, "model:\n  dropout: 0.3\n  hidden_sizes: [8, 4]\n  colour: red\n")
    with pytest.raises(UserError) as e:
        load_params(tiny, MODEL_DEFAULTS)
    assert str(e.value).startswith(f"{base}:4: unknown key 'model.colour'")
    write(tmp_path, "model:\n  dropout: 0.3\n")
    write(tmp_path, "base: params.yaml\nmodel:\n  dropout: 7\n", name="params_tiny.yaml")
    with pytest.raises(UserError) as e:
        load_params(tiny, MODEL_DEFAULTS)
    assert str(e.value) == f"{tiny}:3: 'model.dropout' must be in [0, 1), got 7.0"


def test_base_file_errors(tmp_path):
    looped = write(tmp_path, "base: params.yaml\n")
    with pytest.raises(UserError, match=r"params.yaml:1: 'base: params.yaml' includes itself"):
        load_params(looped, MODEL_DEFAULTS)
    missing = write(tmp_path, "model: {}\nbase: nowhere.yaml\n", name="tiny.yaml")
    with pytest.raises(UserError, match=r"tiny.yaml:2: base params file .*nowhere.yaml not found"):
        load_params(missing, MODEL_DEFAULTS)
    with pytest.raises(UserError) as e:
        load_params(write(tmp_path, "model: {}\nbase: 5\n", name="tiny.yaml"), MODEL_DEFAULTS)
    assert str(e.value) == f"{tmp_path / 'tiny.yaml'}:2: 'base' must be the path of a params file, got 5"
    write(tmp_path, "base: b.yaml\n", name="a.yaml")  # a loop through two files
    write(tmp_path, "base: a.yaml\n", name="b.yaml")
    with pytest.raises(UserError) as e:
        load_params(str(tmp_path / "a.yaml"), MODEL_DEFAULTS)
    assert str(e.value) == f"{tmp_path / 'b.yaml'}:1: 'base: a.yaml' includes itself"


def test_a_spelling_of_a_setting_over_a_base_without_the_other_spelling(tmp_path):
    write(tmp_path, "runcon" + "fig:\n  max_steps: 9\n")
    tiny = write(tmp_path, "base: params.yaml\nruncon" + "fig:\n  checkpoint_steps: 3\n", name="params_tiny.yaml")
    params = load_params(tiny, MODEL_DEFAULTS)
    assert (params["runconfig"]["max_steps"], params["runconfig"]["checkpoint_steps"]) == (9, 3)


def test_model_dir_default_is_given_by_the_caller():
    assert load_params(None, MODEL_DEFAULTS, model_dir="model_dir/pytorch_x")["runconfig"]["model_dir"] == \
        "model_dir/pytorch_x"
    assert load_params(None, MODEL_DEFAULTS, ["runconfig.model_dir=elsewhere"],
                       model_dir="model_dir/pytorch_x")["runconfig"]["model_dir"] == "elsewhere"


@pytest.mark.parametrize("override, message", [
    ("model.dropout=abc", "'model.dropout' must be a number, got 'abc'"),
    ("model.dropout=true", "'model.dropout' must be a number, got True"),  # a bool is not a number
    ("train_input.shuffle=maybe", "'train_input.shuffle' must be a boolean, got 'maybe'"),
    ("model.activation_fn=[1]", "'model.activation_fn' must be a string, got [1]"),
    ("model.hidden_sizes=5", "'model.hidden_sizes' must be a list, got 5"),
    ("model.hidden_sizes=[3, x]", "'model.hidden_sizes[1]' must be an integer, got 'x'"),
    ("optimizer.learning_rate=abc", "'optimizer.learning_rate' must be a number or mapping or list, got 'abc'"),
    ("optimizer.loss_scaling_factor=[1]", "'optimizer.loss_scaling_factor' must be a number or string, got [1]"),
    ("runconfig=5", "'runconfig' must be a mapping of keys, got 5"),
])
def test_a_wrong_type_names_the_expected_kind(override, message):
    with pytest.raises(UserError) as e:
        load_params(None, MODEL_DEFAULTS, [override])
    assert str(e.value) == f"command line {override!r}: {message}"


def test_ranges_read_as_words():
    from common.params import Range

    assert [str(r) for r in (Range(0), Range(0, low_open=True), Range(high=5), Range(high=5, high_open=True),
                             Range(0, 1), Range(0.0, 1.0, high_open=True), Range(0, 1, low_open=True),
                             Range(1, special=(-1, 0)))] == [
        "at least 0", "greater than 0", "at most 5", "below 5", "in [0, 1]", "in [0, 1)", "in (0, 1]",
        "at least 1 (or -1) (or 0)"]


def test_a_model_default_over_a_common_one_keeps_its_type_choices_and_range():
    defaults = {**MODEL_DEFAULTS, "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.5},
                "runconfig": {"log_steps": 10, "model_dir": "mine"}}
    params = load_params(None, defaults, model_dir="model_dir/pytorch_x")
    assert (params["optimizer"]["optimizer_type"], params["optimizer"]["learning_rate"],
            params["runconfig"]["log_steps"]) == ("sgd", 0.5, 10)
    assert params["optimizer"]["momentum"] == 0.9 and params["runconfig"]["max_steps"] == 1000  # the rest stays
    assert params["runconfig"]["model_dir"] == "mine"  # the model's own beats the caller's default
    for override, message in [
            ("optimizer.optimizer_type=nope", "'optimizer.optimizer_type' must be one of sgd, momentum, adam, adamw, "
                                              "got 'nope'"),
            ("runconfig.log_steps=2.5", "'runconfig.log_steps' must be an integer, got 2.5"),
            ("runconfig.log_steps=0", "'runconfig.log_steps' must be at least 1, got 0")]:  # its name's rule: >= 0
        with pytest.raises(UserError) as e:
            load_params(None, defaults, [override])
        assert str(e.value) == f"command line {override!r}: {message}"


@pytest.mark.parametrize("override, message", [
    ("model.dropout=null", "'model.dropout' must be a number, got None"),  # a default that is not null
    ("runconfig.log_steps=null", "'runconfig.log_steps' must be an integer, got None"),  # the same, typed
    ("device.micro_batch_size=abc", "'device.micro_batch_size' must be an integer, got 'abc'"),  # null by default
    ("model.encoder=5", "'model.encoder' must be a mapping of keys, got 5"),
    ("model.drop\tout=1", r"unknown key 'model.drop\tout' (did you mean 'model.dropout'?)"),  # one line
    ("model.a\\b=1", "unknown key 'model.a\\b'"),  # printable: as typed, the backslash single
])
def test_nulls_mappings_and_unprintable_keys(override, message):
    defaults = {**MODEL_DEFAULTS, "model": {**MODEL_DEFAULTS["model"], "encoder": {"depth": 2}}}
    with pytest.raises(UserError) as e:
        load_params(None, defaults, [override])
    assert str(e.value) == f"command line '{override}': {message}".replace("\t", "\\t")


def test_a_default_out_of_range_names_the_defaults():
    with pytest.raises(UserError) as e:
        load_params(None, {"model": {"dropout": 7.0}})
    assert str(e.value) == "params defaults: 'model.dropout' must be in [0, 1), got 7.0"


def test_ranges_admit_a_closed_bound_and_refuse_an_open_one():
    from common.params import Range

    assert [Range(0, 1).admits(x) for x in (-0.1, 0, 1, 1.1)] == [False, True, True, False]
    assert [Range(0.0, 1.0, high_open=True).admits(x) for x in (0, 0.999, 1)] == [True, True, False]
    assert [Range(0, 1, low_open=True).admits(x) for x in (0, 0.001, 1)] == [False, True, True]
    assert [Range(1, special=(-1, 0)).admits(x) for x in (-2, -1, 0, 0.5, 1)] == [False, True, True, False, True]


def test_closest_compares_the_last_part_of_keys_of_any_depth():
    from common.params import _closest

    # the dotted names are far apart (a ratio of 0.43); the last part is exactly a key three deep
    candidates = [("training",), ("training", "schedule"), ("training", "schedule", "enabled")]
    assert _closest(("model", "encoder", "enabled"), candidates) == "training.schedule.enabled"
    # two last parts are close to 'dropout_rat': the closer one, not the first listed
    candidates = [("learning_schedule_settings", "dropout_rates"), ("regularisation_settings", "dropout_rate")]
    assert _closest(("model", "dropout_rat"), candidates) == "regularisation_settings.dropout_rate"
    # a last part only 0.67 alike ('decay', 'decay_rate') is too far
    assert _closest(("model", "decay"), [("optimizer_schedule", "decay_rate")]) is None


def test_a_misspelt_key_of_another_section_is_found_by_its_last_part():
    """The dotted name matches nothing closely; its last part is close to a key of another section."""
    with pytest.raises(UserError) as e:
        load_params(None, MODEL_DEFAULTS, ["model.nesterof=true"])
    assert str(e.value) == ("command line 'model.nesterof=true': unknown key 'model.nesterof' "
                            "(did you mean 'optimizer.nesterov'?)")


def test_a_deep_copy_of_frozen_params_is_frozen_and_equal():
    import copy

    from common.params import FrozenDict

    params = load_params(None, MODEL_DEFAULTS)
    twin = copy.deepcopy(params)
    assert twin == params and type(twin) is FrozenDict and type(twin["model"]) is FrozenDict
    assert twin["model"] is not params["model"]
    with pytest.raises(TypeError, match="^params are frozen: model and data code read them and never write them$"):
        twin["model"]["dropout"] = 0.0


def test_saved_params_keep_the_order_and_inline_lists(tmp_path):
    params = load_params(None, MODEL_DEFAULTS, ["model.dropout=0.3"])
    out = save_params(params, str(tmp_path / "md"), "eval")
    assert out == str(tmp_path / "md" / "params_eval.yaml")
    text = open(out).read()
    assert list(yaml.safe_load(text)) == ["runconfig", "optimizer", "mixed_precision", "device", "model",
                                          "train_input"]  # the schema's order, not sorted
    assert "  hidden_sizes: [500, 300]\n" in text and "  weight_decay_exclude: [bias, norm]\n" in text
    assert text.index("max_steps") < text.index("checkpoint_steps")


@pytest.mark.parametrize("override, close", [
    ("model.enabled=true", "mixed_precision.enabled"),  # the same last part in another section
    ("model.beta_1=0.5", "optimizer.beta1"),  # a last part close to another section's
    ("model.seeds=1", "runconfig.seed"),  # 'model' is closest as text, but it is where the key already is
    ("model.zzz=1", None),
])
def test_an_unknown_key_is_offered_the_key_of_the_same_name_elsewhere(override, close):
    with pytest.raises(UserError) as e:
        load_params(None, MODEL_DEFAULTS, [override])
    key = override.split("=")[0]
    hint = f" (did you mean '{close}'?)" if close else ""
    assert str(e.value) == f"command line {override!r}: unknown key '{key}'{hint}"


def test_override_syntax_errors_and_values_holding_an_equals_sign():
    assert load_params(None, MODEL_DEFAULTS, ["model.activation_fn=a=b"])["model"]["activation_fn"] == "a=b"
    assert load_params(None, MODEL_DEFAULTS, [" runconfig.eval_steps = "])["runconfig"]["eval_steps"] is None
    for text, message in [("=5", "override '=5' must look like section.key=value"),
                          ("model.hidden_sizes=[1", "override 'model.hidden_sizes=[1': the value is not valid YAML")]:
        with pytest.raises(UserError) as e:
            load_params(None, MODEL_DEFAULTS, [text])
        assert str(e.value) == f"command line: {message}"


def test_the_default_model_dir():
    assert load_params(None, MODEL_DEFAULTS)["runconfig"]["model_dir"] == "model_dir"
    assert load_params(None, MODEL_DEFAULTS, model_dir=None)["runconfig"]["model_dir"] is None


@pytest.mark.parametrize("defaults, override, message", [
    ({"model": {"mix": [1, 0.5]}}, "model.mix=[1, x]", "'model.mix[1]' must be a number, got 'x'"),
    ({}, "optimizer.weight_decay_exclude=[bias, 1]", "'optimizer.weight_decay_exclude[1]' must be a string, got 1"),
    ({"model": {"shape": (2, 2)}}, "model.shape=[2, 2]", "'model.shape' must be a tuple, got [2, 2]"),
    ({"model": {"rates": [np.float64(0.5)]}}, "model.rates=[x]", "'model.rates[0]' must be a number, got 'x'"),
])
def test_list_elements_and_other_types_are_named(defaults, override, message):
    with pytest.raises(UserError) as e:
        load_params(None, defaults, [override])
    assert str(e.value) == f"command line {override!r}: {message}"


def test_an_override_leaves_the_lines_of_the_files_other_keys(tmp_path):
    path = write(tmp_path, "model:\n  dropout: 7\n")
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS, ["model.activation_fn=tanh"])
    assert str(e.value) == f"{path}:2: 'model.dropout' must be in [0, 1), got 7.0"


def test_thaw_reads_any_mapping():
    import types

    from common.params import thaw

    assert thaw(types.MappingProxyType({"a": (1, {"b": 2})})) == {"a": [1, {"b": 2}]}


def test_file_errors_name_the_file_the_line_and_the_problem(tmp_path):
    cases = [("model:\n  dropout: [0.1\nrunconfig: {}\n", ":3: malformed YAML: expected ',' or ']', but got ':'"),
             ("model: {dropout: \x07}\n", ": malformed YAML: unacceptable character #x0007: special characters are "
                                         "not allowed"),  # a reader error: no line
             ("- 1\n- 2\n", ":1: a params file must be a mapping of sections, got list")]
    for text, message in cases:
        path = write(tmp_path, text)
        with pytest.raises(UserError) as e:
            load_params(path, MODEL_DEFAULTS)
        assert str(e.value) == path + message
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(UserError) as e:
        load_params(str(tmp_path / "binary.yaml"), MODEL_DEFAULTS)
    assert str(e.value) == f"{tmp_path / 'binary.yaml'}: not a text file (invalid start byte)"
    with pytest.raises(UserError) as e:
        load_params(str(tmp_path / "nope.yaml"), MODEL_DEFAULTS)
    assert str(e.value) == f"{tmp_path / 'nope.yaml'}: params file not found"
    assert load_params(write(tmp_path, "# nothing yet\n"), MODEL_DEFAULTS) == load_params(None, MODEL_DEFAULTS)


def test_params_files_are_read_as_utf8_whatever_the_locale(tmp_path):
    import os
    import subprocess
    import sys

    from common.params import read_yaml

    path = write(tmp_path, "model:\n  activation_fn: gelu  # not ReLU \u2014 the paper's choice\n")
    code = f"from common.params import read_yaml; print(read_yaml({path!r})[0])"
    # the child imports common.params from where this process does (a mutation run's mutated copy too)
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0",
               PYTHONPATH=os.pathsep.join(p or os.getcwd() for p in sys.path))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == f"{read_yaml(path)[0]}\n" == "{'model': {'activation_fn': 'gelu'}}\n"


def test_a_key_that_yaml_reads_as_a_number_is_found_on_its_line(tmp_path):
    path = write(tmp_path, "model:\n  dropout: 0.1\n  1: x\n")
    with pytest.raises(UserError) as e:
        load_params(path, MODEL_DEFAULTS)
    assert str(e.value) == f"{path}:3: unknown key 'model.1' (did you mean 'model.dropout'?)"
    path = write(tmp_path, "optimizer:\n  learning_rate:\n    - scheduler: Constant\n      learning_rate: 0.1\n")
    assert load_params(path, MODEL_DEFAULTS)["optimizer"]["learning_rate"][0]["scheduler"] == "Constant"
