"""CerebrasEstimator.train_loop with a scripted step: when it logs, saves, warns and stops.

The step backend is replaced by a script (the loss, batch and logged values of each step, or
what it raises), so each test pins the loop's own decisions exactly: which steps log and
save, the listeners and before_save calls, the TensorBoard scalars, the lines of a stop."""

import logging
import math
import os
import re
import signal

import numpy as np
import pytest
import tensorflow as tf

from common.errors import NonFiniteGradient, NonFiniteLossError, UserError
from common.interrupt import Interrupted
from common.params import load_params
from common.summaries import read_scalars
from common.tf.estimator import CerebrasEstimator, EstimatorSpec, ModeKeys, RunConfig
from common.tf.estimator.cs_estimator import CpuTrainStep, SessionSteps
from common.tf.estimator.graph import where
from common.tf.estimator.session import GraphSession
from common.tf.optim import build_train_op
from tests.tf.test_tf_estimator import default_params, input_fn, model_fn, zoo_log
from tests.log_lines import assert_log, train_line

NON_FINITE_ADVICE = "(lower the learning rate, or clip gradients with optimizer.max_gradient_norm)"


class ScriptedStep:
    """A train step whose results come from ``script``: {step: a callable run at that step, or an
    exception to raise}; every other step returns the loss step/4 + 0.25, batch 4, and, when asked
    to log, an lr, a loss scale and a model_fn summary."""

    on = " (scripted)"

    def __init__(self, run, script=None):
        self.run, self.script = run, script or {}
        self.calls, self.before_saves = [], []

    def __call__(self, step, log_now):
        self.calls.append((step, log_now))
        assert len(self.calls) <= 100, "the loop does not end"  # no test runs more than 10 steps
        action = self.script.get(step)
        if isinstance(action, BaseException):
            raise action
        if action is not None:
            returned = action()
            if returned is not None:
                return returned
        logged = {}
        if log_now:
            summary = tf.compat.v1.Summary(value=[
                tf.compat.v1.Summary.Value(tag="mine", simple_value=10.0 + step),
                tf.compat.v1.Summary.Value(tag="a_histogram", histo=tf.compat.v1.HistogramProto(num=1))])
            logged = {"lr": np.float32(0.5 / (step + 1)), "loss_scale": np.float32(2.0 ** step),
                      "summary": summary.SerializeToString()}
        return step / 4 + 0.25, 4, logged

    def before_save(self, step):
        self.before_saves.append(step)


class Loop:
    """An estimator, its training session, a scripted step and the listener calls."""

    def __init__(self, tmp_path, script=None, warm_start_from=None, **config):
        config = {"save_checkpoints_steps": 2, "save_summary_steps": 2, "keep_checkpoint_max": 0, **config}
        self.model_dir = str(tmp_path / "model")
        self.estimator = CerebrasEstimator(model_fn, config=RunConfig(model_dir=self.model_dir, **config),
                                           params=load_params(None, default_params()),
                                           warm_start_from=warm_start_from)
        self.run = GraphSession(self.estimator.build(input_fn, ModeKeys.TRAIN), self.estimator.config)
        self.step = ScriptedStep(self.run, script)
        self.listened = []

    def __call__(self, first, last):
        try:
            self.estimator.train_loop(self.run, first, last, (lambda path, step: self.listened.append((path, step)),),
                                      self.step)
        finally:
            self.run.close()

    def ckpt(self, step):
        return f"{self.model_dir}/model.ckpt-{step}"

    def saved(self):
        return sorted(int(name.split("-")[1].split(".")[0]) for name in
                      os.listdir(self.model_dir) if name.endswith(".index"))


def test_the_loop_logs_every_save_summary_steps_and_at_the_end_and_saves_every_checkpoint_steps(tmp_path, caplog):
    loop = Loop(tmp_path, keep_checkpoint_max=2)
    with caplog.at_level(logging.INFO, logger="zoo"):
        loop(1, 6)
    assert loop.step.calls == [(1, True), (2, False), (3, True), (4, False), (5, True)]
    assert loop.step.before_saves == [2, 4, 6]
    assert loop.listened == [(loop.ckpt(2), 2), (loop.ckpt(4), 4), (loop.ckpt(6), 6)]
    assert loop.saved() == [4, 6]  # keep_checkpoint_max 2
    assert_log(zoo_log(caplog), [
        ("INFO", train_line(2, 0.5, 20)), ("INFO", f"saved {loop.ckpt(2)}"),
        ("INFO", train_line(4, 1.0, 60)), ("INFO", f"saved {loop.ckpt(4)}"),
        ("INFO", train_line(6, 1.5, 100)), ("INFO", f"saved {loop.ckpt(6)}")])
    scalars = read_scalars(f"{loop.model_dir}/train")
    assert sorted(scalars) == ["global_step/sec", "loss", "loss_scale", "lr", "mine", "samples_per_sec"]
    assert scalars["loss"] == [(2, 0.5), (4, 1.0), (6, 1.5)]
    assert scalars["lr"] == [(2, 0.25), (4, 0.125), (6, pytest.approx(0.5 / 6))]
    assert scalars["loss_scale"] == [(2, 2.0), (4, 8.0), (6, 32.0)]
    assert scalars["mine"] == [(2, 11.0), (4, 13.0), (6, 15.0)]
    for (step, rate), (same_step, per_step) in zip(scalars["samples_per_sec"], scalars["global_step/sec"]):
        assert step == same_step and rate > 0 and per_step == pytest.approx(rate / 4, rel=1e-6)


def test_checkpoint_steps_0_saves_at_the_end_only_and_a_run_already_at_its_last_step_saves_nothing(tmp_path, caplog):
    loop = Loop(tmp_path, save_checkpoints_steps=0, save_summary_steps=5)
    loop(0, 3)
    assert loop.step.calls == [(0, False), (1, False), (2, True)]
    assert loop.listened == [(loop.ckpt(3), 3)] and loop.saved() == [3]
    again = Loop(tmp_path / "again")
    again(3, 3)
    assert again.step.calls == [] and again.listened == [] and again.step.before_saves == []


def test_a_dataset_that_ends_warns_and_the_steps_done_are_saved(tmp_path, caplog):
    loop = Loop(tmp_path, {3: tf.errors.OutOfRangeError(None, None, "End of sequence")})
    with caplog.at_level(logging.INFO, logger="zoo"):
        loop(0, 6)
    assert loop.step.calls == [(0, False), (1, True), (2, False), (3, True)]
    assert loop.listened == [(loop.ckpt(2), 2), (loop.ckpt(3), 3)] and loop.saved() == [2, 3]
    assert zoo_log(caplog)[-2:] == [
        ("WARNING", "the training dataset ended at step 3, before step 6: repeat it in TRAIN mode (the device needs "
                    "a repeating dataset)"), ("INFO", f"saved {loop.ckpt(3)}")]


def test_a_damaged_record_stops_with_one_line_naming_the_step_and_the_checkpoint_kept(tmp_path):
    loop = Loop(tmp_path, {2: tf.errors.DataLossError(None, None, "corrupted record at 120")})
    with pytest.raises(UserError) as error:
        loop(0, 6)
    assert str(error.value) == (
        f"the training data holds a damaged record at step 3 (corrupted record at 120): one of its input files is "
        f"corrupt or was cut short; write it again; the newest checkpoint is kept: {loop.ckpt(2)}")
    assert loop.saved() == [2]


def test_a_non_finite_gradient_stops_before_the_step_counts_and_names_the_last_good_checkpoint(tmp_path):
    loop = Loop(tmp_path, {3: NonFiniteGradient("dense/kernel", math.inf)})
    with pytest.raises(NonFiniteLossError) as error:
        loop(0, 6)
    assert str(error.value) == (f"the gradient of dense/kernel is inf at step 4; stopping. The last good checkpoint "
                                f"is kept: {loop.ckpt(2)} {NON_FINITE_ADVICE}")
    assert loop.saved() == [2] and loop.step.before_saves == [2]


@pytest.mark.parametrize("at", [0, 3])
def test_a_non_finite_loss_stops_before_it_is_logged_or_saved(tmp_path, caplog, at):
    loop = Loop(tmp_path, {at: lambda: (math.nan, 4, {})})
    with caplog.at_level(logging.INFO, logger="zoo"), pytest.raises(NonFiniteLossError) as error:
        loop(0, 6)
    kept = loop.ckpt(2) if at else "none (no checkpoint was written yet)"
    assert str(error.value) == (f"the loss is nan at step {at + 1}; stopping. The last good checkpoint is kept: "
                                f"{kept} {NON_FINITE_ADVICE}")
    assert loop.saved() == ([2] if at else [])
    assert not any(f"Step={at + 1} " in message for _, message in zoo_log(caplog))
    assert read_scalars(f"{loop.model_dir}/train").get("loss", []) == ([(2, 0.5)] if at else [])


def test_a_variable_that_overflows_is_never_saved(tmp_path):
    loop = Loop(tmp_path)

    def overflow():
        kernel = next(v for v in loop.run.built.variables if v.op.name == "dense/kernel")
        value = np.ones(kernel.shape.as_list(), np.float32)
        value[1, 2] = -np.inf
        with loop.run.built.graph.as_default():
            kernel.load(value, loop.run.session)

    loop.step.script = {2: overflow}
    with pytest.raises(NonFiniteLossError) as error:
        loop(0, 6)
    assert str(error.value) == (f"the variable dense/kernel is -inf (not saved) at step 4; stopping. The last good "
                                f"checkpoint is kept: {loop.ckpt(2)} {NON_FINITE_ADVICE}")
    assert loop.saved() == [2] and loop.step.before_saves == [2, 4] and loop.listened == [(loop.ckpt(2), 2)]


def sigint():
    signal.raise_signal(signal.SIGINT)


def test_a_signal_finishes_the_step_saves_it_without_the_listeners_and_says_where_to_resume(tmp_path):
    loop = Loop(tmp_path, {2: sigint})
    with pytest.raises(Interrupted) as stopped:
        loop(0, 6)
    assert stopped.value.signum == signal.SIGINT
    assert str(stopped.value) == f"interrupted by SIGINT at step 3 of 6; saved {loop.ckpt(3)}: the same command " \
                                 f"resumes from there"
    assert loop.step.calls[-1] == (2, False) and loop.saved() == [2, 3] and loop.listened == [(loop.ckpt(2), 2)]


def test_a_signal_at_a_checkpoint_step_saves_once_and_at_the_last_step_ends_the_run(tmp_path):
    loop = Loop(tmp_path, {3: sigint})
    with pytest.raises(Interrupted) as stopped:
        loop(0, 6)
    assert str(stopped.value) == f"interrupted by SIGINT at step 4 of 6; saved {loop.ckpt(4)}: the same command " \
                                 f"resumes from there"
    assert loop.saved() == [2, 4] and loop.step.before_saves == [2, 4]
    last = Loop(tmp_path / "last", {5: sigint})
    try:  # the stop came with the last step: the run ends as it would have
        last(0, 6)
    except Interrupted as e:  # a KeyboardInterrupt: pytest would take it for a Ctrl-C and stop, not fail the test
        pytest.fail(f"a stop with the last step raised {e!r}")
    assert last.saved() == [2, 4, 6] and last.listened[-1] == (last.ckpt(6), 6)


def test_a_second_signal_stops_mid_step_and_names_the_newest_checkpoint(tmp_path):
    loop = Loop(tmp_path, {3: lambda: (sigint(), sigint())})
    with pytest.raises(Interrupted) as stopped:
        loop(0, 6)
    assert stopped.value.signum == signal.SIGINT
    assert str(stopped.value) == (f"interrupted by SIGINT at step 3 of 6; the newest checkpoint is {loop.ckpt(2)} "
                                  f"(step 2): the same command resumes from it")
    assert loop.saved() == [2]


def test_a_stop_of_a_run_started_from_checkpoint_path_says_a_rerun_would_start_there_again(tmp_path):
    first = Loop(tmp_path / "first")
    first(0, 2)
    loop = Loop(tmp_path, {2: lambda: (sigint(), sigint())}, warm_start_from=first.ckpt(2))
    with pytest.raises(Interrupted) as stopped:
        loop(2, 6)
    assert str(stopped.value) == (f"interrupted by SIGINT at step 2 of 6, before this run's first checkpoint; the same "
                                  f"command starts again from {first.ckpt(2)} (step 2)")
    resumed = Loop(tmp_path / "resumed", {2: sigint}, warm_start_from=first.ckpt(2))
    with pytest.raises(Interrupted) as stopped:
        resumed(2, 6)
    assert str(stopped.value) == (
        f"interrupted by SIGINT at step 3 of 6; saved {resumed.ckpt(3)}: to resume from it, run the same command "
        f"without --checkpoint_path (with it, the run starts from {first.ckpt(2)} again)")


# --- CpuTrainStep: one step in the TF session --------------------------------------------------

def one_weight(loss_of):
    """A model_fn of one weight ``w`` (0 at the start) whose loss is ``loss_of(w, features)``."""

    def model(features, labels, mode, params):
        w = tf.compat.v1.get_variable("w", shape=(), initializer=tf.compat.v1.zeros_initializer())
        loss = loss_of(w, features)
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return model


def training_session(tmp_path, model, train_input=input_fn):
    """An estimator of ``model`` in tmp_path and its TRAIN graph's session."""
    estimator = CerebrasEstimator(model, config=RunConfig(model_dir=str(tmp_path)),
                                  params=load_params(None, default_params()))
    return estimator, GraphSession(estimator.build(train_input, ModeKeys.TRAIN), estimator.config)


def cpu_step(tmp_path, model, train_input=input_fn):
    _, run = training_session(tmp_path, model, train_input)
    return run, CpuTrainStep(run, model)


def test_a_cpu_step_fetches_the_logged_values_only_when_asked_and_the_batch_from_the_graph(tmp_path):
    run, step = cpu_step(tmp_path, model_fn)
    loss, batch, logged = step(0, False)
    assert type(loss) is float and math.isfinite(loss) and batch == 4 and logged == {} and run.step() == 1
    loss, batch, logged = step(1, True)
    assert type(loss) is float and batch == 4 and sorted(logged) == ["lr", "step"] and run.step() == 2
    assert logged["lr"] == np.float32(0.1) and logged["step"][1] == loss
    run.close()

    def uneven(params, mode):  # 6 examples in batches of 4: the second batch has 2
        return input_fn(params, mode).unbatch().take(6).batch(4)

    run, step = cpu_step(tmp_path / "uneven", model_fn, uneven)
    assert step.batch_size is None
    assert [step(0, False)[1], step(1, True)[1]] == [4, 2]
    run.close()


def test_a_cpu_step_reports_a_non_finite_loss_and_names_a_non_finite_gradient(tmp_path):
    run, step = cpu_step(tmp_path / "loss", one_weight(lambda w, x: w + tf.reduce_mean(x) * np.inf))
    loss, batch, logged = step(0, True)
    assert math.isinf(loss) and batch == 0 and logged == {} and run.step() == 0  # the step did not happen
    run.close()
    run, step = cpu_step(tmp_path / "gradient", one_weight(lambda w, x: tf.sqrt(w) + tf.reduce_mean(x) * 0))
    with pytest.raises(NonFiniteGradient) as error:
        step(0, False)
    assert (error.value.name, error.value.value) == ("w", math.inf) and run.step() == 0
    run.close()
    run, step = cpu_step(tmp_path / "nan", one_weight(lambda w, x: tf.sqrt(w - 1) + tf.reduce_mean(x) * 0))
    loss, batch, logged = step(0, False)
    assert math.isnan(loss) and batch == 0 and logged == {} and run.step() == 0
    run.close()


def test_a_cpu_step_leaves_a_check_of_the_models_own_to_tensorflow(tmp_path):
    own = one_weight(lambda w, x: tf.debugging.check_numerics(w + tf.reduce_mean(x) * np.nan, "my own check"))
    run, step = cpu_step(tmp_path, own)
    with pytest.raises(tf.errors.InvalidArgumentError, match="my own check"):
        step(0, False)
    run.close()


def stuck(features, labels, mode, params):
    """A model_fn whose train_op leaves the global step where it is."""
    w = tf.compat.v1.get_variable("w", shape=(), initializer=tf.compat.v1.zeros_initializer())
    loss = tf.reduce_mean(features) * w + w * w
    return EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss))


def test_a_train_op_that_leaves_the_global_step_is_refused_at_the_first_step_only(tmp_path):
    run, step = cpu_step(tmp_path, stuck)
    with pytest.raises(UserError) as error:
        step(0, False)
    assert str(error.value) == (
        f"{where(stuck)}: train_op does not increment the global step; pass "
        f"global_step=tf.compat.v1.train.get_or_create_global_step() to minimize (common.tf.optim.build_train_op does)")
    assert step(5, False)[1] == 4  # checked once: the loop stops at the first
    run.close()


def test_the_cpu_backends_step_names_the_model_fn_and_the_compute_precision(tmp_path):
    run, _ = cpu_step(tmp_path, stuck)
    backend_step = SessionSteps(stuck, load_params(None, default_params())).train_step(run)  # the CPU backend's
    assert backend_step.on == " (float32 compute)"
    with pytest.raises(UserError) as error:
        backend_step(0, False)
    assert str(error.value).startswith(f"{where(stuck)}: train_op does not increment the global step")
    run.close()


def test_the_loop_steps_the_tf_session_by_default(tmp_path):
    """train_loop without a step (as benchmarks/tf_runner.py calls it) runs the session's train_op."""
    estimator, run = training_session(tmp_path / "trains", model_fn)
    estimator.train_loop(run, 0, 3, ())
    assert run.step() == 3 and os.path.exists(tmp_path / "trains" / "model.ckpt-3.index")
    run.close()
    estimator, run = training_session(tmp_path / "stuck", stuck)
    with pytest.raises(UserError, match=re.escape(f"{where(stuck)}: train_op does not increment")):
        estimator.train_loop(run, 0, 2, ())
    run.close()
    assert estimator.latest_checkpoint() is None  # the refused run saved nothing


def test_a_multi_worker_step_that_lost_a_peer_is_one_line_and_any_other_error_is_tensorflows(tmp_path, monkeypatch):
    import json

    kind = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:1", "h:2"]},
                                                "task": {"type": "worker", "index": 1}}))
    monkeypatch.setenv("ZOO_DIST_TIMEOUT_S", "30")
    run, step = cpu_step(tmp_path, model_fn)

    def gone(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "peer gone")

    run.session.run, run_op = gone, run.session.run
    with pytest.raises(tf.errors.UnavailableError):  # one process: TensorFlow's own error
        step(0, False)
    run.built.strategy = kind.__new__(kind)  # a worker of two (its type is what is read)
    with pytest.raises(UserError) as error:
        step(0, True)
    assert str(error.value) == (
        "worker 1: a step failed (UnavailableError): another worker stopped or cannot be reached (steps give up "
        "after ZOO_DIST_TIMEOUT_S=30 s); the same command on every worker resumes from the newest checkpoint")
    run.session.run = run_op
    run.close()


def test_train_runs_the_loop_with_its_backends_step(tmp_path, caplog):
    est = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path), save_checkpoints_steps=2),
                            params=load_params(None, default_params()))
    made = []

    class Backend:  # as EmulatorSteps: its own step, not the session's
        mixed_policy = True

        def train_step(self, run):
            made.append(ScriptedStep(run))
            return made[-1]

    est.step_backend = Backend
    with caplog.at_level(logging.INFO, logger="zoo"):
        est.train(input_fn, max_steps=3)
    assert len(made) == 1 and made[0].calls == [(0, False), (1, False), (2, True)]  # logged at the last step
    assert ("INFO", f"training {where(model_fn)} (scripted) from step 0 to 3") in zoo_log(caplog)
    assert read_scalars(f"{tmp_path}/train")["loss"] == [(3, 0.75)] and made[0].before_saves == [2, 3]
