"""The command line both runners share."""

import pytest

from common.cli import effective_params, guarded, parse_command_line
from common.errors import UserError


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
