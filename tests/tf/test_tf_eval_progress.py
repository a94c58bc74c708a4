"""CerebrasEstimator's evaluate and predict log their progress on both step backends
(common/log.py's EvalProgress, on a clock the test moves: 10 seconds at each reading)."""

import logging

import pytest

from common import log
from common.params import load_params
from common.tf.estimator import CerebrasEstimator, RunConfig
from tests.log_lines import TickingClock
from tests.tf.test_tf_estimator import default_params, input_fn, model_fn, zoo_log


def estimator(model_dir, device="cpu"):
    config = RunConfig(model_dir=str(model_dir), save_checkpoints_steps=2, save_summary_steps=2,
                       keep_checkpoint_max=0, device=device)
    return CerebrasEstimator(model_fn, config=config, params=load_params(None, default_params()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("trained")
    estimator(model_dir).train(input_fn, max_steps=2)
    return model_dir


def progress_of(caplog, what):
    return [m for _, m in zoo_log(caplog) if m.startswith(f"{what} on ")]


@pytest.mark.parametrize("device", ["cpu", "emulator"])
def test_evaluate_and_predict_log_their_progress_on_each_backend(trained, device, monkeypatch, caplog):
    monkeypatch.setattr(log, "clock", TickingClock(10))
    with caplog.at_level(logging.INFO, logger="zoo"):
        estimator(trained, device).evaluate(input_fn)  # 16 examples in batches of 4
    # batch k of 4 ends 10k seconds after the loop began: a line at each tenth reached but the last
    assert progress_of(caplog, "eval") == [
        f"eval on {device}: {k} of 4 batches, 0.10 batches/sec ({25 * k}%, 0:00:{(4 - k) * 10} left)"
        for k in (1, 2, 3)]
    assert zoo_log(caplog)[-1][1].startswith(f"| Eval Device={device} Step=2 accuracy=")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        batches = list(estimator(trained, device).predict(input_fn, yield_single_examples=False, max_batches=3))
    assert len(batches) == 3
    assert progress_of(caplog, "predict") == [
        f"predict on {device}: {k} of 3 batches, 0.10 batches/sec ({33 * k + k // 2}%, 0:00:{(3 - k) * 10} left)"
        for k in (1, 2)]


def test_eval_steps_is_the_total_of_the_progress(trained, monkeypatch, caplog):
    monkeypatch.setattr(log, "clock", TickingClock(10))
    with caplog.at_level(logging.INFO, logger="zoo"):
        estimator(trained).evaluate(input_fn, steps=2)
    assert progress_of(caplog, "eval") == ["eval on cpu: 1 of 2 batches, 0.10 batches/sec (50%, 0:00:10 left)"]


def filtered_input_fn(params, mode):
    """input_fn's batches through a filter: tf.data no longer knows how many there are."""
    return input_fn(params, mode).filter(lambda x, y: True)


def test_without_a_known_cardinality_the_lines_give_the_batches_done_and_the_rate(trained, monkeypatch, caplog):
    monkeypatch.setattr(log, "clock", TickingClock(10))
    with caplog.at_level(logging.INFO, logger="zoo"):
        estimator(trained).evaluate(filtered_input_fn)
    # 30 seconds after the loop began, at the third batch of four
    assert progress_of(caplog, "eval") == ["eval on cpu: 3 batches, 0.10 batches/sec"]
