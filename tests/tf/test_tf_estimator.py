"""The Estimator runner against small mock models: the contract, bad input, NaN, checkpoint safety."""

import logging
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from common.errors import UserError
from common.summaries import read_scalars
from common.tf.estimator import CerebrasEstimator, CSEstimatorSpec, EstimatorSpec, ModeKeys, RunConfig
from common.tf.estimator import checkpoints
from common.tf.estimator.cs_estimator import GraphSession
from common.tf.estimator.session import is_weight_or_slot
from common.tf.optim import build_train_op
from common.tf.run import run

FEATURES, CLASSES, EXAMPLES = 6, 3, 16


def default_params():
    return {"model": {"dropout": 0.0}, "optimizer": {"optimizer_type": "sgd", "learning_rate": 0.1},
            "runconfig": {"max_steps": 4, "checkpoint_steps": 2, "log_steps": 1}}


def input_fn(params, mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)  # (N, 6)
    y = (np.arange(EXAMPLES) % CLASSES).astype(np.int64)  # (N,)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if mode == ModeKeys.TRAIN:
        dataset = dataset.shuffle(EXAMPLES).repeat()
    return dataset.batch(4, drop_remainder=True)


def model_fn(features, labels, mode, params):
    """A linear classifier; accuracy through host_call."""
    h = keras.layers.Dropout(params["model"]["dropout"])(features, training=mode == ModeKeys.TRAIN)  # (B, 6)
    tf.compat.v1.add_to_collection("dropped", h)
    logits = keras.layers.Dense(CLASSES, name="dense")(h)  # (B, 3)
    if mode == ModeKeys.PREDICT:
        assert labels is None
        return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, -1)})
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == ModeKeys.TRAIN:
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    metric = lambda labels, logits: {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}
    return CSEstimatorSpec(mode, loss=loss, host_call=(metric, [labels, logits]))


def run_mock(tmp_path, *argv, model=model_fn, train_input=input_fn, eval_input=input_fn):
    """common.tf.run.run with a mock model; returns its result, or the SystemExit it raised."""
    params = tmp_path / "params.yaml"
    if not params.exists():
        params.write_text("runconfig: {seed: 1}\n")
    try:
        return run(model, train_input, eval_input, default_params,
                   argv=["--params", str(params), "--model_dir", str(tmp_path / "model"), *argv])
    except SystemExit as e:
        return e


def assert_one_line_error(result, capsys, *fragments):
    assert isinstance(result, SystemExit) and result.code != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    for fragment in fragments:
        assert fragment in err[0]
    return err[0]


def test_mode_keys_are_tf_estimator_values():
    assert (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT) == ("train", "eval", "infer")


def _numpy_model(checkpoint):
    """The mock model's eval set, labels and logits from the checkpoint's weights, in numpy."""
    reader = tf.train.load_checkpoint(checkpoint)
    x = np.random.default_rng(0).normal(size=(EXAMPLES, FEATURES)).astype(np.float32)  # input_fn's (N, 6)
    logits = x @ reader.get_tensor("dense/kernel") + reader.get_tensor("dense/bias")  # (N, 3)
    return np.arange(EXAMPLES) % CLASSES, logits


def test_mock_model_trains_evaluates_and_predicts(tmp_path):
    assert run_mock(tmp_path) is None
    metrics = run_mock(tmp_path, "--mode", "eval")
    # eval scores the checkpoint's weights: accuracy and mean loss over the 16 examples
    labels, logits = _numpy_model(str(tmp_path / "model" / "model.ckpt-4"))
    shifted = logits - logits.max(-1, keepdims=True)
    loss = np.mean(np.log(np.exp(shifted).sum(-1)) - shifted[np.arange(EXAMPLES), labels])
    assert metrics["global_step"] == 4
    assert metrics["accuracy"] == np.mean(logits.argmax(-1) == labels)
    assert metrics["loss"] == pytest.approx(loss, rel=1e-5)
    path = run_mock(tmp_path, "--mode", "predict")
    with np.load(path) as predictions:
        np.testing.assert_array_equal(predictions["classes"], logits.argmax(-1))  # (16,), in the eval set's order


def test_model_fn_returning_a_non_spec(tmp_path, capsys):
    def bad_model_fn(features, labels, mode, params):
        return {"loss": tf.reduce_sum(features)}

    result = run_mock(tmp_path, model=bad_model_fn)
    line = assert_one_line_error(result, capsys, "bad_model_fn", "returned dict", "EstimatorSpec")
    assert "test_tf_estimator.py:" in line
    assert not (tmp_path / "model").exists()


def test_train_without_train_op(tmp_path, capsys):
    def no_train_op(features, labels, mode, params):
        return EstimatorSpec(mode, loss=tf.reduce_sum(keras.layers.Dense(1)(features)))

    assert_one_line_error(run_mock(tmp_path, model=no_train_op), capsys, "no_train_op", "no train_op")
    assert not (tmp_path / "model").exists()


def test_host_call_and_eval_metric_ops_together(tmp_path, capsys):
    def both(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES)(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))
        return CSEstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy},
                               host_call=(lambda: {"accuracy": accuracy}, []))

    assert run_mock(tmp_path) is None
    assert_one_line_error(run_mock(tmp_path, "--mode", "eval", model=both), capsys,
                          "both host_call and eval_metric_ops")


def test_input_fn_returning_a_non_dataset(tmp_path, capsys):
    def arrays_input_fn(params, mode):
        return np.zeros((4, FEATURES), np.float32), np.zeros(4, np.int64)

    assert_one_line_error(run_mock(tmp_path, train_input=arrays_input_fn), capsys,
                          "arrays_input_fn", "returned tuple", "tf.data.Dataset")
    assert not (tmp_path / "model").exists()


def test_unknown_batch_dimension_runs_on_cpu_and_warns(tmp_path, capsys):
    def ragged_batches(params, mode):
        return input_fn(params, mode).unbatch().batch(4)  # drop_remainder=False: (None, 6)

    assert run_mock(tmp_path, train_input=ragged_batches) is None
    err = capsys.readouterr().err
    assert "ragged_batches" in err and "not static" in err and "drop_remainder=True" in err
    assert os.path.isfile(tmp_path / "model" / "model.ckpt-4.index")


def test_missing_checkpoint_path(tmp_path, capsys):
    assert_one_line_error(run_mock(tmp_path, "--checkpoint_path", str(tmp_path / "nope" / "model.ckpt-9")), capsys,
                          "no such checkpoint")
    assert not (tmp_path / "model").exists()


def test_corrupt_checkpoint_overwrites_nothing(tmp_path, capsys):
    assert run_mock(tmp_path) is None
    params_file = tmp_path / "model" / "params_train.yaml"
    params_before = params_file.read_text()
    listing = sorted(os.listdir(tmp_path / "model"))
    for step in (2, 4):  # a damaged newest alone would be passed over for the one before it
        (tmp_path / "model" / f"model.ckpt-{step}.index").write_bytes(b"\x00garbage" * 10)
    assert_one_line_error(run_mock(tmp_path, "runconfig.max_steps=6", "model.dropout=0.5"), capsys,
                          "no readable checkpoint", "model.ckpt-4.index", "model.ckpt-2.index")
    assert sorted(os.listdir(tmp_path / "model")) == listing
    assert params_file.read_text() == params_before


def test_eval_without_checkpoint(tmp_path, capsys):
    assert_one_line_error(run_mock(tmp_path, "--mode", "eval"), capsys, "no checkpoint to evaluate")


def test_checkpoint_of_another_model(tmp_path, capsys):
    assert run_mock(tmp_path) is None

    def wider(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES + 1, name="dense")(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    assert_one_line_error(run_mock(tmp_path, "runconfig.max_steps=6", model=wider), capsys,
                          "'dense/kernel' has shape [6, 3]", "[6, 4]")


@pytest.mark.parametrize("mode", ["eval", "predict", "train"])
def test_a_checkpoint_without_a_model_variable_is_refused(tmp_path, capsys, mode):
    """Evaluating (or resuming) a model with a layer the checkpoint lacks would report metrics
    of that layer's random initial weights: one error line naming the variable instead."""
    assert run_mock(tmp_path) is None

    def deeper(features, labels, mode, params):
        h = keras.layers.Dense(FEATURES, name="extra")(features)  # not in the checkpoint
        logits = keras.layers.Dense(CLASSES, name="dense")(h)
        if mode == ModeKeys.PREDICT:
            return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, -1)})
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        if mode == ModeKeys.TRAIN:
            return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
        return EstimatorSpec(mode, loss=loss)

    assert_one_line_error(run_mock(tmp_path, "--mode", mode, "runconfig.max_steps=6", model=deeper), capsys,
                          "model.ckpt-4: holds no 'extra/", "nor 1 more model variables", "another model")


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
    def diverging(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES)(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        step = tf.compat.v1.train.get_global_step()
        loss = tf.where(step >= 2, tf.constant(np.nan, tf.float32), loss)  # the third step's loss is NaN
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    result = run_mock(tmp_path, "runconfig.checkpoint_steps=1", model=diverging)
    assert result.code == 3
    line = assert_one_line_error(result, capsys, "loss is nan at step 3", "model.ckpt-2")
    assert "stopping" in line
    assert checkpoints.latest_checkpoint(str(tmp_path / "model")).endswith("model.ckpt-2")
    assert not os.path.exists(tmp_path / "model" / "model.ckpt-3.index")


def test_train_op_that_leaves_the_global_step(tmp_path, capsys):
    def stuck(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES)(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss))

    assert_one_line_error(run_mock(tmp_path, model=stuck), capsys, "does not increment the global step")


def test_eval_dataset_that_repeats_forever(tmp_path, capsys):
    assert run_mock(tmp_path) is None
    forever = lambda params, mode: input_fn(params, ModeKeys.TRAIN)
    assert_one_line_error(run_mock(tmp_path, "--mode", "eval", eval_input=forever), capsys, "repeats forever")
    metrics = run_mock(tmp_path, "--mode", "eval", "--eval_steps", "3", eval_input=forever)
    assert metrics["global_step"] == 4


def test_a_kill_while_saving_leaves_the_previous_checkpoint_latest(tmp_path, monkeypatch):
    """Killed after step 4's tensor files are written but before the state file names them:
    the latest checkpoint is still step 2, complete, and a restart resumes from it."""
    real_write_state = checkpoints.write_state

    def killed_at_step_4(model_dir, paths):
        if paths[-1].endswith("-4"):
            raise KeyboardInterrupt
        real_write_state(model_dir, paths)

    monkeypatch.setattr(checkpoints, "write_state", killed_at_step_4)
    killed = run_mock(tmp_path)
    assert isinstance(killed, SystemExit) and killed.code == 130  # as a Ctrl-C ends a run (common/cli.py)
    monkeypatch.setattr(checkpoints, "write_state", real_write_state)
    model_dir = str(tmp_path / "model")
    latest = checkpoints.latest_checkpoint(model_dir)
    assert latest.endswith("model.ckpt-2")
    checkpoints.read_checkpoint(latest)  # complete and readable
    assert run_mock(tmp_path, "runconfig.max_steps=5") is None
    assert [s for s, _ in read_scalars(os.path.join(model_dir, "train"))["loss"]] == [1, 2, 3, 4, 3, 4, 5]


def test_keras_dropout_draws_a_new_mask_every_step(tmp_path):
    """In a TF1 graph Keras 3's Dropout would reuse its first mask; the runner advances its seed."""
    params = {**default_params(), "model": {"dropout": 0.5}}
    from common.params import load_params

    estimator = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path)),
                                  params=load_params(None, params))
    run = GraphSession(estimator.build(input_fn, ModeKeys.TRAIN), estimator.config)
    dropped = run.built.graph.get_collection("dropped")[0]
    masks = [run.session.run([run.built.train_op, dropped])[1] != 0 for _ in range(3)]
    run.close()
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])


def test_keras_batch_norm_moving_statistics_update_in_training(tmp_path):
    """Keras 3's BatchNormalization updates its moving mean/variance with orphan assigns in a TF1 graph."""
    def with_bn(features, labels, mode, params):
        h = keras.layers.BatchNormalization(momentum=0.5, name="bn")(features, training=mode == ModeKeys.TRAIN)
        logits = keras.layers.Dense(CLASSES, name="dense")(h)  # (B, 3)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    from common.params import load_params

    estimator = CerebrasEstimator(with_bn, config=RunConfig(model_dir=str(tmp_path)),
                                  params=load_params(None, default_params()))
    run = GraphSession(estimator.build(input_fn, ModeKeys.TRAIN), estimator.config)
    with run.built.graph.as_default():
        moving_mean = next(v for v in tf.compat.v1.global_variables() if "moving_mean" in v.name)
    before = run.session.run(moving_mean)
    run.session.run(run.built.train_op)
    after = run.session.run(moving_mean)
    run.close()
    assert np.all(before == 0) and np.all(after != 0)


def test_model_fn_scalar_summaries_reach_tensorboard(tmp_path):
    def with_summary(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        if mode == ModeKeys.TRAIN:
            tf.compat.v1.summary.scalar("feature_mean", tf.reduce_mean(features))
        return spec

    assert run_mock(tmp_path, model=with_summary) is None
    scalars = read_scalars(str(tmp_path / "model" / "train"))
    assert [s for s, _ in scalars["feature_mean"]] == [1, 2, 3, 4]


def test_estimator_api_directly(tmp_path):
    from common.params import load_params

    params = load_params(None, default_params())
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "est"), params=params,
                                  config=RunConfig(save_checkpoints_steps=3, save_summary_steps=3))
    estimator.train(input_fn, max_steps=6)
    assert checkpoints.list_checkpoints(str(tmp_path / "est"))[-1].endswith("model.ckpt-6")
    metrics = estimator.evaluate(input_fn, steps=2)
    assert metrics["global_step"] == 6
    predictions = list(estimator.predict(input_fn))
    assert len(predictions) == EXAMPLES and set(predictions[0]) == {"classes"}
    with pytest.raises(UserError, match="exactly one of steps and max_steps"):
        estimator.train(input_fn)


def test_checkpoint_steps_0_saves_only_at_the_end_and_keep_0_keeps_every_one(tmp_path):
    # common/params.py's meaning of 0, as the PyTorch runner has it
    from common.params import load_params

    params = load_params(None, default_params())
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "end"), params=params,
                                  config=RunConfig(save_checkpoints_steps=0, save_summary_steps=1))
    estimator.train(input_fn, max_steps=3)
    assert [os.path.basename(p) for p in checkpoints.list_checkpoints(str(tmp_path / "end"))] == ["model.ckpt-3"]
    estimator = CerebrasEstimator(model_fn, model_dir=str(tmp_path / "all"), params=params,
                                  config=RunConfig(save_checkpoints_steps=1, keep_checkpoint_max=0))
    estimator.train(input_fn, max_steps=7)
    assert len(checkpoints.list_checkpoints(str(tmp_path / "all"))) == 7
    with pytest.raises(UserError,
                       match=r"runconfig.log_steps \(RunConfig.save_summary_steps\) must be at least 1, got 0"):
        RunConfig(save_summary_steps=0)
    with pytest.raises(UserError, match=r"runconfig.checkpoint_steps .* must be at least 0, got -1"):
        RunConfig(save_checkpoints_steps=-1)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="a GPU is visible")
def test_device_gpu_without_a_gpu(tmp_path, capsys):
    assert_one_line_error(run_mock(tmp_path, "--device", "gpu"), capsys, "--device gpu", "no GPU")
    assert not (tmp_path / "model").exists()


# --- the runner's pieces on their own: a restore's messages, what a compile leaves uninitialised,
# RunConfig's checks, train_and_evaluate, the summary switches


def zoo_log(caplog) -> list[tuple[str, str]]:
    """The zoo's own records (level, message): TensorFlow's logger propagates to the root as well."""
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "zoo"]


def session_of(model, tmp_path, train_input=input_fn):
    """A GraphSession of ``model`` training the mock input, SGD as default_params has it."""
    from common.params import load_params

    estimator = CerebrasEstimator(model, config=RunConfig(model_dir=str(tmp_path)),
                                  params=load_params(None, default_params()))
    return GraphSession(estimator.build(train_input, ModeKeys.TRAIN), estimator.config)


def saved_mock_checkpoint(tmp_path):
    """A checkpoint of model_fn's initial graph: dense/kernel, dense/bias and global_step."""
    run = session_of(model_fn, tmp_path / "first")
    with run.built.graph.as_default():
        path = tf.compat.v1.train.Saver().save(run.session, str(tmp_path / "first" / "model.ckpt"), global_step=0)
    run.close()
    return path


def with_extra_layer(bias: bool):
    def model(features, labels, mode, params):
        h = keras.layers.Dense(FEATURES, use_bias=bias, name="extra")(features)  # not in the checkpoint
        logits = keras.layers.Dense(CLASSES, name="dense")(h)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))
    return model


@pytest.mark.parametrize("bias,message", [
    (False, "{path}: holds no 'extra/kernel'; a checkpoint of another model?"),
    (True, "{path}: holds no 'extra/kernel' (nor 1 more model variables); a checkpoint of another model?")])
def test_a_restore_names_the_first_model_variable_the_checkpoint_lacks_and_counts_the_others(tmp_path, bias, message):
    path = saved_mock_checkpoint(tmp_path)
    run = session_of(with_extra_layer(bias), tmp_path / "second")
    with pytest.raises(UserError) as refused:
        run.restore(path)
    run.close()
    assert str(refused.value) == message.format(path=path)


def test_a_restore_initialises_afresh_the_variables_outside_the_model_the_checkpoint_lacks(tmp_path, caplog):
    """An optimizer's state or a counter of the user's is not a model variable: a checkpoint
    without it restores the weights, and one log line names what starts afresh. The same session
    restores a checkpoint that holds them all before, and one that lacks them after."""
    path = saved_mock_checkpoint(tmp_path)

    def with_counters(features, labels, mode, params):
        tf.compat.v1.get_variable("counter", initializer=7, trainable=False)
        tf.compat.v1.get_variable("offset", initializer=2.5, trainable=False)
        return model_fn(features, labels, mode, params)

    run = session_of(with_counters, tmp_path / "second")
    with run.built.graph.as_default():
        whole = tf.compat.v1.train.Saver().save(run.session, str(tmp_path / "second" / "model.ckpt"), global_step=1)
        run.restore(whole)
        kernel = next(v for v in tf.compat.v1.global_variables() if v.op.name == "dense/kernel")
        run.session.run(kernel.assign(tf.zeros_like(kernel)))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.restore(path)
    restored = run.session.run(kernel)
    run.close()
    assert zoo_log(caplog) == [("INFO", f"not in {path}, initialised afresh: counter, offset"),
                               ("INFO", f"restored {path}")]
    np.testing.assert_array_equal(restored, tf.train.load_checkpoint(path).get_tensor("dense/kernel"))


def test_a_restore_of_a_model_without_weights_from_a_checkpoint_without_its_variables(tmp_path, caplog):
    """Nothing of the model in the checkpoint and nothing trainable lost: no restore at all, every
    variable initialised afresh and named."""
    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session() as session:
        other = tf.compat.v1.get_variable("other", initializer=1.0)
        session.run(other.initializer)
        path = tf.compat.v1.train.Saver([other]).save(session, str(tmp_path / "other.ckpt"))

    def counting(features, labels, mode, params):
        loss = tf.reduce_mean(features)
        step = tf.compat.v1.assign_add(tf.compat.v1.train.get_global_step(), 1)
        return EstimatorSpec(mode, loss=loss, train_op=tf.group(step))

    run = session_of(counting, tmp_path / "model")
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.restore(path)
    step = run.step()
    run.close()
    assert step == 0
    assert zoo_log(caplog) == [("INFO", f"not in {path}, initialised afresh: global_step"),
                               ("INFO", f"restored {path}")]


def test_a_restore_of_damaged_tensors_is_one_error_naming_the_checkpoint_and_tfs_reason(tmp_path):
    path = saved_mock_checkpoint(tmp_path)
    data = tmp_path / "first" / "model.ckpt-0.data-00000-of-00001"
    damaged = bytearray(data.read_bytes())
    damaged[:8] = bytes(b ^ 0xFF for b in damaged[:8])
    data.write_bytes(bytes(damaged))
    run = session_of(model_fn, tmp_path / "second")
    with pytest.raises(UserError) as refused:
        run.restore(path)
    run.close()
    at = re.escape(path)
    assert re.fullmatch(rf"{at}: corrupt or unreadable checkpoint \(TensorBundle at {at} shard 0 \(\d+ bytes\): "
                        rf"Checksum does not match: stored \d+ vs\. calculated on the restored bytes \d+\)",
                        str(refused.value)), refused.value


def test_an_input_position_of_another_pipeline_restarts_the_data_with_a_warning(tmp_path, caplog):
    run = session_of(model_fn, tmp_path / "first")
    run.session.run(run.built.train_op)
    with run.built.graph.as_default():
        path = run.built.saver.save(run.session, str(tmp_path / "first" / "model.ckpt"), global_step=1)
    run.close()

    def unshuffled(params, mode):
        x = np.arange(EXAMPLES * FEATURES, dtype=np.float32).reshape(EXAMPLES, FEATURES)
        y = (np.arange(EXAMPLES) % CLASSES).astype(np.int64)
        doubled = tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 2, b))
        return doubled.repeat().batch(4, drop_remainder=True)

    run = session_of(model_fn, tmp_path / "second", train_input=unshuffled)
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.restore(path)
    first = run.session.run(run.built.features)
    step = run.step()
    run.close()
    assert step == 1
    np.testing.assert_array_equal(first, 2 * np.arange(4 * FEATURES, dtype=np.float32).reshape(4, FEATURES))
    assert zoo_log(caplog) == [
        ("WARNING", f"{path}: the input position there is for another input pipeline; the data starts from its "
                    "beginning"), ("INFO", f"restored {path}")]


def test_an_input_with_external_state_still_saves_its_position_and_resumes_from_it(tmp_path, caplog):
    """A map through tf.py_function is state TF cannot save: the checkpoint keeps the position all the same."""

    def doubled_in_python(params, mode):
        x = np.arange(EXAMPLES * FEATURES, dtype=np.float32).reshape(EXAMPLES, FEATURES)
        y = (np.arange(EXAMPLES) % CLASSES).astype(np.int64)
        doubled = tf.data.Dataset.from_tensor_slices((x, y)).map(
            lambda a, b: (tf.ensure_shape(tf.py_function(lambda t: t * 2, [a], tf.float32), [FEATURES]), b))
        return doubled.repeat().batch(4, drop_remainder=True)

    run = session_of(model_fn, tmp_path / "first", train_input=doubled_in_python)
    run.session.run(run.built.train_op)
    with run.built.graph.as_default():
        path = run.built.saver.save(run.session, str(tmp_path / "first" / "model.ckpt"), global_step=1)
    run.close()
    run = session_of(model_fn, tmp_path / "second", train_input=doubled_in_python)
    with caplog.at_level(logging.INFO, logger="zoo"):
        run.restore(path)
    second_batch = run.session.run(run.built.features)
    run.close()
    rows = np.arange(4 * FEATURES, 8 * FEATURES, dtype=np.float32).reshape(4, FEATURES)
    np.testing.assert_array_equal(second_batch, 2 * rows)
    assert zoo_log(caplog) == [("INFO", f"restored {path}")]


def test_a_session_without_weights_initialises_all_but_the_weights_and_their_slots(tmp_path):
    """A compile reads shapes only: no memory for the weights or Adam's slots; the global step and
    Adam's beta powers are initialised."""
    from common.params import load_params

    params = load_params(None, {**default_params(), "optimizer": {"optimizer_type": "adam", "learning_rate": 0.1}})
    estimator = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path)), params=params)
    run = GraphSession(estimator.build(input_fn, ModeKeys.TRAIN), estimator.config, weights=False)
    with run.built.graph.as_default():
        names = {v.op.name for v in tf.compat.v1.global_variables()}
        missing = {name.decode() for name in run.session.run(tf.compat.v1.report_uninitialized_variables())}
    step = run.step()
    run.close()
    weights = {"dense/kernel", "dense/bias"}
    slots = {name for name in names if any(name.startswith(w + "/") for w in weights)}
    assert slots and missing == weights | slots and step == 0
    assert names - missing == {"global_step", "beta1_power", "beta2_power"}


def test_a_training_graph_with_local_variables_has_them_initialised(tmp_path):
    """A running mean of the loss (tf.compat.v1.metrics, local variables) in a training model_fn."""
    def with_running_mean(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES, name="dense")(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
        mean, update = tf.compat.v1.metrics.mean(loss)
        tf.compat.v1.add_to_collection("running_mean", mean)
        return EstimatorSpec(mode, loss=loss, train_op=tf.group(build_train_op(loss, params), update))

    run = session_of(with_running_mean, tmp_path)
    losses = [run.session.run([run.built.train_op, run.built.spec.loss])[1] for _ in range(2)]
    mean = run.session.run(run.built.graph.get_collection("running_mean")[0])
    run.close()
    assert mean == pytest.approx(np.mean(losses), rel=1e-6)


def test_a_session_runs_where_and_as_the_strategy_and_run_config_say(tmp_path, monkeypatch):
    """GraphSession hands the graph's strategy and RunConfig.session_config to session_options
    (common/tf/estimator/distribute.py), and opens the session on the target and config it returns."""
    from common.params import load_params
    from common.tf.estimator import distribute

    asked, opened = [], []
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    chosen = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1)
    strategy = object()
    monkeypatch.setattr(distribute, "session_options", lambda *args: asked.append(args) or ("grpc://w0:2222", chosen))
    real_session = tf.compat.v1.Session

    def local_session(target, graph, config):
        opened.append((target, graph, config))
        return real_session(graph=graph)

    monkeypatch.setattr(tf.compat.v1, "Session", local_session)
    estimator = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path), session_config=config),
                                  params=load_params(None, default_params()))
    built = estimator.build(input_fn, ModeKeys.TRAIN)
    built.strategy = strategy
    GraphSession(built, estimator.config).close()
    assert asked == [(strategy, config)] and opened == [("grpc://w0:2222", built.graph, chosen)]


def test_a_training_graph_with_a_lookup_table_has_it_initialised(tmp_path):
    def remapped(features, labels, mode, params):
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant([0, 1, 2], tf.int64), tf.constant([2, 0, 1], tf.int64)), default_value=-1)
        mapped = table.lookup(labels)
        tf.compat.v1.add_to_collection("mapped", mapped)
        return model_fn(features, mapped, mode, params)

    run = session_of(remapped, tmp_path)
    labels, mapped, _ = run.session.run([run.built.labels, run.built.graph.get_collection("mapped")[0],
                                         run.built.train_op])
    run.close()
    np.testing.assert_array_equal(mapped, (labels + 2) % 3)


def test_a_weight_or_slot_is_a_trainable_variable_or_one_named_under_it(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        names = {"w": True, "w/Adam": False, "w/Adam_1": False, "wide": False, "global_step": False, "b": True,
                 "x/w": False}
        variables = {n: tf.compat.v1.get_variable(n, shape=(), trainable=t) for n, t in names.items()}
    assert {n for n, v in variables.items() if is_weight_or_slot(v, graph)} == {"w", "w/Adam", "w/Adam_1", "b"}


def test_run_config_refuses_a_device_it_has_not_and_a_strategy_on_the_emulator():
    with pytest.raises(UserError) as refused:
        RunConfig(device="tpu")
    assert str(refused.value) == "RunConfig.device must be one of cpu, gpu, emulator, got 'tpu'"
    with pytest.raises(UserError) as refused:
        RunConfig(device="emulator", train_distribute=object())
    assert str(refused.value) == ("RunConfig.train_distribute with --device emulator: the emulated device is one "
                                  "system per run; train on it without a strategy")
    assert RunConfig(device="emulator").train_distribute is None
    assert RunConfig(save_summary_steps=1, save_checkpoints_steps=0, keep_checkpoint_max=0).keep_checkpoint_max == 0
    with pytest.raises(UserError) as refused:
        RunConfig(keep_checkpoint_max=-1)
    assert str(refused.value) == ("runconfig.keep_checkpoint_max (RunConfig.keep_checkpoint_max) must be at least 0, "
                                  "got -1")


def test_run_config_from_params_takes_every_field_from_its_key(tmp_path, monkeypatch):
    from common.params import load_params
    from common.tf.estimator import distribute

    params = load_params(None, {**default_params(), "runconfig": {
        "model_dir": str(tmp_path), "seed": 5, "log_steps": 3, "checkpoint_steps": 7, "keep_checkpoint_max": 2},
        "device": {"profile": "wse3", "execution_mode": "weight_streaming", "micro_batch_size": 4}})
    config = RunConfig.from_params(params, device="emulator")
    assert (config.model_dir, config.tf_random_seed, config.save_summary_steps, config.save_checkpoints_steps,
            config.keep_checkpoint_max, config.device, config.device_profile, config.execution_mode,
            config.micro_batch_size, config.train_distribute) == (
        str(tmp_path), 5, 3, 7, 2, "emulator", "wse3", "weight_streaming", 4, None)
    strategy, asked = object(), []
    monkeypatch.setattr(distribute, "strategy_from_params", lambda runconfig, device: asked.append(device) or strategy)
    assert RunConfig.from_params(params).train_distribute is strategy and asked == ["cpu"]


def test_cs_run_config_names_the_vendor_system_fields_it_ignores(caplog):
    from common.tf.estimator.run_config import CSRunConfig

    with caplog.at_level(logging.INFO, logger="zoo"):
        config = CSRunConfig(cs_ip="10.0.0.1:9000", stack_params={"ir_mode": "mlir"}, save_summary_steps=2)
        CSRunConfig(cs_config=None)  # what get_csconfig gives here: taken silently (gptj's run.py passes it)
        CSRunConfig(cs_config=object())
    assert (config.cs_ip, config.save_summary_steps) == ("10.0.0.1:9000", 2)
    assert zoo_log(caplog) == [
        ("WARNING", "CSRunConfig.cs_ip 10.0.0.1:9000 is ignored: it addresses the vendor's system; the run is on cpu"),
        ("WARNING", "CSRunConfig.stack_params is ignored: it configures the vendor's system software"),
        ("WARNING", "CSRunConfig.cs_config is ignored: it configures the vendor's system")]
    with pytest.raises(UserError, match="RunConfig.device must be one of"):
        CSRunConfig(device="tpu")


def test_train_and_evaluate_hands_the_specs_to_the_estimator_and_names_what_it_ignores(caplog):
    from common.tf.estimator.training import EvalSpec, TrainSpec, train_and_evaluate

    class Recorder:
        def train_and_evaluate(self, *args, **kwargs):
            self.call = (args, kwargs)
            return {"loss": 1.5}

    train, evaluate = (lambda params, mode: None), (lambda params, mode: None)
    estimator = Recorder()
    with caplog.at_level(logging.INFO, logger="zoo"):
        metrics = train_and_evaluate(estimator, TrainSpec(train, max_steps=9), EvalSpec(evaluate, steps=3))
    assert metrics == {"loss": 1.5} and zoo_log(caplog) == []
    assert estimator.call == ((train, evaluate), {"max_steps": 9, "eval_steps": 3})
    with caplog.at_level(logging.INFO, logger="zoo"):
        train_and_evaluate(estimator, TrainSpec(train), EvalSpec(evaluate, start_delay_secs=10, throttle_secs=60))
        train_and_evaluate(estimator, TrainSpec(train, hooks=(object(),)), EvalSpec(evaluate))
        train_and_evaluate(estimator, TrainSpec(train), EvalSpec(evaluate, hooks=(object(),)))
        train_and_evaluate(estimator, TrainSpec(train), EvalSpec(evaluate, exporters=[object()]))
    assert estimator.call == ((train, evaluate), {"max_steps": None, "eval_steps": None})
    hooks = ("WARNING", "TrainSpec/EvalSpec hooks and exporters are not run here")
    assert zoo_log(caplog) == [
        ("INFO", "EvalSpec.start_delay_secs is ignored: each checkpoint is evaluated as it is saved"),
        ("INFO", "EvalSpec.throttle_secs is ignored: each checkpoint is evaluated as it is saved"), hooks, hooks, hooks]


def test_the_summary_switches_nest_and_the_outer_one_returns_after_an_error():
    from common.tf.estimator.utils import cs_disable_summaries, cs_enable_summaries, summaries_enabled

    assert summaries_enabled() is True
    with cs_disable_summaries():
        assert summaries_enabled() is False
        with cs_enable_summaries():
            assert summaries_enabled() is True
        assert summaries_enabled() is False
        with pytest.raises(ValueError), cs_enable_summaries():
            raise ValueError
        assert summaries_enabled() is False
    assert summaries_enabled() is True


# --- graph.py's checks of what input_fn and model_fn hand back, on their own


def test_the_batch_size_and_the_warning_of_shapes_not_static_name_every_shape(caplog):
    from common.tf.estimator.graph import _batch_size, where

    def batches(params, mode):
        return None

    static = (tf.TensorSpec([4, 6]), tf.TensorSpec([4]))
    with caplog.at_level(logging.WARNING, logger="zoo"):
        assert _batch_size(static, batches) == (4, True)
        assert _batch_size(({"x": tf.TensorSpec([None, 6])}, tf.TensorSpec([4])), batches) == (None, False)
        assert _batch_size((tf.TensorSpec(None), tf.TensorSpec([8, None])), batches) == (None, False)
        assert _batch_size(tf.TensorSpec([]), batches) == (None, True)  # a scalar: no batch dimension
        assert _batch_size(tf.RaggedTensorSpec([4, None]), batches)[0] is None  # no dense tensor to read it from
    advice = ("this runs on the CPU, but the device needs static shapes: batch with drop_remainder=True "
              "(train_input.drop_last: true)")
    assert zoo_log(caplog) == [
        ("WARNING", f"{where(batches)}: the dataset's shapes are not static ((None, 6), (4,)); {advice}"),
        ("WARNING", f"{where(batches)}: the dataset's shapes are not static (unknown rank, (8, None)); {advice}")]


def test_host_call_is_checked_whole_and_its_fn_takes_a_list_or_a_dict_of_tensors():
    from common.tf.estimator.graph import _metric_ops, where

    def metric_model(features, labels, mode, params):
        return None

    def accuracy(labels, logits):
        return {"accuracy": tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, -1))}

    def listed(labels, logits):
        return [accuracy(labels, logits)["accuracy"]]

    with tf.Graph().as_default():
        loss, labels, logits = tf.constant(0.5), tf.constant([1, 0]), tf.constant([[0.0, 1.0], [0.0, 1.0]])
        for host_call in ((accuracy, [labels, logits]), (accuracy, {"logits": logits, "labels": labels})):
            metrics = _metric_ops(CSEstimatorSpec(ModeKeys.EVAL, loss=loss, host_call=host_call), metric_model)
            assert sorted(metrics) == ["accuracy", "loss"]
        for bad in (("accuracy", [labels, logits]), (accuracy, [labels, logits], None), (accuracy,), accuracy):
            with pytest.raises(UserError) as error:
                _metric_ops(CSEstimatorSpec(ModeKeys.EVAL, loss=loss, host_call=bad), metric_model)
            assert str(error.value) == f"{where(metric_model)}: host_call must be (fn, [tensors]), got {bad!r}"
        with pytest.raises(UserError) as error:
            _metric_ops(CSEstimatorSpec(ModeKeys.EVAL, loss=loss, host_call=(listed, [labels, logits])), metric_model)
        assert str(error.value) == (f"host_call fn {where(listed)} returned list; expected a dict of "
                                    f"{{name: tf.compat.v1.metrics.*(...)}} (value, update_op) pairs")


def test_eval_metric_ops_are_checked_whole_and_the_mean_loss_added_unless_given():
    from common.tf.estimator.graph import _metric_ops, where

    def metric_model(features, labels, mode, params):
        return None

    with tf.Graph().as_default() as graph:
        loss, labels = tf.constant(0.5), tf.constant([1, 0])
        accuracy = tf.compat.v1.metrics.accuracy(labels, labels)
        metrics = _metric_ops(EstimatorSpec(ModeKeys.EVAL, loss=loss, eval_metric_ops={"accuracy": accuracy}),
                              metric_model)
        assert list(metrics) == ["accuracy", "loss"] and metrics["accuracy"] == accuracy
        assert [v.name for v in graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)][-2:] == [
            "mean_loss/total:0", "mean_loss/count:0"]  # the mean of the loss, named so in TensorBoard's graph
        own = tf.compat.v1.metrics.mean(loss * 2)
        metrics = _metric_ops(EstimatorSpec(ModeKeys.EVAL, loss=loss, eval_metric_ops={"loss": own}), metric_model)
        assert list(metrics) == ["loss"] and metrics["loss"] == own  # the model's own loss metric is kept
        assert _metric_ops(EstimatorSpec(ModeKeys.EVAL, loss=loss), metric_model).keys() == {"loss"}
        with pytest.raises(UserError) as error:
            _metric_ops(EstimatorSpec(ModeKeys.EVAL, loss=loss, eval_metric_ops=[accuracy]), metric_model)
        assert str(error.value) == (f"{where(metric_model)}: eval_metric_ops returned list; expected a dict of "
                                    f"{{name: tf.compat.v1.metrics.*(...)}} (value, update_op) pairs")
        for bad in ((*accuracy, accuracy[0]), accuracy[0]):
            with pytest.raises(UserError) as error:
                _metric_ops(EstimatorSpec(ModeKeys.EVAL, loss=loss, eval_metric_ops={"acc": bad}), metric_model)
            assert str(error.value) == (f"{where(metric_model)}: eval_metric_ops: metric 'acc' is not a (value, "
                                        f"update_op) pair such as tf.compat.v1.metrics.accuracy returns")


def test_the_run_precision_is_the_params_or_the_models_own_policy_and_never_two():
    from types import SimpleNamespace

    from common.tf.estimator.graph import run_precision

    fp32, own_bf16 = SimpleNamespace(model_precision=None), SimpleNamespace(model_precision="bfloat16")
    mixed = {"mixed_precision": {"enabled": True, "dtype": "float16"}}
    assert run_precision({}, fp32) == "float32" and run_precision({}, own_bf16) == "bfloat16"
    assert run_precision(mixed, fp32) == "float16"
    assert run_precision({"mixed_precision": {"enabled": False, "dtype": "float16"}}, fp32) == "float32"
    assert run_precision({"mixed_precision": {"enabled": True, "dtype": "bfloat16"}}, own_bf16) == "bfloat16"
    with pytest.raises(UserError) as error:
        run_precision(mixed, own_bf16)
    assert str(error.value) == ("model_fn sets a Keras bfloat16 policy, params ask for mixed_precision.dtype float16: "
                                "give one precision (set mixed_precision.dtype: bfloat16, or remove the model_fn's "
                                "set_global_policy)")


def test_input_fn_gets_the_mode_when_it_takes_one():
    from common.tf.estimator.graph import call_input_fn

    calls = []

    def params_only(params):
        calls.append(("params_only", params))

    def params_mode(params, mode):
        calls.append(("params_mode", params, mode))

    def other_names(p, m=None):
        calls.append(("other_names", p, m))

    def mode_by_name(params, mode=None, *, batch=1):
        calls.append(("mode_by_name", params, mode))

    def keyword_mode(params, *, mode):
        calls.append(("keyword_mode", params, mode))

    def varargs(*args):
        calls.append(("varargs", *args))

    def params_kwargs(params, **kwargs):
        calls.append(("params_kwargs", params, kwargs))

    def vendors(params, input_context=None):  # the vendor's zoo: tf.estimator passes input_context by name
        calls.append(("vendors", params, input_context))

    def estimator_config(params, config=None):
        calls.append(("estimator_config", params, config))

    for fn in (params_only, params_mode, other_names, mode_by_name, keyword_mode, varargs, params_kwargs, vendors,
               estimator_config):
        call_input_fn(fn, {"p": 1}, "train")
    assert calls == [("params_only", {"p": 1}), ("params_mode", {"p": 1}, "train"),
                     ("other_names", {"p": 1}, "train"), ("mode_by_name", {"p": 1}, "train"),
                     ("keyword_mode", {"p": 1}, "train"), ("varargs", {"p": 1}, "train"),
                     ("params_kwargs", {"p": 1}, {}), ("vendors", {"p": 1}, None),
                     ("estimator_config", {"p": 1}, None)]
    assert call_input_fn(max, 3, 5) == 5  # no signature to read (a builtin): both


def test_a_dataset_of_pairs_is_needed_but_in_predict_mode():
    from common.tf.estimator.graph import _dataset_element, where

    def batches(params, mode):
        return None

    pairs = tf.data.Dataset.from_tensor_slices((np.zeros((4, 2), np.float32), np.zeros(4, np.int64)))
    alone = tf.data.Dataset.from_tensor_slices(np.zeros((4, 2), np.float32))
    triples = tf.data.Dataset.from_tensor_slices((np.zeros(4), np.zeros(4), np.zeros(4)))
    assert _dataset_element(pairs, batches, ModeKeys.TRAIN) == pairs.element_spec
    assert _dataset_element(alone, batches, ModeKeys.PREDICT) == alone.element_spec
    for dataset, mode, kind in ((alone, ModeKeys.TRAIN, "TensorSpec"), (triples, ModeKeys.EVAL, "tuple")):
        with pytest.raises(UserError) as error:
            _dataset_element(dataset, batches, mode)
        assert str(error.value) == (f"{where(batches)}: the dataset yields {kind} elements; in {mode} mode it must "
                                    f"yield (features, labels) pairs")
    with pytest.raises(UserError) as error:
        _dataset_element([1, 2], batches, ModeKeys.PREDICT)
    assert str(error.value) == (f"{where(batches)} returned list; an input_fn returns a tf.data.Dataset of "
                                f"(features, labels) batches")


def test_a_spec_is_checked_against_its_mode_whole():
    from common.tf.estimator.graph import _check_spec, where

    def checked(features, labels, mode, params):
        return None

    fn = where(checked)
    with tf.Graph().as_default() as other:
        foreign = tf.constant(1.0)
    with tf.Graph().as_default() as graph:
        loss, op = tf.constant(0.5), tf.no_op()
        vector, whole = tf.constant([0.5, 1.0]), tf.constant(3)
        good = {ModeKeys.TRAIN: EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=op),
                ModeKeys.EVAL: EstimatorSpec(ModeKeys.EVAL, loss=loss),
                ModeKeys.PREDICT: EstimatorSpec(ModeKeys.PREDICT, predictions=vector)}
        for mode, spec in good.items():
            assert _check_spec(spec, mode, checked, graph) is spec
        hooked = CSEstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=op, training_hooks=[], host_call=None)
        assert _check_spec(hooked, ModeKeys.TRAIN, checked, graph) is hooked  # the vendor's empty hook list
        assert _check_spec(EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=loss), ModeKeys.TRAIN, checked,
                           graph) is not None  # a tensor as train_op
        bad = [
            ({"loss": loss}, ModeKeys.TRAIN, f"{fn} returned dict; a model_fn returns an EstimatorSpec or "
                                             f"CSEstimatorSpec (from common.tf.estimator)"),
            (good[ModeKeys.EVAL], ModeKeys.TRAIN, f"{fn} returned a spec for mode 'eval' when called in mode 'train'"),
            (CSEstimatorSpec(ModeKeys.EVAL, loss=loss, eval_metric_ops={}, host_call=(len, [])), ModeKeys.EVAL,
             f"{fn}: the spec has both host_call and eval_metric_ops; give eval metrics through host_call only "
             f"(the device computes them on the host)"),
            (EstimatorSpec(ModeKeys.EVAL), ModeKeys.EVAL, f"{fn}: the eval spec has no loss"),
            (EstimatorSpec(ModeKeys.TRAIN, train_op=op), ModeKeys.TRAIN, f"{fn}: the train spec has no loss"),
            (EstimatorSpec(ModeKeys.EVAL, loss=0.5), ModeKeys.EVAL,
             f"{fn}: loss must be a tensor of the graph model_fn builds, got float"),
            (EstimatorSpec(ModeKeys.EVAL, loss=foreign), ModeKeys.EVAL,
             f"{fn}: loss must be a tensor of the graph model_fn builds, got {type(foreign).__name__}"),
            (EstimatorSpec(ModeKeys.EVAL, loss=vector), ModeKeys.EVAL,
             f"{fn}: loss must be a float scalar, got float32 of shape (2,)"),
            (EstimatorSpec(ModeKeys.TRAIN, loss=whole, train_op=op), ModeKeys.TRAIN,
             f"{fn}: loss must be a float scalar, got int32 of shape ()"),
            (EstimatorSpec(ModeKeys.TRAIN, loss=loss), ModeKeys.TRAIN,
             f"{fn}: the TRAIN spec has no train_op (e.g. common.tf.optim.build_train_op(loss, params) or "
             f"optimizer.minimize(loss, global_step))"),
            (EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op="minimize"), ModeKeys.TRAIN,
             f"{fn}: train_op must be an op of the graph model_fn builds, got str"),
            (EstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=foreign.op), ModeKeys.TRAIN,
             f"{fn}: train_op must be an op of the graph model_fn builds, got Operation"),
            (EstimatorSpec(ModeKeys.PREDICT, loss=loss), ModeKeys.PREDICT,
             f"{fn}: the PREDICT spec has no predictions"),
            (CSEstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=op,
                             training_hooks=[tf.compat.v1.train.StopAtStepHook(last_step=3)]), ModeKeys.TRAIN,
             f"{fn}: the spec's training_hooks hold StopAtStepHook; the runner runs no session hook (it logs, saves "
             f"and stops by itself): leave training_hooks empty"),
        ]
        for spec, mode, message in bad:
            with pytest.raises(UserError) as error:
                _check_spec(spec, mode, checked, graph)
            assert str(error.value) == message
    assert other is not graph


def test_ancestors_follow_data_and_control_inputs_and_single_takes_the_last():
    from common.tf.estimator.graph import _ancestors, _single

    with tf.Graph().as_default() as graph:
        a, b = tf.constant(1.0, name="a"), tf.constant(2.0, name="b")
        gate = tf.no_op(name="gate")
        with tf.control_dependencies([gate]):
            c = tf.add(a, b, name="c")
        d = tf.identity(c, name="d")
        tf.constant(3.0, name="unrelated")
        assert {op.name for op in _ancestors([d])} == {"a", "b", "gate", "c", "d"}
        assert {op.name for op in _ancestors([c.op, a])} == {"a", "b", "gate", "c"}
        twice = tf.add(b, tf.add(a, a, name="doubled"), name="twice")  # a reached twice, b still to visit
        assert {op.name for op in _ancestors([twice])} == {"a", "b", "doubled", "twice"}
        assert _single(graph, "nothing") is None
        graph.add_to_collection("rates", a)
        graph.add_to_collection("rates", b)
        assert _single(graph, "rates") is b


def test_components_are_a_distributed_variables_replicas_or_the_variable_itself():
    from common.tf.estimator.graph import components

    with tf.Graph().as_default():
        plain = tf.compat.v1.get_variable("plain", initializer=1.0)
        assert components(plain) == (plain,)
        with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
            mirrored = tf.Variable(1.0, name="mirrored")
        assert isinstance(mirrored, tf.distribute.DistributedValues)
        assert components(mirrored) == tuple(mirrored._values) and len(components(mirrored)) == 1
        assert components(mirrored)[0] is not mirrored


def test_orphan_state_updates_run_with_the_step_after_its_reads_and_nothing_else_joins():
    """A non-trainable variable assigned by an op nothing depends on (as Keras 3 layers do) is advanced
    with each step, after the step read it; trainable variables' assigns, initialisers (global and local)
    and what the step runs already are left as they are."""
    from common.tf.estimator.graph import _run_state_updates

    with tf.Graph().as_default() as graph:
        weight = tf.Variable(1.0, name="weight")
        state = tf.Variable(0.0, trainable=False, name="state")
        running = tf.Variable(0.0, trainable=False, name="running",
                              collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
        weight.assign(5.0, read_value=False)  # an orphan assign of a trainable variable: not a state update
        train_op = weight.assign_add(state.read_value(), read_value=False)
        advance = state.assign(state.read_value() + 1.0, read_value=False)
        step = _run_state_updates(graph, train_op)
        assert step.name == "train_step" and set(step.control_inputs) == {train_op, advance}
        reads = [c for c in state.handle.consumers() if c.type == "ReadVariableOp"]
        assert set(advance.control_inputs) & set(reads)
        with tf.compat.v1.Session() as session:
            session.run([weight.initializer, state.initializer, running.initializer])
            for _ in range(3):
                session.run(step)
            assert session.run([weight, state]) == [1.0 + 0.0 + 1.0 + 2.0, 3.0]  # each step read the old state
    with tf.Graph().as_default() as graph:
        weight = tf.Variable(1.0, name="weight")
        train_op = weight.assign_add(1.0, read_value=False)
        assert _run_state_updates(graph, train_op) is train_op  # no state update: the train op as it was


def test_a_built_graph_of_each_mode_holds_what_the_runner_fetches():
    from common.params import load_params
    from common.tf.estimator.graph import build_graph

    params = load_params(None, default_params())

    def summarised(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        if mode == ModeKeys.TRAIN:
            tf.compat.v1.summary.scalar("loss_summary", spec.loss)
        return spec

    train = build_graph(summarised, input_fn, ModeKeys.TRAIN, params, seed=3)
    assert train.mode == ModeKeys.TRAIN and train.spec.mode == ModeKeys.TRAIN and train.batch_size == 4
    assert train.static_shapes and train.dynamic_batch_size is None and train.model_precision is None
    assert train.features.shape.as_list() == [4, FEATURES] and train.labels.shape.as_list() == [4]
    assert train.train_op is train.spec.train_op  # no Keras state update in this model
    assert train.learning_rate is not None and train.learning_rate.graph is train.graph and train.loss_scale is None
    assert train.summary is not None and train.metrics == {} and train.predictions == {}
    from common.tf.estimator.utils import cs_disable_summaries
    with cs_disable_summaries():
        assert build_graph(summarised, input_fn, ModeKeys.TRAIN, params, seed=3).summary is None
    assert [v.name for v in train.variables] == [v.name for v in train.graph.get_collection("variables")]
    assert "global_step:0" in [v.name for v in train.variables] and train.global_step in train.variables
    # the saver: every variable and the input position, every checkpoint kept (checkpoints.py prunes), relative
    assert train.saver._var_list == train.variables + [train.iterator_saveable] and train.iterator_saveable
    assert train.saver._max_to_keep is None and train.saver._save_relative_paths is True
    again = build_graph(summarised, input_fn, ModeKeys.TRAIN, params, seed=3)
    other = build_graph(summarised, input_fn, ModeKeys.TRAIN, params, seed=4)

    def initial(built):
        with tf.compat.v1.Session(graph=built.graph) as session:
            session.run([v.initializer for v in built.variables])
            return {v.name: session.run(v) for v in built.variables}

    first, second, third = initial(train), initial(again), initial(other)
    assert first.keys() == second.keys() == third.keys()  # the same names at every build
    assert all(np.array_equal(first[k], second[k]) for k in first)  # and the same initial values for a seed
    assert not np.array_equal(first["dense/kernel:0"], third["dense/kernel:0"])

    evaluate = build_graph(model_fn, input_fn, ModeKeys.EVAL, params, seed=3)
    assert sorted(evaluate.metrics) == ["accuracy", "loss"] and evaluate.metrics_update is not None
    assert evaluate.train_op is None and evaluate.iterator_saveable is None and evaluate.summary is None
    assert evaluate.saver._var_list == evaluate.variables  # no input position outside training

    def predict_input(params, mode):
        return input_fn(params, ModeKeys.EVAL).unbatch().batch(3)  # (None, 6) batches, labels too

    def bare(features, labels, mode, params):
        assert labels is None  # the dataset's labels are not handed to a PREDICT model_fn
        return EstimatorSpec(mode, predictions=tf.argmax(keras.layers.Dense(CLASSES)(features), -1))

    predict = build_graph(bare, predict_input, ModeKeys.PREDICT, params, seed=3)
    assert predict.labels is None and list(predict.predictions) == ["predictions"]
    assert predict.batch_size is None and not predict.static_shapes and predict.dynamic_batch_size is not None
    with tf.compat.v1.Session(graph=predict.graph) as session:
        session.run(predict.iterator.initializer)
        assert session.run([predict.dynamic_batch_size, predict.cardinality]) == [3, 6]
    dicts = build_graph(model_fn, input_fn, ModeKeys.PREDICT, params, seed=3)
    assert list(dicts.predictions) == ["classes"] and dicts.predictions["classes"] is dicts.spec.predictions["classes"]


def test_a_built_graph_takes_the_mixed_policy_unless_told_not_and_features_alone_in_predict():
    from common.params import load_params
    from common.tf.estimator.graph import build_graph

    params = load_params(None, {**default_params(), "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})

    def logits_of(features, labels, mode, params):
        logits = keras.layers.Dense(CLASSES, name="dense")(features["a"] + features["b"])
        tf.compat.v1.add_to_collection("logits", logits)
        return EstimatorSpec(mode, predictions=logits)

    def two_features(params, mode):  # a dict of two features, no labels
        x = np.zeros((8, FEATURES), np.float32)
        return tf.data.Dataset.from_tensor_slices({"a": x, "b": x}).batch(4, drop_remainder=True)

    mixed = build_graph(logits_of, two_features, ModeKeys.PREDICT, params, seed=1)
    assert sorted(mixed.features) == ["a", "b"] and mixed.labels is None
    assert mixed.graph.get_collection("logits")[0].dtype == tf.bfloat16  # the CPU run: Keras' mixed policy
    fp32 = build_graph(logits_of, two_features, ModeKeys.PREDICT, params, seed=1, mixed_policy=False)
    assert fp32.graph.get_collection("logits")[0].dtype == tf.float32  # the device's graph: fp32 layers
    assert keras.config.dtype_policy().name == "float32"  # the policy put back

    def own_policy(features, labels, mode, params):
        keras.config.set_dtype_policy("mixed_bfloat16")  # as the vendor's models set it themselves
        return logits_of(features, labels, mode, params)

    assert build_graph(own_policy, two_features, ModeKeys.PREDICT, {}, seed=1).model_precision == "bfloat16"
    assert fp32.model_precision is None and keras.config.dtype_policy().name == "float32"


def test_a_built_eval_graph_names_the_model_fn_whose_metrics_are_wrong():
    from common.params import load_params
    from common.tf.estimator.graph import build_graph, where

    def listed_metrics(features, labels, mode, params):
        loss = tf.reduce_mean(keras.layers.Dense(1)(features))
        return EstimatorSpec(mode, loss=loss, eval_metric_ops=[tf.compat.v1.metrics.mean(loss)])

    with pytest.raises(UserError) as error:
        build_graph(listed_metrics, input_fn, ModeKeys.EVAL, load_params(None, default_params()), seed=1)
    assert str(error.value) == (f"{where(listed_metrics)}: eval_metric_ops returned list; expected a dict of "
                                f"{{name: tf.compat.v1.metrics.*(...)}} (value, update_op) pairs")
