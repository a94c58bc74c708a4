"""The command line both runners share."""

import os
import signal

import pytest

from common.cli import effective_params, guarded, parse_command_line
from common.errors import UserError
from common.interrupt import Interrupted


def test_defaults():
    args = parse_command_line([])
    assert (args.mode, args.device, args.validate_only, args.compile_only) == ("train", "cpu", False, False)


def test_invalid_mode_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        parse_command_line(["--mode", "trian"], prog="run.py")
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid choice: 'trian'" in err


def test_validate_only_and_compile_only_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        parse_command_line(["--validate_only", "--compile_only"], prog="run.py")
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_nonpositive_steps_rejected():
    with pytest.raises(SystemExit, match="--max_steps must be positive"):
        parse_command_line(["--max_steps", "0"])


def test_flags_and_overrides_reach_params(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "params.yaml").write_text("runconfig:\n  max_steps: 5\n")
    args = parse_command_line(["--model_dir", str(tmp_path / "md"), "--max_steps", "8", "model.width=3"])
    params = effective_params(args, lambda: {"model": {"width": 1}}, str(tmp_path), "pytorch")
    assert params["runconfig"]["model_dir"] == str(tmp_path / "md")
    assert params["runconfig"]["max_steps"] == 8
    assert params["model"]["width"] == 3


def test_guarded_turns_user_error_into_one_line_and_exit_2(capsys):
    def body(args):
        raise UserError("params.yaml:3: unknown key 'x'")

    with pytest.raises(SystemExit) as e:
        guarded(body, parse_command_line([]))
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: params.yaml:3: unknown key 'x'\n"


def test_guarded_keeps_bugs_loud():
    with pytest.raises(ZeroDivisionError):
        guarded(lambda args: 1 / 0, parse_command_line([]))


# --- a data_dir the user set that does not exist, under dataset: auto --------------------------

def mnist_defaults():
    return {"train_input": {"data_dir": "./data/mnist", "dataset": "auto"},
            "eval_input": {"data_dir": "./data/mnist", "dataset": "auto"}}


def mnist_params(tmp_path, yaml_text, *argv, defaults=mnist_defaults):
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "params.yaml").write_text(yaml_text)
    return effective_params(parse_command_line(list(argv)), defaults, str(tmp_path), "pytorch")


def test_a_data_dir_set_in_the_params_file_that_does_not_exist_is_an_error_naming_the_key_path_and_line(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ./data/mnist, the default, is absent here
    missing = str(tmp_path / "mnsit")
    with pytest.raises(UserError) as e:
        mnist_params(tmp_path, f"train_input:\n  dataset: auto\neval_input:\n  data_dir: {missing}\n", "--mode", "eval")
    assert str(e.value) == (f"{tmp_path / 'configs' / 'params.yaml'}:4: eval_input.data_dir {missing} does not "
                            f"exist; with dataset: auto the run would read the embedded UCI digits instead. Correct "
                            f"the path, prepare MNIST there (python datasets/prepare_mnist.py), or set "
                            f"eval_input.dataset: uci_digits")


def test_a_data_dir_set_on_the_command_line_that_does_not_exist_is_an_error_naming_the_override(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=r"^command line 'train_input.data_dir=nope': train_input.data_dir nope "
                                        r"does not exist; "):
        mnist_params(tmp_path, "train_input:\n  data_dir: ./data/mnist\n", "train_input.data_dir=nope")


def test_the_default_data_dir_absent_and_a_set_one_that_exists_or_is_not_read_under_auto_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # the default, absent, given in the file (as the folders' params.yaml do) or not at all: the embedded digits
    assert mnist_params(tmp_path, "train_input:\n  data_dir: ./data/mnist\n")["train_input"]["data_dir"] == \
        "./data/mnist"
    assert mnist_params(tmp_path, "train_input:\n  dataset: auto\n")["eval_input"]["data_dir"] == "./data/mnist"
    assert mnist_params(tmp_path, "", "eval_input.data_dir=data/mnist")["eval_input"]["data_dir"] == "data/mnist"
    (tmp_path / "there").mkdir()
    assert mnist_params(tmp_path, "train_input:\n  data_dir: there\n")["train_input"]["data_dir"] == "there"
    params = mnist_params(tmp_path, "train_input:\n  data_dir: nope\n  dataset: uci_digits\n")
    assert params["train_input"]["dataset"] == "uci_digits"


def test_a_vendor_form_data_dir_given_in_the_file_that_does_not_exist_is_an_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def set_defaults(params):
        params["train_input"].setdefault("dataset", "auto")
        params["train_input"].setdefault("data_dir", "./data/mnist")

    assert mnist_params(tmp_path, "train_input:\n  dataset: auto\n", defaults=set_defaults)["train_input"][
        "data_dir"] == "./data/mnist"
    with pytest.raises(UserError, match=r"params.yaml:2: train_input.data_dir ./data/mnist does not exist"):
        mnist_params(tmp_path, "train_input:\n  data_dir: ./data/mnist\n", defaults=set_defaults)


# --- a Ctrl-C before the training loop began ----------------------------------------------------

def interrupted_at_start_up(tmp_path, capsys, *argv, checkpoints=()):
    """The line and status of a train run stopped by SIGINT once its params are loaded, with
    ``checkpoints`` in its model_dir (a stand-in for the framework's newest checkpoint)."""
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / "params.yaml").write_text("runconfig:\n  max_steps: 5\n")
    model_dir = tmp_path / "model_dir"
    model_dir.mkdir(exist_ok=True)
    for name in checkpoints:
        (model_dir / name).write_bytes(b"")

    def body(args):
        effective_params(args, lambda: {}, str(tmp_path), "pytorch")
        raise Interrupted(signal.SIGINT)

    def newest(folder):
        found = sorted(os.listdir(folder))
        return os.path.join(folder, found[-1]) if found else None

    with pytest.raises(SystemExit) as e:
        guarded(body, parse_command_line(["--model_dir", str(model_dir), *argv]), newest)
    return e.value.code, capsys.readouterr().err


def test_a_stop_during_start_up_promises_a_resume_only_from_a_checkpoint_there(tmp_path, capsys):
    assert interrupted_at_start_up(tmp_path, capsys) == (130, "interrupted by SIGINT during --mode train\n")
    model_dir = tmp_path / "model_dir"
    assert interrupted_at_start_up(tmp_path, capsys, checkpoints=["checkpoint_2.mdl"]) == (
        130, f"interrupted by SIGINT during --mode train; the same command resumes from "
             f"{model_dir / 'checkpoint_2.mdl'}, the newest checkpoint in {model_dir}\n")
    assert interrupted_at_start_up(tmp_path, capsys, "--checkpoint_path", "other.mdl") == (
        130, "interrupted by SIGINT during --mode train; the same command starts again from other.mdl\n")


def test_a_mode_checks_only_the_data_dirs_of_the_inputs_it_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = "train_input:\n  data_dir: ./train_only_here\n"  # an eval on a machine without the training data
    assert mnist_params(tmp_path, text, "--mode", "eval")["train_input"]["data_dir"] == "./train_only_here"
    assert mnist_params(tmp_path, text, "--mode", "predict")["train_input"]["data_dir"] == "./train_only_here"
    for mode in ("train", "train_and_eval"):
        with pytest.raises(UserError, match=r"params.yaml:2: train_input.data_dir ./train_only_here does not exist"):
            mnist_params(tmp_path, text, "--mode", mode)
    with pytest.raises(UserError, match=r"params.yaml:2: eval_input.data_dir ./eval_here does not exist"):
        mnist_params(tmp_path, "eval_input:\n  data_dir: ./eval_here\n", "--mode", "eval_all")
