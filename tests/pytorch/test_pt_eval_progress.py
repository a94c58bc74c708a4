"""The PyTorch runner's eval and predict log their progress on both step backends (common/log.py's
EvalProgress, on a clock the test moves: 10 seconds at each reading)."""

import argparse
import logging

import pytest
from torch.utils.data import DataLoader, IterableDataset

from common import log
from common.pytorch.device_run import EmulatorSteps
from common.pytorch.distributed import World
from common.pytorch.runner import FrameworkSteps, Runner, eval_batch_count
from tests.log_lines import TickingClock
from tests.pytorch.test_pt_runner_loop import EXAMPLES, Linear, dataset, params_of, runner, zoo_log

BACKENDS = {"cpu": FrameworkSteps, "emulator": EmulatorSteps}


def one_by_one(params):
    """The eval set in batches of one: ten batches."""
    return DataLoader(dataset(), batch_size=1)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("trained")
    runner(model_dir, max_steps=2).execute()
    return model_dir


@pytest.mark.parametrize("device", BACKENDS)
@pytest.mark.parametrize("mode", ["eval", "predict"])
def test_eval_and_predict_log_their_progress_on_each_backend(trained, device, mode, monkeypatch, caplog):
    monkeypatch.setattr(log, "clock", TickingClock(10))
    args = argparse.Namespace(mode=mode, device=device, checkpoint_path=None)
    run = Runner(args, params_of(trained), Linear, one_by_one, one_by_one, BACKENDS[device])
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.execute()
    progress = [m for _, m in zoo_log(caplog) if m.startswith(f"{mode} on ")]
    # batch k of 10 ends 10k seconds after the loop began: a line at each tenth but the last
    assert progress == [f"{mode} on {device}: {k} of {EXAMPLES} batches, 0.10 batches/sec ({10 * k}%, "
                        f"0:{(10 - k) * 10 // 60:02d}:{(10 - k) * 10 % 60:02d} left)" for k in range(1, 10)]
    if mode == "eval":  # the final line stays the last
        assert zoo_log(caplog)[-1][1].startswith(f"| Eval Device={device} Step=2 accuracy=")


def test_eval_steps_is_the_total_of_the_progress(trained, monkeypatch, caplog):
    monkeypatch.setattr(log, "clock", TickingClock(10))
    args = argparse.Namespace(mode="eval", device="cpu", checkpoint_path=None)
    run = Runner(args, params_of(trained, eval_steps=4), Linear, one_by_one, one_by_one, FrameworkSteps)
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.execute()
    assert [m for _, m in zoo_log(caplog) if m.startswith("eval on ")] == [
        "eval on cpu: 1 of 4 batches, 0.10 batches/sec (25%, 0:00:30 left)",
        "eval on cpu: 2 of 4 batches, 0.10 batches/sec (50%, 0:00:20 left)",
        "eval on cpu: 3 of 4 batches, 0.10 batches/sec (75%, 0:00:10 left)"]


class Stream(IterableDataset):
    """Examples without a length: how many batches it gives is not known ahead."""

    def __iter__(self):
        return iter(dataset())


def test_the_progress_total_is_this_processs_share_of_the_batches_and_unknown_for_a_stream():
    ten = DataLoader(dataset(), batch_size=1)
    assert eval_batch_count(ten, None) == 10 and eval_batch_count(ten, 4) == 4 and eval_batch_count(ten, 40) == 10
    # batches 1, 4, 7, 10 of the order go to rank 0 of 3; 2, 5, 8 to rank 1
    assert eval_batch_count(ten, None, World(rank=0, size=3)) == 4
    assert eval_batch_count(ten, None, World(rank=1, size=3)) == 3
    assert eval_batch_count(DataLoader(Stream(), batch_size=2), None) is None
    assert eval_batch_count(DataLoader(Stream(), batch_size=2), 3) == 3
