"""common/tf/estimator/distribute.py's pieces in this process, on two logical CPUs: the
data-parallel TRAIN graph (each replica's slice, the loss and the step of one device with
the global batch, the checkpoint's one-device names), the strategy choices and refusals.

The logical CPUs can be set up only before TensorFlow's runtime starts, so this module does
it on import when ZOO_TEST_LOGICAL_CPUS=2 (tests/mutation.py sets it, which needs the tests
in its own process to map them to the code they run); elsewhere, test_tf_distributed.py runs
this module in a process of its own.
"""

import copy
import json
import logging
import os
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf

if os.environ.get("ZOO_TEST_LOGICAL_CPUS") == "2":
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)
else:
    pytest.skip("needs ZOO_TEST_LOGICAL_CPUS=2 before TensorFlow starts: test_tf_distributed.py runs it so",
                allow_module_level=True)

from common.errors import UserError  # noqa: E402
from common.params import load_params  # noqa: E402
from common.tf.estimator import CerebrasEstimator, EstimatorSpec, ModeKeys, RunConfig, distribute  # noqa: E402
from common.tf.estimator.graph import build_graph, where  # noqa: E402
from common.tf.estimator.session import GraphSession  # noqa: E402
from common.tf.estimator.utils import cs_disable_summaries  # noqa: E402
from common.tf.optim import build_train_op  # noqa: E402
from tests.tf.test_tf_estimator import CLASSES, EXAMPLES, FEATURES, default_params, model_fn, zoo_log  # noqa: E402

CPUS = "/job:localhost/replica:0/task:0/device:CPU:0, /job:localhost/replica:0/task:0/device:CPU:1"


@pytest.fixture(scope="module")
def strategy():
    return distribute.mirrored_strategy("cpu", 2)


def ordered(batch):
    """The examples in order, repeated, in batches of ``batch``."""
    def input_fn(params, mode):
        x = np.arange(EXAMPLES * FEATURES, dtype=np.float32).reshape(EXAMPLES, FEATURES) / 50
        y = (np.arange(EXAMPLES) % CLASSES).astype(np.int64)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(batch, drop_remainder=True)
    return input_fn


def steps(built, count):
    """``count`` training steps of ``built``: (the losses, each replica's features of the first step, the weights)."""
    run = GraphSession(built, RunConfig())
    seen = built.graph.get_collection("dropped")  # model_fn's features after dropout 0: one per replica
    losses, first = [], None
    for _ in range(count):
        _, loss, features = run.session.run([built.train_op, built.spec.loss, seen])
        losses.append(float(loss))
        first = features if first is None else first
    weights = {v.op.name: run.session.run(v) for v in built.variables if "dense" in v.op.name}
    run.close()
    return losses, first, weights


def test_two_replicas_of_batch_b_build_the_step_of_one_device_with_batch_2b(strategy, caplog):
    params = load_params(None, default_params())
    with caplog.at_level(logging.INFO, logger="zoo"):
        two = distribute.build_train_graph(model_fn, ordered(4), params, 3, True, strategy)
    assert zoo_log(caplog) == [("INFO", f"training data parallel on 2 replicas ({CPUS}): 4 examples per replica, "
                                        f"8 per step")]
    assert two.batch_size == 8 and two.strategy is strategy and two.static_shapes and two.mode == ModeKeys.TRAIN
    assert two.features is None and two.labels is None and two.learning_rate is not None and two.loss_scale is None
    one = build_graph(model_fn, ordered(8), ModeKeys.TRAIN, params, seed=3)
    # the variables once each, under their one-device names; the saver keeps them and the input position
    assert [v.op.name for v in two.variables] == [v.op.name for v in one.variables]
    assert two.saver._var_list == two.variables + [two.iterator_saveable]
    assert two.saver._max_to_keep is None and two.saver._save_relative_paths is True
    with tf.compat.v1.Session(graph=two.graph) as session:
        session.run(two.iterator.initializer)
        assert session.run(two.cardinality) == tf.data.INFINITE_CARDINALITY
    assert two.spec.train_op.name == "replicated_train_op" and two.train_op is two.spec.train_op
    assert two.global_step is tf.compat.v1.train.get_global_step(two.graph)
    two_losses, slices, two_weights = steps(two, 3)
    one_losses, _, one_weights = steps(one, 3)
    x = np.arange(EXAMPLES * FEATURES, dtype=np.float32).reshape(EXAMPLES, FEATURES) / 50
    np.testing.assert_array_equal(slices[0], x[0:4])  # replica k: rows [4k, 4k + 4) of the global batch
    np.testing.assert_array_equal(slices[1], x[4:8])
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-6)
    assert two_losses[0] != two_losses[1]
    for name in one_weights:
        np.testing.assert_allclose(two_weights[name], one_weights[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_the_summaries_are_the_first_replicas_and_none_when_disabled(strategy):
    params = load_params(None, default_params())

    def summarised(features, labels, mode, params):
        spec = model_fn(features, labels, mode, params)
        tf.compat.v1.summary.scalar("replica_loss", spec.loss)
        return spec

    built = distribute.build_train_graph(summarised, ordered(4), params, 3, True, strategy)
    run = GraphSession(built, RunConfig())
    serialized = run.session.run(built.summary)
    run.close()
    # replica 1's is skipped (TF records the summaries of the first replica only)
    assert [v.tag for v in tf.compat.v1.Summary.FromString(serialized).value] == ["replica_loss"]
    with cs_disable_summaries():
        assert distribute.build_train_graph(summarised, ordered(4), params, 3, True, strategy).summary is None
    assert distribute.build_train_graph(model_fn, ordered(4), params, 3, True, strategy).summary is None


def logits_dtype(features, labels, mode, params):
    """A Keras layer whose logits (collection "logits", one per replica) show the policy it ran under."""
    logits = keras.layers.Dense(CLASSES, name="dense")(features)
    tf.compat.v1.add_to_collection("logits", logits)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.cast(logits, tf.float32)))
    return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params) if mode == ModeKeys.TRAIN else None)


def bfloat16_params():
    return load_params(None, {**default_params(), "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})


def test_the_replicas_take_the_mixed_policy_unless_told_not(strategy):
    params = bfloat16_params()
    mixed = distribute.build_train_graph(logits_dtype, ordered(4), params, 3, True, strategy)
    assert [t.dtype for t in mixed.graph.get_collection("logits")] == [tf.bfloat16] * 2
    fp32 = distribute.build_train_graph(logits_dtype, ordered(4), params, 3, False, strategy)
    assert [t.dtype for t in fp32.graph.get_collection("logits")] == [tf.float32] * 2
    assert fp32.model_precision is None and keras.config.dtype_policy().name == "float32"


def test_the_estimator_builds_its_train_graph_on_the_replicas_and_any_other_on_one_device(strategy):
    asked = []

    def recorded(params, mode):
        asked.append((params["mixed_precision"]["dtype"], mode))
        return ordered(4)(params, mode)

    estimator = CerebrasEstimator(logits_dtype, config=RunConfig(train_distribute=strategy, tf_random_seed=5),
                                  params=bfloat16_params())
    train = estimator.build(recorded, ModeKeys.TRAIN)
    assert train.strategy is strategy and train.graph.seed == 5 and train.batch_size == 8
    assert [t.dtype for t in train.graph.get_collection("logits")] == [tf.bfloat16] * 2  # the policy on each replica
    fp32 = estimator.build(recorded, ModeKeys.TRAIN, mixed_policy=False)
    assert [t.dtype for t in fp32.graph.get_collection("logits")] == [tf.float32] * 2
    evaluation = estimator.build(recorded, ModeKeys.EVAL)
    assert evaluation.strategy is None and evaluation.graph.seed == 5 and evaluation.batch_size == 4
    assert [t.dtype for t in evaluation.graph.get_collection("logits")] == [tf.bfloat16]
    assert asked[0] == ("bfloat16", ModeKeys.TRAIN) and asked[-1] == ("bfloat16", ModeKeys.EVAL)


def test_batches_of_no_static_size_are_refused(strategy):
    def uneven(params, mode):
        return ordered(4)(params, mode).unbatch().take(6).batch(4)

    with pytest.raises(UserError) as error:
        distribute.build_train_graph(model_fn, uneven, load_params(None, default_params()), 3, True, strategy)
    assert str(error.value) == (f"{where(uneven)}: runconfig.train_distribute needs batches of one static size (the "
                                f"replicas split each global batch evenly): batch with drop_remainder=True")


def test_global_batches_are_the_replicas_batches_in_turn(strategy):
    dataset = tf.data.Dataset.range(10).batch(2, drop_remainder=True)
    assert [b.tolist() for b in distribute.global_batches(dataset, 2, strategy).as_numpy_iterator()] == [
        [0, 1, 2, 3], [4, 5, 6, 7]]  # the incomplete last one dropped
    assert [b.tolist() for b in distribute.global_batches(dataset, 2, None).as_numpy_iterator()] == [
        [0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert distribute.replicas(strategy) == 2 and distribute.replicas(None) == 1


def test_the_strategy_of_the_params_and_its_refusals(strategy, monkeypatch):
    assert distribute.strategy_from_params({"train_distribute": None, "num_devices": None}, "cpu") is None
    mirrored = distribute.strategy_from_params({"train_distribute": "mirrored", "num_devices": 2}, "cpu")
    assert mirrored.num_replicas_in_sync == 2 and ", ".join(mirrored.extended.worker_devices) == CPUS
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for runconfig, device, message in (
            ({"train_distribute": None, "num_devices": 2}, "cpu",
             "runconfig.num_devices=2 needs runconfig.train_distribute: mirrored (the devices to train on in "
             "parallel)"),
            ({"train_distribute": "mirrored", "num_devices": 2}, "emulator",
             "runconfig.train_distribute=mirrored with --device emulator: the emulated device is one system per "
             "run; train on it without a strategy"),
            ({"train_distribute": "multi_worker_mirrored", "num_devices": 2}, "cpu",
             "runconfig.num_devices=2 is for train_distribute: mirrored; a worker of multi_worker_mirrored trains "
             "on every GPU it has (--device gpu) or on its CPU"),
            ({"train_distribute": "multi_worker_mirrored", "num_devices": None}, "cpu",
             "runconfig.train_distribute=multi_worker_mirrored needs TF_CONFIG, the cluster and this process's "
             "place in it, e.g. TF_CONFIG='{\"cluster\": {\"worker\": [\"host0:2222\", \"host1:2222\"]}, "
             "\"task\": {\"type\": \"worker\", \"index\": 0}}'"),
            ({"train_distribute": "mirrored", "num_devices": None}, "cpu",
             "runconfig.train_distribute=mirrored on the CPU needs runconfig.num_devices (how many logical CPUs to "
             "mirror over, sharing the machine's cores)"),
            ({"train_distribute": "mirrored", "num_devices": None}, "gpu",
             "runconfig.train_distribute=mirrored with --device gpu: TensorFlow sees no GPU on this machine; use "
             "--device cpu"),
            ({"train_distribute": "mirrored", "num_devices": 3}, "cpu",
             "runconfig.num_devices=3: this process started TensorFlow with 2 logical CPU(s), and they cannot "
             "change once it has started; run in a new process")):
        with pytest.raises(UserError) as error:
            distribute.strategy_from_params(runconfig, device)
        assert str(error.value) == message
    one = distribute.mirrored_strategy("cpu", 1)  # fewer than the process has: the first ones
    assert one.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)


def test_the_gpus_mirrored_over_are_the_first_num_devices_or_all(monkeypatch):
    listed = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind: ["g0", "g1"] if kind == "GPU" else listed(kind))
    monkeypatch.setattr(tf.compat.v1.distribute, "MirroredStrategy", lambda devices: devices)
    assert distribute.mirrored_strategy("gpu", None) == ["/gpu:0", "/gpu:1"]
    assert distribute.mirrored_strategy("gpu", 1) == ["/gpu:0"]
    assert distribute.mirrored_strategy("gpu", 2) == ["/gpu:0", "/gpu:1"]
    with pytest.raises(UserError) as error:
        distribute.mirrored_strategy("gpu", 3)
    assert str(error.value) == "runconfig.num_devices=3: TensorFlow sees 2 GPU(s) on this machine"


def test_once_tensorflow_has_started_up_to_the_logical_cpus_it_has_will_do(strategy):
    assert float(tf.constant(1.0) + 1) == 2.0  # the runtime has started
    distribute._logical_cpus(2)
    distribute._logical_cpus(1)
    with pytest.raises(UserError) as error:
        distribute._logical_cpus(3)
    assert str(error.value) == ("runconfig.num_devices=3: this process started TensorFlow with 2 logical CPU(s), and "
                                "they cannot change once it has started; run in a new process")


@pytest.mark.parametrize("config", [
    "not json", "[]", '{"cluster": {"worker": ["h:1"]}}', '{"cluster": {"worker": "h:1"}, "task": '
    '{"type": "worker", "index": 0}}', '{"cluster": {"worker": ["h:1"]}, "task": {"type": "chief", "index": 0}}',
    '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": "0"}}',
    '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 1}}',
    '{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": -1}}',
    '{"cluster": {}, "task": {"type": "worker", "index": 0}}'])
def test_a_tf_config_that_is_not_a_worker_of_its_cluster_is_one_line(monkeypatch, config):
    monkeypatch.setenv("TF_CONFIG", config)
    with pytest.raises(UserError) as error:
        distribute._tf_config()
    assert str(error.value) == (f"TF_CONFIG={config!r}: expected {{\"cluster\": {{\"worker\": [\"host:port\", "
                                f"...]}}, \"task\": {{\"type\": \"worker\", \"index\": k}}}} with k < the number of "
                                f"workers")


@pytest.mark.parametrize("index", [0, 1])
def test_a_tf_config_of_a_worker_is_read_whole(monkeypatch, index):
    config = {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": index}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    assert distribute._tf_config() == config


def test_a_worker_of_several_has_its_index_and_a_step_that_lost_a_peer_is_one_line(monkeypatch):
    kind = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy
    worker = kind.__new__(kind)  # its type is all these read: no cluster, no server started
    config = {"cluster": {"worker": ["h:1", "h:2"]}, "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(config))
    monkeypatch.setenv(distribute.TIMEOUT_ENV, "30")
    assert distribute.worker_index(worker) == 1
    for error in (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
                  tf.errors.CancelledError, tf.errors.InternalError):
        assert str(distribute.lost_worker(error(None, None, "peer gone"), worker)) == (
            f"worker 1: a step failed ({error.__name__}): another worker stopped or cannot be reached (steps give "
            f"up after ZOO_DIST_TIMEOUT_S=30 s); the same command on every worker resumes from the newest checkpoint")
    assert distribute.lost_worker(tf.errors.InvalidArgumentError(None, None, "a bad value"), worker) is None
    assert distribute.lost_worker(ValueError("not TensorFlow's"), worker) is None


def test_a_worker_runs_its_session_on_its_server_with_the_strategys_config_and_the_step_timeout(monkeypatch):
    kind = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy
    worker = kind.__new__(kind)  # no cluster, no server: what session_options asks of the strategy stands in
    given = []

    def update_config_proto(config):  # the strategy's: a copy with its collective settings
        given.append(config)
        updated = copy.deepcopy(config)
        updated.experimental.collective_group_leader = "/job:worker/replica:0/task:0"
        return updated

    worker._extended = SimpleNamespace(_update_config_proto=update_config_proto,
                                       _cluster_resolver=SimpleNamespace(master=lambda: "h:2"))
    monkeypatch.setenv(distribute.TIMEOUT_ENV, "2.5")
    mine = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    target, config = distribute.session_options(worker, mine)
    assert target == "grpc://h:2" and given == [mine] and mine.operation_timeout_in_ms == 0  # the run's own kept
    assert config.intra_op_parallelism_threads == 1 and config.operation_timeout_in_ms == 2500
    assert config.experimental.collective_group_leader == "/job:worker/replica:0/task:0"
    monkeypatch.delenv(distribute.TIMEOUT_ENV)
    target, config = distribute.session_options(worker, None)
    assert given[-1] == tf.compat.v1.ConfigProto() and config.operation_timeout_in_ms == 600_000


@pytest.mark.parametrize("value, seconds", [(None, 600.0), ("30", 30.0), ("0.5", 0.5), ("1e3", 1000.0)])
def test_the_step_timeout_of_the_environment(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv(distribute.TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(distribute.TIMEOUT_ENV, value)
    assert distribute.timeout_s() == seconds


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", ""])
def test_a_step_timeout_that_is_not_a_positive_number_is_one_line(monkeypatch, value):
    monkeypatch.setenv(distribute.TIMEOUT_ENV, value)
    with pytest.raises(UserError) as error:
        distribute.timeout_s()
    assert str(error.value) == f"environment variable ZOO_DIST_TIMEOUT_S={value!r}: a number of seconds above 0"


def test_one_process_is_worker_0_runs_its_own_session_and_loses_no_worker(strategy):
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
    for each in (None, strategy):
        assert distribute.worker_index(each) == 0
        assert distribute.session_options(each, config) == ("", config)
        assert distribute.session_options(each, None) == ("", None)
        assert distribute.lost_worker(tf.errors.UnavailableError(None, None, "gone"), each) is None


def test_the_input_fn_gets_the_params_and_the_mode_and_a_wrong_dataset_is_named(strategy, caplog):
    params = load_params(None, default_params())
    calls = []

    def recorded(params, mode):
        calls.append((params, mode))
        return ordered(4)(params, mode)

    distribute.build_train_graph(model_fn, recorded, params, 3, True, strategy)
    assert len(calls) == 1 and calls[0][0] is params and calls[0][1] == ModeKeys.TRAIN

    def features_alone(params, mode):
        return ordered(4)(params, mode).map(lambda x, y: x)

    with pytest.raises(UserError) as error:
        distribute.build_train_graph(model_fn, features_alone, params, 3, True, strategy)
    assert str(error.value) == (f"{where(features_alone)}: the dataset yields TensorSpec elements; in train mode it "
                                f"must yield (features, labels) pairs")

    def ragged_rows(params, mode):  # a static batch, a length that is not
        lengths = tf.data.Dataset.range(1, 9).repeat()
        rows = lengths.map(lambda n: (tf.ones([n], tf.float32), n % CLASSES))
        return rows.padded_batch(4, padded_shapes=([None], []), drop_remainder=True)

    def pooled(features, labels, mode, params):
        return model_fn(tf.tile(tf.reduce_mean(features, 1, keepdims=True), [1, FEATURES]), labels, mode, params)

    with caplog.at_level(logging.WARNING, logger="zoo"):
        built = distribute.build_train_graph(pooled, ragged_rows, params, 3, True, strategy)
    assert built.batch_size == 8 and not built.static_shapes
    warnings = [message for level, message in zoo_log(caplog) if level == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{where(ragged_rows)}: the dataset's shapes are not static (")


def test_the_graph_seed_is_the_runs(strategy):
    params = load_params(None, default_params())

    def noisy(features, labels, mode, params):
        tf.compat.v1.add_to_collection("noise", tf.compat.v1.random_uniform([3]))  # no op seed: the graph's
        return model_fn(features, labels, mode, params)

    def shuffled(params, mode):  # no op seed: the graph's, set before the input_fn runs
        return ordered(1)(params, mode).unbatch().shuffle(EXAMPLES).batch(4, drop_remainder=True)

    def noise(seed):
        built = distribute.build_train_graph(noisy, shuffled, params, seed, True, strategy)
        run = GraphSession(built, RunConfig())
        values = run.session.run([built.graph.get_collection("noise")[0]] + built.graph.get_collection("dropped"))
        run.close()
        return np.concatenate([v.ravel() for v in values])

    assert np.array_equal(noise(3), noise(3)) and not np.array_equal(noise(3), noise(4))


def test_a_model_fns_spec_is_checked_on_each_replica_and_a_variable_train_op_taken_as_its_op(strategy):
    params = load_params(None, default_params())

    def not_a_spec(features, labels, mode, params):
        return {"loss": tf.reduce_mean(features)}

    with pytest.raises(UserError) as error:
        distribute.build_train_graph(not_a_spec, ordered(4), params, 3, True, strategy)
    assert str(error.value) == (f"{where(not_a_spec)} returned dict; a model_fn returns an EstimatorSpec or "
                                f"CSEstimatorSpec (from common.tf.estimator)")

    def stepped_variable(features, labels, mode, params):
        # MultiWorkerMirroredStrategy's apply returns the stepped global step, a variable
        spec = model_fn(features, labels, mode, params)
        return EstimatorSpec(mode, loss=spec.loss, train_op=tf.compat.v1.train.get_global_step())

    built = distribute.build_train_graph(stepped_variable, ordered(4), params, 3, True, strategy)
    assert isinstance(built.spec.train_op, tf.Operation)
    ancestors, todo = set(), [built.spec.train_op]
    while todo:
        op = todo.pop()
        if op not in ancestors:
            ancestors.add(op)
            todo += list(op.control_inputs) + [t.op for t in op.inputs]
    assert tf.compat.v1.train.get_global_step(built.graph).op in ancestors  # the step runs the variable's op


def test_the_train_op_alone_steps_every_replica(strategy):
    built = distribute.build_train_graph(model_fn, ordered(4), load_params(None, default_params()), 3, True, strategy)
    run = GraphSession(built, RunConfig())
    kernel = next(v for v in built.variables if v.op.name == "dense/kernel")
    before = run.session.run(kernel)
    run.session.run(built.train_op)  # the loss not fetched
    after, step = run.session.run([kernel, built.global_step])
    run.close()
    assert step == 1 and not np.array_equal(before, after)


def test_an_input_with_external_state_still_saves_its_position(strategy, tmp_path):
    def doubled_in_python(params, mode):
        x, y = np.ones((EXAMPLES, FEATURES), np.float32), (np.arange(EXAMPLES) % CLASSES).astype(np.int64)
        doubled = tf.data.Dataset.from_tensor_slices((x, y)).map(
            lambda a, b: (tf.ensure_shape(tf.py_function(lambda t: t * 2, [a], tf.float32), [FEATURES]), b))
        return doubled.repeat().batch(4, drop_remainder=True)

    built = distribute.build_train_graph(model_fn, doubled_in_python, load_params(None, default_params()), 3, True,
                                         strategy)
    run = GraphSession(built, RunConfig())
    run.session.run(built.train_op)
    with built.graph.as_default():
        path = built.saver.save(run.session, str(tmp_path / "model.ckpt"), global_step=1)
    run.close()
    assert any("iterator" in name.lower() for name, _ in tf.train.list_variables(path))


@pytest.mark.parametrize("count", [1, 2])
def test_loss_scaling_is_refused_on_any_number_of_replicas(strategy, count):
    params = load_params(None, {**default_params(), "mixed_precision": {"enabled": True, "dtype": "float16"},
                                "optimizer": {**default_params()["optimizer"], "loss_scaling_factor": 8.0}})
    with pytest.raises(UserError) as error:
        distribute.build_train_graph(model_fn, ordered(4), params, 3, True,
                                     strategy if count == 2 else distribute.mirrored_strategy("cpu", 1))
    assert str(error.value) == (
        "optimizer.loss_scaling_factor=8.0 with runconfig.train_distribute: loss scaling skips steps with a tf.cond "
        "around the update, which the replicas cannot share; train data parallel in bfloat16 or float32")


@pytest.mark.parametrize("count", [1, 2])
def test_a_model_fns_own_precision_is_recorded(strategy, count):
    def own_policy(features, labels, mode, params):
        keras.config.set_dtype_policy("mixed_bfloat16")  # as the vendor's models set it themselves
        logits = keras.layers.Dense(CLASSES, name="dense")(features)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, tf.cast(logits, tf.float32)))
        return EstimatorSpec(mode, loss=loss, train_op=build_train_op(loss, params))

    built = distribute.build_train_graph(own_policy, ordered(4), load_params(None, default_params()), 3, True,
                                         strategy if count == 2 else distribute.mirrored_strategy("cpu", 1))
    assert built.model_precision == "bfloat16"
