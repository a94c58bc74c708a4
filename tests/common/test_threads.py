"""common/threads.py: torch's thread count from the cores free, OpenMP's wait policy before torch loads."""

import logging
import os
import subprocess
import sys

import pytest

from common import threads
from common.errors import UserError
from common.threads import choose_threads, wait_setting

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("passive", [True, False])
@pytest.mark.parametrize("load1", [0.0, 0.9, 6.5])
def test_one_thread_a_core_at_any_load(load1, passive):
    # measured: with the passive wait fewer threads under load only get the run less of the
    # cores; with the spinning one a count that follows the load would make the figures follow it
    choice = choose_threads(2, load1, passive, {}, current=2, default=2)
    assert choice.threads == 2
    assert f"2 cores, load average {load1:.2f}" in choice.reason
    assert ("set OMP_WAIT_POLICY=PASSIVE" in choice.reason) is not passive  # the remedy, where threads spin


def test_never_above_torchs_own_count():
    assert choose_threads(8, 0.0, True, {}, current=4, default=4).threads == 4  # physical cores


def test_the_users_omp_num_threads_wins():
    choice = choose_threads(2, 6.0, False, {"OMP_NUM_THREADS": "2"}, current=2, default=2)
    assert choice.threads is None and "OMP_NUM_THREADS=2 from the environment" in choice.reason
    assert choose_threads(2, 6.0, False, {"MKL_NUM_THREADS": "2"}, current=2, default=2).threads is None
    assert choose_threads(2, 6.0, False, {"OMP_NUM_THREADS": "4,2"}, current=4, default=2).threads is None  # nested


def test_a_set_num_threads_before_the_run_wins():
    choice = choose_threads(2, 6.0, False, {}, current=3, default=2)
    assert choice.threads is None and "torch.set_num_threads(3) before the run" in choice.reason


@pytest.mark.parametrize("value", ["abc", "0", "", "-1", "1.5"])
def test_an_unreadable_omp_num_threads_is_named(value):
    with pytest.raises(UserError, match=rf"the environment's OMP_NUM_THREADS='{value}' is not a positive whole number"):
        choose_threads(2, 0.0, True, {"OMP_NUM_THREADS": value}, current=2, default=2)


def test_passive_wait_unless_the_user_chose_one():
    wait = wait_setting({}, torch_loaded=False)
    assert wait.setting == {"OMP_WAIT_POLICY": "PASSIVE"} and wait.passive
    for name, value, passive in (("OMP_WAIT_POLICY", "passive", True), ("OMP_WAIT_POLICY", "ACTIVE", False),
                                 ("GOMP_SPINCOUNT", "1000", False), ("KMP_BLOCKTIME", "200", False)):
        wait = wait_setting({name: value}, torch_loaded=False)
        assert wait.setting == {} and wait.passive is passive and f"{name}={value} from the environment" in wait.note


def test_no_wait_policy_once_torch_is_loaded():
    # OpenMP has read its variables by then: setting one would claim an effect it has not
    wait = wait_setting({}, torch_loaded=True)
    assert wait.setting == {} and not wait.passive and "torch was imported before common.pytorch" in wait.note


def test_start_up_says_the_count_and_why_once(monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.setattr(threads, "_started", False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads, "physical_cores", lambda cpus: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (5.0, 5.0, 5.0))
    # threads that spin (libgomp's default count, given by the user)
    monkeypatch.setattr(threads, "_wait", wait_setting({"GOMP_SPINCOUNT": "300000"}, torch_loaded=False))
    for name in threads.COUNT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    torch.set_num_threads(2)  # torch's default on the 2 cores faked above
    try:
        with caplog.at_level(logging.INFO, logger="zoo"):
            threads.start_up()
            threads.start_up()  # once a process: a second run keeps the first's choice
        assert torch.get_num_threads() == 2
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("torch threads:")]
        assert lines == ["torch threads: 2 (one a core: 2 cores, load average 5.00 (1 minute); waiting threads "
                         "spin, which under load is many times slower: set OMP_WAIT_POLICY=PASSIVE, or import "
                         "common.pytorch before torch); OpenMP wait: GOMP_SPINCOUNT=300000 from the environment"]
    finally:
        torch.set_num_threads(before)


def test_a_run_with_an_unreadable_omp_num_threads_is_one_line(monkeypatch, tmp_path, capsys):
    pytest.importorskip("torch")
    from common.folder import load_run_module

    run = load_run_module(os.path.join(ROOT, "pytorch", "mnist"))
    monkeypatch.setattr(threads, "_started", False)
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(SystemExit) as e:
        run.main(["--mode", "train", "--max_steps", "1", "--model_dir", str(tmp_path / "m")])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == ("error: the environment's OMP_NUM_THREADS='two' is not a positive whole number of threads; "
                   "set it to one (e.g. OMP_NUM_THREADS=1) or unset it\n")
    assert not (tmp_path / "m").exists()


def test_a_run_sets_the_wait_policy_before_torch_loads():
    # a fresh Python importing the runner as `python pytorch/<model>/run.py` does; at the
    # moment torch starts to load (where OpenMP reads its variables) the policy must be set.
    # The import stops there: the test needs no torch.
    env = {k: v for k, v in os.environ.items() if k not in threads.WAIT_VARIABLES}
    env["PYTHONPATH"] = ROOT
    code = ("import os, sys\n"
            "class AtTorch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'torch':\n"
            "            print('torch loads with OMP_WAIT_POLICY', os.environ.get('OMP_WAIT_POLICY'), flush=True)\n"
            "            os._exit(0)\n"
            "sys.meta_path.insert(0, AtTorch())\n"
            "import common.pytorch.run\n")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out == "torch loads with OMP_WAIT_POLICY PASSIVE\n"
