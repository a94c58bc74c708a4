"""CerebrasEstimator's evaluate, evaluate_all, train_and_evaluate, predict and train, against
numpy: the metrics and predictions of a checkpoint are computed again from its weights."""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from common.errors import UserError
from common.params import load_params
from common.summaries import read_scalars
from common.tf.estimator import CerebrasEstimator, EstimatorSpec, ModeKeys, RunConfig
from common.tf.estimator.graph import where
from tests.tf.test_tf_estimator import CLASSES, EXAMPLES, FEATURES, default_params, input_fn, model_fn, zoo_log


def estimator(model_dir, model=model_fn, **config):
    config = {"save_checkpoints_steps": 2, "save_summary_steps": 2, "keep_checkpoint_max": 0, **config}
    return CerebrasEstimator(model, config=RunConfig(model_dir=str(model_dir), **config),
                             params=load_params(None, default_params()))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A model_dir holding the checkpoints of steps 2 and 4 of model_fn."""
    model_dir = tmp_path_factory.mktemp("trained")
    estimator(model_dir).train(input_fn, max_steps=4)
    return model_dir


def examples():
    """input_fn's examples, in its EVAL order."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(EXAMPLES, FEATURES)).astype(np.float32)
    return x, np.arange(EXAMPLES) % CLASSES


def logits_of(checkpoint, x):
    reader = tf.train.load_checkpoint(checkpoint)
    return x.astype(np.float64) @ reader.get_tensor("dense/kernel") + reader.get_tensor("dense/bias")


def metrics_of(checkpoint, n=EXAMPLES):
    """accuracy and the mean cross entropy of the first ``n`` examples (batches of 4, all full),
    the dataset repeated where ``n`` is more than it holds."""
    x, y = examples()
    rows = np.arange(n) % EXAMPLES
    logits = logits_of(checkpoint, x[rows])
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return {"accuracy": float(np.mean(logits.argmax(-1) == y[rows])),
            "loss": float(-log_p[np.arange(n), y[rows]].mean())}


def assert_metrics(got, want, step):
    assert sorted(got) == ["accuracy", "global_step", "loss"] and got["global_step"] == step
    assert got["accuracy"] == pytest.approx(want["accuracy"], rel=1e-6)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)


def test_evaluate_gives_the_checkpoints_metrics_logs_them_and_writes_them_for_tensorboard(trained, tmp_path, caplog):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    ready = []
    with caplog.at_level(logging.INFO, logger="zoo"):
        got = estimator(model_dir).evaluate(input_fn, checkpoint_path=str(trained / "model.ckpt-4"),
                                            on_ready=lambda: ready.append(sorted(os.listdir(model_dir))))
    want = metrics_of(str(trained / "model.ckpt-4"))
    assert_metrics(got, want, 4)
    assert ready == [[]]  # before anything is written
    assert zoo_log(caplog)[-1] == (
        "INFO", f"| Eval Device=cpu Step=4 accuracy={got['accuracy']:.5f} loss={got['loss']:.5f}")
    scalars = read_scalars(str(model_dir / "eval"))
    assert scalars["accuracy"] == [(4, pytest.approx(got["accuracy"]))] and scalars["loss"] == [
        (4, pytest.approx(got["loss"]))]
    two = estimator(model_dir).evaluate(input_fn, steps=2, checkpoint_path=str(trained), name="half")
    assert_metrics(two, metrics_of(str(trained / "model.ckpt-4"), n=8), 4)
    assert read_scalars(str(model_dir / "eval_half"))["loss"] == [(4, pytest.approx(two["loss"]))]


def test_evaluate_all_evaluates_every_checkpoint_oldest_first_each_afresh(trained, tmp_path):
    ready = []
    results = estimator(trained).evaluate_all(input_fn, on_ready=lambda: ready.append(1))
    assert len(results) == 2 and ready == [1]
    for got, step in zip(results, (2, 4)):
        assert_metrics(got, metrics_of(str(trained / f"model.ckpt-{step}")), step)
    assert [step for step, _ in read_scalars(str(trained / "eval"))["loss"]][-2:] == [2, 4]
    three = estimator(trained).evaluate_all(input_fn, steps=3)
    assert [r["loss"] for r in three] == pytest.approx(
        [metrics_of(str(trained / f"model.ckpt-{step}"), n=12)["loss"] for step in (2, 4)], rel=1e-5)


def test_nothing_to_evaluate_or_predict_with_is_one_line_and_writes_nothing(tmp_path):
    model_dir = tmp_path / "empty"
    est = estimator(model_dir)
    for call, what, hint in ((lambda: est.evaluate(input_fn), "evaluate", ": train first, or pass --checkpoint_path"),
                             (lambda: est.evaluate_all(input_fn), "evaluate", ": train first"),
                             (lambda: list(est.predict(input_fn)), "predict with",
                              ": train first, or pass --checkpoint_path")):
        with pytest.raises(UserError) as error:
            call()
        assert str(error.value) == f"model_dir {model_dir} has no checkpoint to {what}{hint}"
    assert not model_dir.exists()


def test_an_eval_dataset_without_a_batch_or_without_an_end(trained, tmp_path):
    def empty(params, mode):
        return input_fn(params, mode).take(0)

    with pytest.raises(UserError) as error:
        estimator(trained).evaluate(empty)
    assert str(error.value) == ("the eval dataset yielded no batch (fewer examples than eval_input.batch_size with "
                                "drop_last: true?)")

    def forever(params, mode):  # it says so (and ends after 4 batches all the same: a loop not stopped fails fast)
        return input_fn(params, mode).apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))

    with pytest.raises(UserError) as error:
        estimator(tmp_path).evaluate(forever, checkpoint_path=str(trained))
    assert str(error.value) == ("the eval dataset repeats forever: do not repeat it in EVAL mode, or set "
                                "runconfig.eval_steps (--eval_steps)")
    assert not (tmp_path / "eval").exists()

    def twenty_times(params, mode):  # steps stop it, not its end (which a loop not counting its batches reaches)
        return input_fn(params, mode).repeat(20)

    assert_metrics(estimator(tmp_path).evaluate(twenty_times, steps=6, checkpoint_path=str(trained)),
                   metrics_of(str(trained / "model.ckpt-4"), n=24), 4)
    assert_metrics(estimator(tmp_path).evaluate(lambda params, mode: input_fn(params, mode).repeat(), steps=5,
                                                checkpoint_path=str(trained)),
                   metrics_of(str(trained / "model.ckpt-4"), n=20), 4)  # the first 4 examples count twice


def test_predict_yields_each_example_or_each_batch_of_the_checkpoints_predictions(trained):
    x, _ = examples()
    want = logits_of(str(trained / "model.ckpt-4"), x).argmax(-1)
    single = list(estimator(trained).predict(input_fn))
    assert [sorted(p) for p in single] == [["classes"]] * EXAMPLES
    assert [int(p["classes"]) for p in single] == want.tolist()
    batches = list(estimator(trained).predict(input_fn, checkpoint_path=str(trained / "model.ckpt-2"),
                                              yield_single_examples=False))
    want_2 = logits_of(str(trained / "model.ckpt-2"), x).argmax(-1)
    assert [b["classes"].tolist() for b in batches] == [want_2[i:i + 4].tolist() for i in range(0, EXAMPLES, 4)]


def with_logits(features, labels, mode, params):
    """model_fn, predicting its logits too."""
    if mode != ModeKeys.PREDICT:
        return model_fn(features, labels, mode, params)
    logits = keras.layers.Dense(CLASSES, name="dense")(features)
    return EstimatorSpec(mode, predictions={"classes": tf.argmax(logits, -1), "logits": logits})


def test_predict_restores_the_checkpoint_asked_for_and_calls_on_ready_before_the_first_prediction(trained, tmp_path):
    x, _ = examples()
    ready = []
    predictions = estimator(trained, with_logits).predict(
        input_fn, checkpoint_path=str(trained / "model.ckpt-2"), yield_single_examples=False,
        on_ready=lambda: ready.append(1))
    assert ready == []  # a generator: nothing happens before the first prediction is asked for
    logits = np.concatenate([batch["logits"] for batch in predictions])
    assert ready == [1]
    np.testing.assert_allclose(logits, logits_of(str(trained / "model.ckpt-2"), x), rtol=1e-5, atol=1e-6)
    assert not np.allclose(logits, logits_of(str(trained / "model.ckpt-4"), x), rtol=1e-3)


def test_predict_eval_and_train_compute_in_the_mixed_policy_on_the_cpu_and_in_fp32_on_the_emulator(trained, tmp_path):
    params = load_params(None, {**default_params(), "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    for device, dtype, policy in (("cpu", "bfloat16", True), ("emulator", "float32", False)):
        est = CerebrasEstimator(with_logits, config=RunConfig(model_dir=str(tmp_path / device), device=device),
                                params=params)
        opened, open_session = [], est.open_session
        est.open_session = lambda *args, **kwargs: opened.append(kwargs) or open_session(*args, **kwargs)
        first = next(est.predict(input_fn, checkpoint_path=str(trained)))
        assert first["logits"].dtype.name == dtype, device
        est.evaluate(input_fn, steps=1, checkpoint_path=str(trained))
        est.train(input_fn, steps=1)
        # the device's graph is fp32 (the emulator rounds itself); the CPU's takes the Keras mixed policy
        assert opened == [{"mixed_policy": policy}] * 3


def test_train_takes_steps_or_max_steps_and_says_where_it_starts(trained, tmp_path, caplog):
    model_dir = tmp_path / "model"
    est = estimator(model_dir)
    for steps, max_steps in ((None, None), (2, 4)):
        with pytest.raises(UserError) as error:
            est.train(input_fn, steps=steps, max_steps=max_steps)
        assert str(error.value) == "train: give exactly one of steps and max_steps"
    assert not model_dir.exists()
    with caplog.at_level(logging.INFO, logger="zoo"):
        est.train(input_fn, steps=3)
        assert zoo_log(caplog)[0] == ("INFO", f"training {where(model_fn)} (float32 compute) from step 0 to 3")
        caplog.clear()
        est.train(input_fn, steps=3)  # on from the checkpoint of step 3
        assert zoo_log(caplog)[:2] == [
            ("INFO", f"restored {model_dir}/model.ckpt-3"),
            ("INFO", f"training {where(model_fn)} (float32 compute) from step 3 to 6 (from {model_dir}/model.ckpt-3)")]
        caplog.clear()
        ready = []
        est.train(input_fn, max_steps=6, on_ready=lambda: ready.append(1))
    assert ready == [1]
    assert zoo_log(caplog) == [
        ("INFO", f"restored {model_dir}/model.ckpt-6"),
        ("INFO", "| Train Device=cpu: the global step 6 has reached max_steps 6; nothing to train")]
    assert sorted(n for n in os.listdir(model_dir) if n.endswith(".index")) == [
        f"model.ckpt-{s}.index" for s in (2, 3, 4, 6)]


def test_train_and_evaluate_evaluates_each_checkpoint_and_where_nothing_is_trained_the_latest(trained, tmp_path):
    model_dir = tmp_path / "model"
    last = estimator(model_dir).train_and_evaluate(input_fn, input_fn, max_steps=4, eval_steps=2)
    assert_metrics(last, metrics_of(str(model_dir / "model.ckpt-4"), n=8), 4)
    assert read_scalars(str(model_dir / "eval"))["loss"] == [
        (step, pytest.approx(metrics_of(str(model_dir / f"model.ckpt-{step}"), n=8)["loss"], rel=1e-5))
        for step in (2, 4)]
    again = estimator(model_dir).train_and_evaluate(input_fn, input_fn, max_steps=4)
    assert_metrics(again, metrics_of(str(model_dir / "model.ckpt-4")), 4)
    assert estimator(tmp_path / "fresh").train_and_evaluate(input_fn, input_fn, max_steps=0) is None
    more = estimator(model_dir).train_and_evaluate(input_fn, input_fn, steps=2)
    assert_metrics(more, metrics_of(str(model_dir / "model.ckpt-6")), 6)


def test_a_damaged_eval_record_is_one_line_naming_the_batch(trained, tmp_path):
    path = tmp_path / "eval.tfrecord"
    x, y = examples()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for features, label in zip(x, y):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=features)),
                "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))})).SerializeToString())
    data = bytearray(path.read_bytes())
    record = len(data) // EXAMPLES  # every record has the same length
    data[6 * record + 12 + 5] ^= 0x10  # a bit of the 7th record's payload: its CRC no longer matches
    path.write_bytes(bytes(data))
    spec = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

    def records(params, mode):
        parsed = tf.data.TFRecordDataset(str(path)).map(lambda r: tf.io.parse_single_example(r, spec))
        return parsed.map(lambda e: (e["x"], e["y"])).batch(4, drop_remainder=True)

    with pytest.raises(UserError) as error:
        estimator(trained).evaluate(records)
    at = 6 * record + 12  # TF names the offset of the record's data
    assert str(error.value) == (f"the eval data holds a damaged record in eval batch 2 (corrupted record at {at}): "
                                f"one of its input files is corrupt or was cut short; write it again")


def test_the_estimator_takes_its_model_dir_params_and_backend_as_given(tmp_path, monkeypatch):
    from common.tf.estimator import cs_estimator
    from common.tf.estimator.cs_estimator import SessionSteps

    est = CerebrasEstimator(model_fn, model_dir="given", config=RunConfig(model_dir="configured"),
                            warm_start_from="a/checkpoint")
    assert (est.model_dir, est.warm_start_from, est.config.model_dir) == ("given", "a/checkpoint", "configured")
    assert CerebrasEstimator(model_fn, config=RunConfig(model_dir="configured")).model_dir == "configured"
    assert CerebrasEstimator(model_fn).config == RunConfig() and CerebrasEstimator(model_fn).model_dir == "model_dir"
    vendor = {"model": {"dropout": 0.5}, "optimizer": {"learning_rate": 0.3}}  # a vendor run.py's own yaml.safe_load
    assert CerebrasEstimator(model_fn, params=vendor).params is vendor
    assert vendor["model"] == {"dropout": 0.5} and vendor["optimizer"]["learning_rate"] == 0.3
    assert vendor["optimizer"]["optimizer_type"] and "enabled" in vendor["mixed_precision"] and "device" in vendor
    loaded = load_params(None, default_params())
    before = dict(loaded)
    assert CerebrasEstimator(model_fn, params=loaded).params is loaded and dict(loaded) == before
    assert sorted(CerebrasEstimator(model_fn).params) == ["device", "mixed_precision", "optimizer"]  # from {}
    backend = CerebrasEstimator(model_fn, params=vendor).step_backend()
    assert type(backend) is SessionSteps and backend.model_fn is model_fn and backend.params is vendor

    calls = []
    monkeypatch.setattr(cs_estimator, "build_graph", lambda *args: calls.append(args) or "built")
    est = CerebrasEstimator(model_fn, config=RunConfig(tf_random_seed=7), params=vendor)
    assert est.build(input_fn, "eval") == "built" and est.build(input_fn, "train", mixed_policy=False) == "built"
    assert calls == [(model_fn, input_fn, "eval", vendor, 7, True), (model_fn, input_fn, "train", vendor, 7, False)]
    from common.tf import device_run
    monkeypatch.setattr(device_run, "compile", lambda *args: calls.append(args) or "compiled")
    assert est.compile(input_fn) == "compiled" and est.compile(input_fn, True, "eval") == "compiled"
    assert calls[2:] == [(est, input_fn, False, "train"), (est, input_fn, True, "eval")]


def test_a_session_opened_without_weights_leaves_them_and_their_slots_uninitialised(tmp_path):
    run = estimator(tmp_path).open_session(input_fn, "train", False, weights=False)
    with run.built.graph.as_default():
        missing = run.session.run(tf.compat.v1.report_uninitialized_variables())
    assert sorted(name.decode() for name in missing) == ["dense/bias", "dense/kernel"]
    run.close()
    run = estimator(tmp_path).open_session(input_fn, "train", False)
    with run.built.graph.as_default():
        assert run.session.run(tf.compat.v1.report_uninitialized_variables()).size == 0
    run.close()


def test_a_session_takes_the_mixed_policy_of_the_params_only_when_asked(tmp_path):
    params = load_params(None, {**default_params(), "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    est = CerebrasEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path)), params=params)
    for mixed_policy, dtype in ((True, tf.bfloat16), (False, tf.float32)):
        run = est.open_session(input_fn, ModeKeys.TRAIN, mixed_policy)
        assert run.built.graph.get_collection("dropped")[0].dtype == dtype  # the Keras layer's compute dtype
        run.close()


def test_train_and_evaluate_on_the_emulator_is_the_validators_refusal_before_anything_is_written(tmp_path):
    from device.errors import DeviceCompileError

    est = estimator(tmp_path / "model", device="emulator")
    with pytest.raises(DeviceCompileError) as error:
        est.train_and_evaluate(input_fn, input_fn, max_steps=2)
    assert str(error.value) == ("validation failed: 1 error(s), 0 warning(s) in 4 nodes (mode train_and_eval, profile "
                                "wse2)\n<graph>: mode train_and_eval is not allowed on the device (one static graph "
                                "per run): run --mode train, then --mode eval")
    assert not (tmp_path / "model").exists()
    asked = []

    def compile_asked(*args, **kwargs):
        asked.append((args, kwargs))
        raise UserError("refused")

    est.compile = compile_asked
    with pytest.raises(UserError, match="refused"):
        est.train_and_evaluate(input_fn, input_fn, max_steps=2)
    assert asked == [((input_fn,), {"validate_only": True, "mode": "train_and_eval"})]
    cpu = estimator(tmp_path / "cpu")
    cpu.compile = compile_asked
    cpu.train_and_evaluate(input_fn, input_fn, max_steps=2)
    assert len(asked) == 1  # the CPU compiles nothing
