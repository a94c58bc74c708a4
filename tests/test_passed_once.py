"""tests/passed_once.py: what the pytorch and tf envs record, the all env does not run again; nothing else."""

import os
import subprocess
import sys

import pytest

from tests.passed_once import HEADER, checkout_fingerprint, read_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFTEST = """
from tests import passed_once

def pytest_addoption(parser):
    passed_once.add_options(parser)

def pytest_configure(config):
    passed_once.register(config)
"""
TESTS = """
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="needs the other framework")
def test_skipped():
    pass

@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown")

def test_passes_but_its_teardown_fails(broken_teardown):
    pass

@pytest.mark.parametrize("n", [1, 2])
def test_each(n):
    assert n == 1
"""


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "conftest.py").write_text(CONFTEST)
    (repo / "test_things.py").write_text(TESTS)
    (repo / "data.txt").write_text("one\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    return repo


def _pytest(repo, *args):
    env = {**os.environ, "PYTHONPATH": ROOT}  # the plugin under test, from this checkout
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=repo,
                            env=env, capture_output=True, text=True, timeout=120)
    return result.stdout + result.stderr


def test_only_tests_that_passed_every_phase_are_recorded_and_not_run_again(checkout, tmp_path):
    records = tmp_path / "records"
    out = _pytest(checkout, "--record-passed=" + str(records / "pytorch.txt"))
    assert f"2 passed tests recorded in {records / 'pytorch.txt'}" in out
    header, *ids = (records / "pytorch.txt").read_text().splitlines()
    assert header == HEADER + checkout_fingerprint(str(checkout))
    assert ids == ["test_things.py::test_each[1]", "test_things.py::test_passes"]

    out = _pytest(checkout, "--skip-passed=" + str(records / "pytorch.txt"),
                  "--skip-passed=" + str(records / "tf.txt"), "-rA")
    assert f"{records / 'pytorch.txt'}: 2 tests passed there, not run again" in out
    assert f"{records / 'tf.txt'}: no record of passed tests; its tests run" in out
    assert "2 deselected" in out
    ran = {line.split(" ", 1)[1].split(" - ")[0] for line in out.splitlines()
           if line.startswith(("PASSED ", "FAILED ", "SKIPPED ", "ERROR "))}
    assert "test_things.py::test_passes" not in ran and "test_things.py::test_each[1]" not in ran
    assert {"test_things.py::test_fails", "test_things.py::test_each[2]",
            "test_things.py::test_passes_but_its_teardown_fails"} <= ran


@pytest.mark.parametrize("change", ["edit a tracked file", "add a python file", "edit an untracked python file"])
def test_a_record_of_another_state_of_the_checkout_skips_nothing(checkout, tmp_path, change):
    records = tmp_path / "records"
    if change == "edit an untracked python file":
        (checkout / "helper.py").write_text("A = 1\n")
    _pytest(checkout, "--record-passed=" + str(records / "tf.txt"))
    if change == "edit a tracked file":
        (checkout / "data.txt").write_text("two\n")
    elif change == "add a python file":
        (checkout / "new_module.py").write_text("B = 2\n")
    else:
        (checkout / "helper.py").write_text("A = 2\n")
    out = _pytest(checkout, "--skip-passed=" + str(records / "tf.txt"))
    assert f"{records / 'tf.txt'}: written for another state of the checkout; its tests run again" in out
    assert "deselected" not in out and "3 passed" in out


def test_untracked_data_a_run_leaves_behind_does_not_change_the_fingerprint(checkout):
    before = checkout_fingerprint(str(checkout))
    (checkout / "model_dir").mkdir()
    (checkout / "model_dir" / "events.out").write_text("x")
    assert checkout_fingerprint(str(checkout)) == before


def test_outside_a_work_tree_nothing_is_recorded_or_skipped(tmp_path):
    plain = tmp_path / "plain"  # the temporary folder is in no git work tree
    plain.mkdir()
    (plain / "conftest.py").write_text(CONFTEST)
    (plain / "test_things.py").write_text("def test_passes():\n    pass\n")
    assert checkout_fingerprint(str(plain)) is None
    stale = tmp_path / "records" / "pytorch.txt"
    stale.parent.mkdir()
    stale.write_text(HEADER + "0" * 64 + "\ntest_things.py::test_passes\n")
    out = _pytest(plain, "--record-passed=" + str(stale))
    assert f"no record written to {stale}: this checkout is not a git work tree" in out
    assert not stale.exists()  # the old record is gone, not left to be matched later
    stale.write_text(HEADER + "0" * 64 + "\ntest_things.py::test_passes\n")
    out = _pytest(plain, "--skip-passed=" + str(stale))
    assert "not a git work tree, so the record cannot be matched to it; its tests run again" in out
    assert "1 passed" in out


def test_a_file_that_is_no_record_is_named_and_skips_nothing(tmp_path):
    bogus = tmp_path / "pytorch.txt"
    bogus.write_text("test_things.py::test_passes\n")
    assert read_record(str(bogus), "f" * 64) == (set(), "not a record of passed tests")
    assert read_record(str(tmp_path / "absent.txt"), "f" * 64)[1].startswith("unreadable")
