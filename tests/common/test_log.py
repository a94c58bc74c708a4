"""common/log.py's eval and predict progress lines, on a clock the test moves."""

import logging

import pytest

from common import log
from common.log import EvalProgress
from tests.log_lines import TickingClock


@pytest.fixture
def clock(monkeypatch):
    clock = TickingClock()
    monkeypatch.setattr(log, "clock", clock)
    return clock


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "zoo"]


def run(progress, clock, seconds_per_batch, batches):
    for _ in range(batches):
        clock.now += seconds_per_batch
        progress.batch_done()


def test_a_long_eval_logs_each_tenth_with_its_time_left_and_not_its_last_batch(clock, caplog):
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(EvalProgress("eval", "cpu", 200), clock, 0.5, 200)
    assert lines(caplog) == [f"eval on cpu: {20 * k} of 200 batches, 2.00 batches/sec ({10 * k}%, "
                             f"0:{(200 - 20 * k) // 2 // 60:02d}:{(200 - 20 * k) // 2 % 60:02d} left)"
                             for k in range(1, 10)]


def test_slow_batches_log_every_30_seconds_between_the_tenths(clock, caplog):
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(EvalProgress("predict", "emulator", 1000), clock, 1.0, 160)
    assert lines(caplog) == [
        "predict on emulator: 30 of 1000 batches, 1.00 batches/sec (3%, 0:16:10 left)",
        "predict on emulator: 60 of 1000 batches, 1.00 batches/sec (6%, 0:15:40 left)",
        "predict on emulator: 90 of 1000 batches, 1.00 batches/sec (9%, 0:15:10 left)",
        "predict on emulator: 100 of 1000 batches, 1.00 batches/sec (10%, 0:15:00 left)",  # a tenth
        "predict on emulator: 130 of 1000 batches, 1.00 batches/sec (13%, 0:14:30 left)",
        "predict on emulator: 160 of 1000 batches, 1.00 batches/sec (16%, 0:14:00 left)"]


def test_without_a_known_total_the_lines_give_the_batches_done_and_the_rate(clock, caplog):
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(EvalProgress("eval", "cpu", None), clock, 7.0, 12)
    assert lines(caplog) == ["eval on cpu: 5 batches, 0.14 batches/sec", "eval on cpu: 10 batches, 0.14 batches/sec"]


def test_a_short_eval_logs_no_progress(clock, caplog):
    with caplog.at_level(logging.INFO, logger="zoo"):
        run(EvalProgress("eval", "cpu", 50), clock, 0.09, 50)  # 4.5 seconds in all
        run(EvalProgress("eval", "cpu", None), clock, 0.09, 50)
    assert lines(caplog) == []
