"""Data-parallel training on the TF1-graph Estimator: ``RunConfig(train_distribute=strategy)``.

    python tf/mnist/run.py --mode train runconfig.train_distribute=mirrored runconfig.num_devices=2

as tf.estimator's ``RunConfig(train_distribute=tf.distribute.MirroredStrategy())``; code that
builds its own RunConfig passes a ``tf.compat.v1.distribute.MirroredStrategy`` (or what
``strategy_from_params`` returns). Only training is distributed; eval and predict run whole
on one device, so their metrics are exact. In the TRAIN graph:

- each replica gets ``train_input.batch_size`` examples: the input_fn's batches are put
  together into global batches of batch_size x replicas (``Dataset.rebatch``), read by one
  iterator as on one device, and replica k takes the k-th slice of each, the convention of
  the PyTorch side (torchrun): N replicas with batch B train on exactly the examples of one
  device with batch N x B (tf.estimator's MirroredStrategy split the input_fn's batch
  instead; here the per-replica batch stays what params say);
- model_fn runs once per replica (tf.estimator did the same), its variables are
  MirroredVariables, created once and kept equal on every device;
- the gradients are averaged over the replicas whatever the loss's reduction:
  common.tf.optim.build_train_op adds up the replicas' gradients before unscaling,
  clipping and weight decay, so those see the global batch's gradient; a model_fn that
  calls a v1 optimizer itself gets tf.estimator's rule (a loss reduced by mean, written by
  hand or by tf.compat.v1.losses, is divided by the replicas before the optimizer adds
  their gradients up; a loss reduced by SUM is summed);
- the logged loss is the global batch's: the replicas' mean (their sum for a SUM loss);
- mixed-precision loss scaling (float16) is refused: its skip of a non-finite step is a
  tf.cond around the update, which the replicas' merged update cannot sit in;
- dropout and batch norm run per replica: the dropout masks are not those of one device
  (so such curves agree only statistically), and batch norm normalises each replica's
  slice by its own statistics, its moving statistics updated from one replica's batch, not
  the mean over the replicas (tests/tf/test_tf_distributed.py measures how far tf/resnet
  drifts from one device);
- one checkpoint, with the variables under their one-device names (it restores on one
  device and in any number of replicas) and the input position in global batches, and one
  TensorBoard log: one session writes them.

On the CPU, ``num_devices`` logical CPUs share the machine's cores (for tests and to try a
config; no speed-up is to be expected); with GPUs, the first ``num_devices`` GPUs (null:
all). The emulated device and ``--validate_only`` / ``--compile_only`` are one device per
run and refuse a strategy.

``train_distribute: multi_worker_mirrored`` trains across processes (on one machine or
several) with MultiWorkerMirroredStrategy, each process told its place by TF_CONFIG as
tf.estimator's were; each worker runs the same command. In graph mode the strategy's
collectives run only in a session whose target is the worker's own gRPC server (which the
strategy starts) with the strategy's session config (``update_config_proto``): without
them, the first step fails with "Cannot assign a device for operation
.../CollectiveBcastSend: ... explicitly assigned to /job:worker/replica:0/task:0/device:CPU:0
but available devices are [ /job:localhost/replica:0/task:0/device:CPU:0 ]"; GraphSession
opens that session. Every worker reads the whole input (the same order: the same seed)
and takes its replica's slice of each global batch. The chief (worker 0) writes model_dir;
the others write their checkpoints and logs into a temporary folder, deleted at the end.
A step that waits on a lost worker gives up after ``ZOO_DIST_TIMEOUT_S`` seconds (default
600, as the PyTorch side) and the run stops with one line; the same command on every
worker resumes from the newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Callable, Mapping

import keras
import tensorflow as tf

from common.errors import UserError

logger = logging.getLogger("zoo")


def strategy_from_params(runconfig: Mapping, device: str) -> Any:
    """The strategy ``runconfig.train_distribute`` asks for (None: one device)."""
    kind, count = runconfig["train_distribute"], runconfig["num_devices"]
    if kind is None:
        if count is not None:
            raise UserError(f"runconfig.num_devices={count} needs runconfig.train_distribute: mirrored (the devices "
                            f"to train on in parallel)")
        return None
    if device == "emulator":
        raise UserError(f"runconfig.train_distribute={kind} with --device emulator: the emulated device is one "
                        f"system per run; train on it without a strategy")
    if kind == "multi_worker_mirrored":
        if count is not None:
            raise UserError(f"runconfig.num_devices={count} is for train_distribute: mirrored; a worker of "
                            f"multi_worker_mirrored trains on every GPU it has (--device gpu) or on its CPU")
        return multi_worker_strategy()
    return mirrored_strategy(device, count)


def _tf_config() -> dict:
    """TF_CONFIG, checked: {"cluster": {"worker": [host:port, ...]}, "task": {"type": "worker", "index": k}}."""
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise UserError("runconfig.train_distribute=multi_worker_mirrored needs TF_CONFIG, the cluster and this "
                        "process's place in it, e.g. TF_CONFIG='{\"cluster\": {\"worker\": [\"host0:2222\", "
                        "\"host1:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}'")
    try:
        config = json.loads(raw)
        workers, task = config["cluster"]["worker"], config["task"]
        index = task["index"]
        ok = isinstance(workers, list) and task["type"] == "worker" and isinstance(index, int) and \
            0 <= index < len(workers)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise UserError(f"TF_CONFIG={raw!r}: expected {{\"cluster\": {{\"worker\": [\"host:port\", ...]}}, "
                        f"\"task\": {{\"type\": \"worker\", \"index\": k}}}} with k < the number of workers")
    return config


def multi_worker_strategy() -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy over the cluster TF_CONFIG describes (it starts this worker's gRPC server)."""
    _tf_config()
    from common.tf.estimator.tf_logs import quiet_tf_logs

    with quiet_tf_logs():
        return tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()


def worker_index(strategy: Any) -> int:
    """This process's index among the workers (0 without a multi-worker strategy): 0 writes model_dir."""
    if strategy is None or not isinstance(strategy, tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy):
        return 0
    return int(_tf_config()["task"]["index"])


def session_options(strategy: Any, session_config: Any) -> tuple[str, Any]:
    """The target and config of the session a graph built under ``strategy`` runs in: the worker's
    gRPC server and the strategy's config for a multi-worker strategy, else the local defaults."""
    if not isinstance(strategy, tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy):
        return "", session_config
    config = strategy.update_config_proto(session_config or tf.compat.v1.ConfigProto())
    # a step that waits on a lost worker fails after the timeout instead of waiting for ever
    config.operation_timeout_in_ms = int(timeout_s() * 1000)
    return "grpc://" + strategy.cluster_resolver.master(), config


TIMEOUT_ENV = "ZOO_DIST_TIMEOUT_S"  # the PyTorch side's variable too (common/pytorch/distributed.py)


def timeout_s() -> float:
    value = os.environ.get(TIMEOUT_ENV, "600")
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise UserError(f"environment variable {TIMEOUT_ENV}={value!r}: a number of seconds above 0")
    return seconds


def lost_worker(error: Exception, strategy: Any) -> UserError | None:
    """A multi-worker step that failed because another worker is gone, as one line (else None)."""
    if not isinstance(strategy, tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy) or not \
            isinstance(error, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError, tf.errors.AbortedError,
                               tf.errors.CancelledError, tf.errors.InternalError)):
        return None
    return UserError(f"worker {worker_index(strategy)}: a step failed ({type(error).__name__}): another worker "
                     f"stopped or cannot be reached (steps give up after {TIMEOUT_ENV}={timeout_s():g} s); the "
                     f"same command on every worker resumes from the newest checkpoint")


def mirrored_strategy(device: str, count: int | None) -> tf.distribute.Strategy:
    """A MirroredStrategy over ``count`` local GPUs (``--device gpu``; None: all) or ``count``
    logical CPUs (``--device cpu``), which are set up here: before TensorFlow's runtime starts."""
    if device == "gpu":
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:  # MirroredStrategy([]) would mirror over the CPUs instead
            raise UserError("runconfig.train_distribute=mirrored with --device gpu: TensorFlow sees no GPU on this "
                            "machine; use --device cpu")
        count = len(gpus) if count is None else count
        if count > len(gpus):
            raise UserError(f"runconfig.num_devices={count}: TensorFlow sees {len(gpus)} GPU(s) on this machine")
        devices = [f"/gpu:{i}" for i in range(count)]
    else:
        if count is None:
            raise UserError("runconfig.train_distribute=mirrored on the CPU needs runconfig.num_devices (how many "
                            "logical CPUs to mirror over, sharing the machine's cores)")
        _logical_cpus(count)
        devices = [f"/cpu:{i}" for i in range(count)]
    from common.tf.estimator.tf_logs import quiet_tf_logs

    with quiet_tf_logs():  # its "Using MirroredStrategy" line: build_train_graph logs the replicas
        return tf.compat.v1.distribute.MirroredStrategy(devices)


def _logical_cpus(count: int) -> None:
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError:  # the runtime started already (a second run in one process): what it has must do
        have = len(tf.config.list_logical_devices("CPU"))
        if have < count:
            raise UserError(f"runconfig.num_devices={count}: this process started TensorFlow with {have} logical "
                            f"CPU(s), and they cannot change once it has started; run in a new process") from None


def replicas(strategy: Any) -> int:
    return 1 if strategy is None else strategy.num_replicas_in_sync


def global_batches(dataset: tf.data.Dataset, batch_size: int, strategy: Any) -> tf.data.Dataset:
    """The input_fn's batches of ``batch_size`` as global batches of batch_size x replicas, each
    replica's slice in turn (an incomplete last global batch is dropped)."""
    return dataset.rebatch(batch_size * replicas(strategy), drop_remainder=True)


def run_replicas(strategy: Any, step: Callable, seed: int) -> tuple[Any, Any]:
    """``step()`` -> loss on every replica (with tf.estimator's loss scaling for v1
    optimizers); the replicas' losses and how to reduce them into the global batch's."""
    from tensorflow.python.distribute import distribute_utils  # tf.estimator's rule, not exported

    def replica_step():
        keras.utils.set_random_seed(seed)  # Keras's seeds are per thread, and each replica is a thread
        return step()

    with strategy._scale_loss_for_estimator_enabled():  # noqa: SLF001  (what tf.estimator turned on)
        per_replica = strategy.run(replica_step)
        reduction = distribute_utils.get_loss_reduction()
    return per_replica, reduction


def unique_variables(variables: list) -> list:
    """The graph's variables with each distributed variable once (not also its components)."""
    from common.tf.estimator.graph import components

    parts = {id(c) for v in variables if isinstance(v, tf.distribute.DistributedValues) for c in components(v)}
    return [v for v in variables if id(v) not in parts]


def build_train_graph(model_fn: Callable, input_fn: Callable, params: Mapping, seed: int, mixed_policy: bool,
                      strategy: Any):
    """The TRAIN graph of ``model_fn`` on every replica of ``strategy`` (graph.build_graph's
    TRAIN graph, one copy per device); nothing runs yet."""
    from common.tf.estimator import graph as g
    from common.tf.estimator.mode_keys import ModeKeys

    mode = ModeKeys.TRAIN
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    graph = tf.Graph()
    with graph.as_default(), strategy.scope():
        tf.compat.v1.set_random_seed(seed)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        dataset = g.call_input_fn(input_fn, params, mode)
        element_spec = g._dataset_element(dataset, input_fn, mode)
        batch_size, static = g._batch_size(element_spec, input_fn)
        if batch_size is None:
            raise UserError(f"{g.where(input_fn)}: runconfig.train_distribute needs batches of one static size "
                            f"(the replicas split each global batch evenly): batch with drop_remainder=True")
        cardinality = dataset.cardinality()
        # one iterator of global batches, as on one device (its position goes into the checkpoint);
        # replica k takes rows [k B, (k + 1) B) of each
        iterator = tf.compat.v1.data.make_initializable_iterator(global_batches(dataset, batch_size, strategy))
        element = iterator.get_next()
        specs: dict[int, Any] = {}
        precisions: list[str | None] = []

        def step():
            replica = int(tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group))
            first = replica * batch_size
            features, labels = tf.nest.map_structure(lambda t: t[first:first + batch_size], element)
            with g.keras_policy(params, mixed_policy), g.model_set_precision() as precision:
                spec = model_fn(features, labels, mode, params)
            train_op = getattr(spec, "train_op", None)
            if isinstance(train_op, tf.Variable):  # MultiWorkerMirroredStrategy's apply: the stepped global step
                spec = dataclasses.replace(spec, train_op=train_op.op)
            spec = g._check_spec(spec, mode, model_fn, graph)
            specs[replica] = spec
            precisions.append(precision[0])
            with tf.control_dependencies([spec.train_op]):
                return tf.identity(spec.loss)

        per_replica, reduction = run_replicas(strategy, step, seed)
        loss = strategy.reduce(reduction, per_replica, axis=None)
        train_op = tf.group(*strategy.experimental_local_results(per_replica), name="replicated_train_op")
        first = specs[min(specs)]  # this process's first replica (a worker of several holds replica k of N)
        spec = type(first)(**{**vars(first), "loss": loss, "train_op": train_op})
        built = g.ModelGraph(graph=graph, mode=mode, spec=spec, features=None, labels=None, iterator=iterator,
                             global_step=global_step, batch_size=batch_size * replicas(strategy),
                             static_shapes=static, cardinality=cardinality, model_precision=precisions[0],
                             strategy=strategy)
        built.train_op = g._run_state_updates(graph, train_op)
        built.learning_rate = g._single(graph, g.LEARNING_RATE_COLLECTION)  # no loss scale: refused under a strategy
        if g.summaries_enabled():  # the first replica's summaries (of its slice): TF skips the others'
            summaries = graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
            built.summary = tf.compat.v1.summary.merge(summaries) if summaries else None
        built.variables = unique_variables(tf.compat.v1.global_variables())
        built.iterator_saveable = tf.data.experimental.make_saveable_from_iterator(iterator,
                                                                                  external_state_policy="warn")
        built.saver = tf.compat.v1.train.Saver(var_list=built.variables + [built.iterator_saveable], max_to_keep=None,
                                               save_relative_paths=True)
    logger.info("training data parallel on %d replicas (%s): %d examples per replica, %d per step",
                replicas(strategy), ", ".join(strategy.extended.worker_devices), batch_size,
                batch_size * replicas(strategy))
    return built
