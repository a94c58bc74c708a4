"""tests/mutation.py's own logic (the mutmut runs themselves are `tox -e mutation`)."""

import importlib.util
import json
import os
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("mutation_tool", Path(__file__).with_name("mutation.py"))
mutation = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(mutation)


def test_only_hands_mutmut_the_globs_on_a_fresh_copy_and_the_unkilled_matches_on_a_rerun():
    only = ["common.pytorch.base_model.*", "common.pytorch.checkpoint.x_load*"]
    assert mutation._names_to_run(only, {}) == only
    assert mutation._names_to_run([], {"a.x_f__mutmut_1": "survived"}) == []
    results = {"common.pytorch.base_model.x_f__mutmut_2": "survived",
               "common.pytorch.base_model.x_f__mutmut_1": "no tests",
               "common.pytorch.base_model.x_f__mutmut_3": "killed",
               "common.pytorch.checkpoint.x_load_checkpoint__mutmut_9": "not checked",
               "common.pytorch.checkpoint.x_save_checkpoint__mutmut_9": "survived"}
    assert mutation._names_to_run(only, results) == [
        "common.pytorch.base_model.x_f__mutmut_1", "common.pytorch.base_model.x_f__mutmut_2",
        "common.pytorch.checkpoint.x_load_checkpoint__mutmut_9"]
    assert mutation._names_to_run(["common.pytorch.base_model.x_f__mutmut_3"], results) == []  # killed already


@pytest.mark.parametrize("argv", [["--only", "x*"], ["--only", "x*", "cost", "place"]])
def test_only_needs_exactly_one_group(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        mutation.main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(  # argparse's line: "PROG: error: ..."
        ": error: --only needs one group, the one its mutants belong to")


def test_the_functions_a_module_runs_when_imported_are_found_by_importing_it():
    # device/ops builds its kernels at import (elementwise's _unary_op(np.exp, ...)); params builds none
    found = mutation.import_time_functions(["device/ops/elementwise.py", "device/ops/record.py"])
    assert {"device.ops.elementwise.x__unary_op", "device.ops.elementwise.x__binary_op",
            "device.ops.record.x_per_element", "device.ops.record.xǁOpRecordǁ__post_init__"} <= found
    assert all(name.startswith(("device.ops.elementwise.", "device.ops.record.")) for name in found)
    assert mutation.import_time_functions(["common/params.py"]) == set()


@pytest.mark.parametrize("qualname, name", [
    ("f", "m.x_f"), ("C.f", "m.xǁCǁf"), ("f.<locals>.g", "m.x_f"), ("C.f.<locals>.<lambda>", "m.xǁCǁf"),
    ("<lambda>", None), ("<listcomp>", None), ("C.D.f", None)])
def test_mutmut_names_of_functions_and_methods(qualname, name):
    assert mutation._mangled("m", qualname) == name


def test_a_glob_that_matches_no_mutant_yet_goes_to_mutmut_as_it_is():
    # a module added to a group: its mutants do not exist in the copy until mutmut makes them
    results = {"device.runtime.program.x_f__mutmut_1": "survived"}
    assert mutation._names_to_run(["device.runtime.memory.*", "device.runtime.program.*"], results) == [
        "device.runtime.memory.*", "device.runtime.program.x_f__mutmut_1"]


def test_a_mutant_the_modules_or_the_tests_cannot_be_imported_with_is_recorded_with_its_error(tmp_path):
    # a stand-in for mutmut's copy: common/params.py fails to import with one mutant, a test file with another
    (tmp_path / "mutants" / "common").mkdir(parents=True)
    (tmp_path / "mutants" / "common" / "__init__.py").write_text("")
    (tmp_path / "mutants" / "common" / "params.py").write_text(
        "import os\nif os.environ['MUTANT_UNDER_TEST'].endswith('_1'):\n    raise ValueError('no records')\n")
    (tmp_path / "mutants" / "tests").mkdir()
    (tmp_path / "mutants" / "tests" / "test_it.py").write_text(
        "import os\nif os.environ['MUTANT_UNDER_TEST'].endswith('_2'):\n    raise KeyError('case')\n"
        "def test_it():\n    pass\n")
    names = ["m.x_f__mutmut_1", "m.x_f__mutmut_2", "m.x_f__mutmut_3"]
    mutation._check_imports(tmp_path, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
                            ["common/params.py"], ["tests/test_it.py"], names)
    failures = json.loads((tmp_path / mutation._IMPORT_FAILURES).read_text())
    assert failures["m.x_f__mutmut_1"] == "ValueError: no records"
    assert failures["m.x_f__mutmut_2"].startswith("ERROR tests/test_it.py") and "KeyError" in failures["m.x_f__mutmut_2"]
    assert "m.x_f__mutmut_3" not in failures  # imports and collects: mutmut's verdict stands
