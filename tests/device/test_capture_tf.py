"""The TensorFlow capture frontend (device/capture/tf.py): structure, source lines, numerics.

Every graph is built as the TF runner builds one: a tf.compat.v1.Graph in which a
model_fn makes Keras 3 layers and ``AdamOptimizer(lr).minimize(loss, global_step)``.
Structure: op counts, parameter names (the TF variable names), state, unsupported ops
kept as nodes at the user's line, metrics in a training graph. Numerics: the emulator
(device.runtime.program) runs the captured graph and must agree with TF's own loss,
``tf.gradients`` and Adam steps.
"""

from __future__ import annotations

import collections
import pathlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.errors import UserError  # noqa: E402
from common.tf.optim import AdamWOptimizer  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from device.ops import OPS  # noqa: E402
from device.passes.validate import validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1
layers = tf.keras.layers

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line(tag: str) -> int:
    """The line of this file that ends with ``# <tag>``: where a test model calls a layer."""
    return next(i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{tag}>"))


# ---------------------------------------------------------------------------- models
# model_fns as a user writes them: (features, labels) -> (loss, outputs)


def mlp_fn(x, y, dropout: float = 0.0):
    h = layers.Dense(32, activation="relu")(x)  # <mlp-dense1>
    h = layers.Dropout(dropout)(h, training=True)  # <mlp-dropout>
    h = layers.Dense(16, activation="relu")(h)  # <mlp-dense2>
    logits = layers.Dense(10)(h)  # <mlp-dense3>
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)  # <mlp-xent>
    return tf.reduce_mean(xent), {"logits": logits}  # <mlp-mean>


def cnn_fn(x, y, training: bool = True):  # x: (N, 8, 8, 3)
    h = layers.Conv2D(4, 3, padding="same")(x)  # <cnn-conv>
    h = layers.BatchNormalization()(h, training=training)  # <cnn-bn>
    h = layers.ReLU()(h)
    h = layers.MaxPooling2D(2)(h)  # (N, 4, 4, 4)
    logits = layers.Dense(10)(layers.Flatten()(h))
    loss = v1.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
    return loss, {"logits": logits}


def transformer_fn(ids, y, dim: int = 8, heads: int = 2):  # ids: (B, T)
    """One pre-norm block: embedding, attention by einsum and matmul, GELU MLP, residuals."""
    batch, seq = ids.shape
    h = layers.Embedding(11, dim)(ids)  # (B, T, C)  # <tr-embedding>
    a = layers.LayerNormalization(epsilon=1e-5)(h)  # <tr-ln1>
    q, k, v = (tf.reshape(layers.Dense(dim)(a), [batch, seq, heads, dim // heads]) for _ in range(3))
    scores = tf.einsum("bthd,bshd->bhts", q, k) / np.sqrt(dim // heads)  # (B, H, T, T)
    att = tf.nn.softmax(scores)  # <tr-softmax>
    o = tf.matmul(att, tf.transpose(v, [0, 2, 1, 3]))  # (B, H, T, D)
    o = tf.reshape(tf.transpose(o, [0, 2, 1, 3]), [batch, seq, dim])
    h = h + layers.Dense(dim)(o)
    m = layers.Dense(2 * dim, activation="gelu")(layers.LayerNormalization(epsilon=1e-5)(h))  # <tr-gelu>
    h = h + layers.Dense(dim)(m)
    logits = layers.Dense(3)(tf.reduce_mean(h, axis=1))  # (B, 3)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return loss, {"logits": logits}


class Built:
    """A TRAIN graph as the runner builds it, and a session with initialised variables."""

    def __init__(self, model_fn, x_shape, x_dtype=tf.float32, optimizer=None, train=True, policy="float32"):
        tf.keras.backend.clear_session()  # layer names start again from "dense", "conv2d"
        tf.keras.utils.set_random_seed(0)
        tf.keras.mixed_precision.set_global_policy(policy)
        self.graph = tf.Graph()
        try:
            with self.graph.as_default():
                self._build(model_fn, x_shape, x_dtype, optimizer, train)
        finally:
            tf.keras.mixed_precision.set_global_policy("float32")
        self.session = v1.Session(graph=self.graph)
        self.session.run(self.init)

    def _build(self, model_fn, x_shape, x_dtype, optimizer, train):
        self.x = v1.placeholder(x_dtype, x_shape, name="features")
        self.y = v1.placeholder(tf.int32, x_shape[:1], name="labels")
        self.loss, self.outputs = model_fn(self.x, self.y)
        self.train_op = None
        if train:
            optimizer = optimizer or v1.train.AdamOptimizer(1e-3)
            self.train_op = optimizer.minimize(self.loss, v1.train.get_or_create_global_step())
        variables = v1.trainable_variables()
        # dense gradients (an embedding's are IndexedSlices); a variable behind
        # tf.stop_gradient has none
        grads = tf.gradients(self.loss, variables)
        self.grads = [tf.convert_to_tensor(g) for g in grads if g is not None]
        self.variables = [v for v, g in zip(variables, grads) if g is not None]
        self.init = v1.global_variables_initializer()

    def capture(self, **kwargs):
        return capture_tf.capture(self.graph, inputs=[self.x, self.y], loss=self.loss, train_op=self.train_op,
                                  outputs=self.outputs, **kwargs)

    def run(self, fetches, x, y):
        return self.session.run(fetches, {self.x: x, self.y: y})

    def close(self):
        self.session.close()


@pytest.fixture
def built_graphs():
    made = []

    def build(*args, **kwargs):
        made.append(Built(*args, **kwargs))
        return made[-1]
    yield build
    for b in made:
        b.close()


def _batch(rng, x_shape, classes, ints: int | None = None):
    x = rng.integers(0, ints, x_shape).astype(np.int32) if ints else rng.standard_normal(x_shape).astype(np.float32)
    return x, rng.integers(0, classes, x_shape[0]).astype(np.int32)


def _close(actual, expected, rtol, scale=None):
    """Relative agreement, with an absolute floor at rtol times ``scale`` (default: the
    tensor's largest entry) for entries that are zero up to rounding."""
    expected = np.asarray(expected)
    scale = float(np.abs(expected).max()) if scale is None else scale
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * scale)


def _close_grads(grads: dict, variables, expected: list, rtol: float):
    """Every variable's gradient, the floor at the largest gradient entry of all: some are
    zero but for rounding (a conv bias before batch norm, the key bias of attention)."""
    assert set(grads) == {v.op.name for v in variables}
    scale = max(float(np.abs(g).max()) for g in expected)
    for var, g in zip(variables, expected):
        _close(grads[var.op.name], g, rtol, scale)


# ------------------------------------------------------------------------- structure


def test_mlp_ops_params_optimizer_and_source_lines(built_graphs):
    b = built_graphs(mlp_fn, (8, 784))
    graph = b.capture()
    ops = collections.Counter(n.op for n in graph.nodes)
    assert ops == {"matmul": 3, "add": 3, "relu": 2, "sparse_softmax_cross_entropy": 1, "reduce_mean": 1}
    # params are the TF variables, by the names the Saver uses, with their shapes
    assert {name: graph.values[value].shape for value, name in graph.params.items()} == \
        {v.op.name: tuple(v.shape) for v in b.variables}
    assert graph.state == {} and graph.issues == []
    assert graph.inputs == [b.x.name, b.y.name] and graph.values[graph.inputs[0]].shape == (8, 784)
    assert graph.loss == "Mean:0" and graph.outputs == {"logits": b.outputs["logits"].name}
    assert graph.optimizer.kind == "adam" and graph.optimizer.semantics == "tf"
    assert graph.optimizer.hyper == {"lr": 0.001, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    # every node points at the line of this file that made it
    lines = [(n.op, n.loc.line) for n in graph.nodes]
    assert all(n.loc.file == __file__ for n in graph.nodes)
    assert lines == [("matmul", _line("mlp-dense1")), ("add", _line("mlp-dense1")), ("relu", _line("mlp-dense1")),
                     ("matmul", _line("mlp-dense2")), ("add", _line("mlp-dense2")), ("relu", _line("mlp-dense2")),
                     ("matmul", _line("mlp-dense3")), ("add", _line("mlp-dense3")),
                     ("sparse_softmax_cross_entropy", _line("mlp-xent")), ("reduce_mean", _line("mlp-mean"))]
    assert graph.nodes[0].loc.framework_op == "MatMul"
    assert validate(graph, mode="train", profile=None).ok


def test_mlp_dropout_is_one_node_with_its_rate(built_graphs):
    graph = built_graphs(lambda x, y: mlp_fn(x, y, dropout=0.25), (8, 784)).capture()
    drops = [n for n in graph.nodes if n.op == "dropout"]
    assert len(drops) == 1 and drops[0].attrs == {"rate": 0.25}
    assert drops[0].loc.line == _line("mlp-dropout") and drops[0].loc.framework_op == "Dropout"
    # the random draw and its seed variable are not part of the IR
    assert set(OPS) >= {n.op for n in graph.nodes} and graph.state == {}


def stochastic_depth_fn(x, y):  # x: (N, 4, 4, 3); Keras 3 EfficientNet's drop of a whole block per example
    h = layers.Conv2D(4, 3, padding="same")(x)
    h = layers.Dropout(0.5, noise_shape=(None, 1, 1, 1))(h, training=True)  # <drop-per-example>
    logits = layers.Dense(3)(layers.Flatten()(h))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {"h": h}


def test_dropout_with_a_noise_shape_draws_one_mask_per_example(built_graphs):
    graph = built_graphs(stochastic_depth_fn, (16, 4, 4, 3)).capture()
    assert validate(graph, mode="train", profile=None).ok  # its seed (FloorMod, StatelessRandom*) is gone
    drop = next(n for n in graph.nodes if n.op == "dropout")
    assert drop.attrs == {"rate": 0.5} and graph.values[drop.outputs[0]].shape == (16, 1, 1, 1)
    mul = next(n for n in graph.nodes if drop.outputs[0] in n.inputs)
    assert mul.op == "mul" and mul.loc.line == _line("drop-per-example")
    rng = np.random.default_rng(0)
    h = Program(graph, {k: rng.standard_normal(graph.values[v].shape).astype(np.float32)
                        for v, k in graph.params.items()}).forward(list(_batch(rng, (16, 4, 4, 3), 3)), True)["h"]
    zero = np.all(h == 0, axis=(1, 2, 3))  # each example dropped whole, or kept whole
    assert 0 < zero.sum() < 16 and np.all(h[~zero] != 0)


def test_cnn_captures_without_unsupported_ops(built_graphs):
    b = built_graphs(cnn_fn, (4, 8, 8, 3))
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS)
    conv = next(n for n in graph.nodes if n.op == "conv2d")
    assert conv.attrs == {"strides": [1, 1], "padding": "SAME", "dilations": [1, 1], "layout": "NHWC",
                          "weight_layout": "HWIO"}
    assert conv.loc.line == _line("cnn-conv")
    bn = next(n for n in graph.nodes if n.op == "batch_norm")
    # Keras momentum 0.99 keeps 99% of the old value: the IR's (torch's) momentum is 0.01
    assert bn.attrs == {"axis": 3, "eps": 0.001, "momentum": 0.01, "unbiased_var": False} and bn.loc.line == _line("cnn-bn")
    with b.graph.as_default():
        moving = sorted(v.op.name for v in v1.global_variables() if "moving_" in v.op.name)
    assert [graph.state[v] for v in bn.inputs[3:]] == moving and len(moving) == 2  # mean, variance
    assert set(graph.state.values()) == set(moving)
    pool = next(n for n in graph.nodes if n.op == "max_pool2d")
    assert pool.attrs == {"kernel": [2, 2], "strides": [2, 2], "padding": "VALID", "layout": "NHWC"}
    assert validate(graph, mode="train", profile=None).ok


def test_cnn_eval_graph_keeps_batch_norm_statistics_fixed(built_graphs):
    b = built_graphs(lambda x, y: cnn_fn(x, y, training=False), (4, 8, 8, 3), train=False)
    graph = b.capture()
    assert graph.optimizer is None and "batch_norm" not in {n.op for n in graph.nodes}
    # inference normalisation reads the running statistics as state
    assert sorted(graph.state.values()) == ["batch_normalization/moving_mean", "batch_normalization/moving_variance"]
    assert {n.op for n in graph.nodes} <= set(OPS)


def test_transformer_block_captures_without_unsupported_ops(built_graphs):
    graph = built_graphs(transformer_fn, (2, 5), x_dtype=tf.int32).capture()
    ops = collections.Counter(n.op for n in graph.nodes)
    assert set(ops) <= set(OPS)
    assert ops["embedding"] == 1 and ops["layer_norm"] == 2 and ops["gelu"] == 1 and ops["softmax"] == 1
    assert ops["einsum"] == 1 and ops["matmul"] == 8  # 7 Dense layers and the attention's matmul
    by_op = {n.op: n for n in graph.nodes}
    assert by_op["layer_norm"].attrs == {"axes": [2], "eps": 1e-5}
    assert by_op["gelu"].attrs == {"approximate": "none"} and by_op["gelu"].loc.line == _line("tr-gelu")
    assert by_op["embedding"].loc.line == _line("tr-embedding") and by_op["softmax"].loc.line == _line("tr-softmax")
    assert graph.values[graph.params["embedding/embeddings"]].shape == (11, 8)
    assert validate(graph, mode="train", profile=None).ok


def test_mixed_precision_patterns_with_16_bit_constants(built_graphs):
    """Under Keras' mixed_bfloat16 policy gelu's and dropout's constants are bfloat16."""
    def model_fn(x, y):
        h = layers.Dense(16, activation="gelu")(x)
        h = layers.LayerNormalization()(layers.Dropout(0.1)(h, training=True))
        logits = tf.cast(layers.Dense(10)(h), tf.float32)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {}

    graph = built_graphs(model_fn, (4, 6), policy="mixed_bfloat16").capture(precision="bfloat16")
    ops = collections.Counter(n.op for n in graph.nodes)
    assert set(ops) <= set(OPS) and ops["gelu"] == ops["dropout"] == ops["layer_norm"] == 1
    assert next(n for n in graph.nodes if n.op == "dropout").attrs == {"rate": 0.1}
    # float32 weights, cast to bfloat16 for the matmuls
    assert {graph.values[v].dtype for v in graph.params} == {"float32"}
    assert {"bfloat16"} <= {n.attrs["dtype"] for n in graph.nodes if n.op == "cast"}


def test_unsupported_ops_are_all_kept_as_nodes_at_the_users_line(built_graphs):
    def model_fn(x, y):
        logits = layers.Dense(10)(x)
        ranked = tf.sort(logits, axis=-1)  # <sort>
        positive = tf.where(logits > 0)  # <where>
        extra = tf.reduce_sum(ranked) + tf.reduce_sum(tf.cast(positive, tf.float32))
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        return tf.reduce_mean(xent) + 0.0 * extra, {}

    graph = built_graphs(model_fn, (4, 6)).capture()
    unsupported = {n.op: n for n in graph.nodes if n.op not in OPS}
    assert {"TopKV2", "Where"} <= set(unsupported)
    assert unsupported["TopKV2"].loc.line == _line("sort") and unsupported["Where"].loc.line == _line("where")
    assert unsupported["Where"].loc.file == __file__
    assert graph.values[unsupported["Where"].outputs[0]].shape == (None, 2)  # from TF's static shape
    report = validate(graph, mode="train", profile=None)
    lines = {f.line for f in report.errors if f.kind == "unsupported_op"}
    assert {_line("sort"), _line("where")} <= lines


def test_complex_values_are_validation_errors_at_the_users_lines(built_graphs):
    """complex64 from an FFT and a complex constant: the op, its line and the dtype, not a frontend bug."""
    def model_fn(x, y):
        magnitude = tf.abs(tf.signal.rfft(x))  # <rfft>
        rotated = tf.math.real(tf.complex(x, x) * tf.constant(1j, tf.complex64))  # <complex>
        logits = layers.Dense(3)(magnitude) + tf.reduce_sum(rotated)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {}

    graph = built_graphs(model_fn, (4, 8)).capture()  # the complex constant was a TypeError
    report = validate(graph, mode="train", profile=None)
    dtype_lines = {(f.file, f.line) for f in report.errors if f.kind == "dtype"}
    assert dtype_lines == {(__file__, _line("rfft")), (__file__, _line("complex"))}
    fft = next(f for f in report.errors if f.kind == "dtype" and f.framework_op == "RFFT")
    assert "has dtype complex64" in fft.message and "input pipeline" in fft.suggestion
    assert "frontend bug" not in report.to_text()


def test_metrics_in_a_training_graph_are_an_issue(built_graphs):
    def model_fn(x, y):
        loss, outputs = mlp_fn(x, y)
        predictions = tf.argmax(outputs["logits"], axis=1, output_type=tf.int32)
        _, update = v1.metrics.accuracy(labels=y, predictions=predictions)  # <metric>
        with tf.control_dependencies([update]):
            loss = tf.identity(loss)
        return loss, outputs

    b = built_graphs(model_fn, (8, 784))
    graph = b.capture()
    assert [i["kind"] for i in graph.issues] == ["metrics_in_training_graph"]
    issue = graph.issues[0]
    assert "accuracy" in issue["message"] and "host_call" in issue["message"]
    assert issue["loc"].file == __file__ and issue["loc"].line == _line("metric")
    assert any(f.kind == "metrics_in_training_graph" for f in validate(graph, mode="train", profile=None).errors)
    # the same graph captured for eval (no train_op) may compute metrics
    assert capture_tf.capture(b.graph, inputs=[b.x, b.y], loss=b.loss).issues == []


def test_dynamic_batch_dimension_stays_none():
    graph_tf = tf.Graph()
    with graph_tf.as_default():
        x = v1.placeholder(tf.float32, [None, 6])
        y = v1.placeholder(tf.int32, [None])
        loss, _ = mlp_fn(x, y)
        graph = capture_tf.capture(graph_tf, inputs=[x, y], loss=loss)
    assert graph.values[graph.inputs[0]].shape == (None, 6)
    errors = validate(graph, mode="eval", profile=None).errors
    assert any(f.kind == "dynamic_shape" and "drop_remainder" in f.message for f in errors)


def test_stop_gradient_is_a_marked_identity(built_graphs):
    def model_fn(x, y):
        logits = layers.Dense(10)(tf.stop_gradient(layers.Dense(6)(x)))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {}

    graph = built_graphs(model_fn, (4, 6)).capture()
    marked = [n for n in graph.nodes if n.attrs.get(capture_tf.STOP_GRADIENT_ATTR)]
    assert len(marked) == 1 and marked[0].op == "identity" and marked[0].loc.framework_op == "StopGradient"


def test_optimizers_are_read_from_the_apply_ops(built_graphs):
    momentum = built_graphs(mlp_fn, (4, 6), optimizer=v1.train.MomentumOptimizer(0.1, 0.9, use_nesterov=True))
    assert momentum.capture().optimizer.hyper == {"lr": 0.1, "momentum": 0.9, "nesterov": 1.0}
    sgd = built_graphs(mlp_fn, (4, 6), optimizer=v1.train.GradientDescentOptimizer(0.5)).capture().optimizer
    assert (sgd.kind, sgd.hyper) == ("sgd", {"lr": 0.5})
    with pytest.raises(UserError, match="ResourceApplyRMSProp"):
        built_graphs(mlp_fn, (4, 6), optimizer=v1.train.RMSPropOptimizer(0.1)).capture()


def test_adamw_of_the_runner_and_an_update_inside_tf_cond(built_graphs):
    """common/tf/optim.py's AdamW (Adam + decoupled decay ops), the update wrapped in a
    tf.cond as its dynamic loss scaling does, and a learning rate that is not a constant."""
    def model_fn(x, y):
        return mlp_fn(x, y)

    class CondMinimize:
        """minimize() whose update runs inside tf.cond (a functional If op)."""

        def __init__(self, optimizer):
            self.optimizer = optimizer

        def minimize(self, loss, global_step):
            grads_and_vars = self.optimizer.compute_gradients(loss)
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g, _ in grads_and_vars])
            update = tf.cond(finite, lambda: tf.group(self.optimizer.apply_gradients(grads_and_vars)), tf.no_op)
            with tf.control_dependencies([update]):
                return global_step.assign_add(1)

    def adamw():
        lr = v1.placeholder_with_default(np.float32(0.002), [])  # a schedule stands in: not a constant
        decayed = {v.op.name for v in v1.trainable_variables() if "kernel" in v.op.name}
        return AdamWOptimizer(lr, 0.01, decayed, beta1=0.8, epsilon=1e-6)

    plain = built_graphs(model_fn, (4, 6), optimizer=_Lazy(adamw)).capture()
    in_cond = built_graphs(model_fn, (4, 6), optimizer=_Lazy(lambda: CondMinimize(adamw()))).capture()
    for graph in (plain, in_cond):
        spec = graph.optimizer
        assert spec.kind == "adamw" and spec.hyper == {"beta1": 0.8, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.01}
        biases = {name for name in graph.params.values() if "bias" in name}
        assert set(spec.weight_decay_exclude) == biases and len(biases) == 3
        assert len(graph.params) == 6  # updated inside the cond: still parameters


class _Lazy:
    """An optimizer made inside the graph (when minimize is called), as model_fns make them."""

    def __init__(self, make):
        self.make = make

    def minimize(self, loss, global_step):
        return self.make().minimize(loss, global_step)


# -------------------------------------------------------------------------- numerics


@pytest.mark.parametrize("model", ["mlp", "cnn", "transformer"])
def test_loss_and_gradients_match_tf(built_graphs, model):
    rng = np.random.default_rng(0)
    if model == "mlp":
        b, (x, y) = built_graphs(mlp_fn, (8, 784)), _batch(rng, (8, 784), 10)
    elif model == "cnn":
        b, (x, y) = built_graphs(cnn_fn, (4, 8, 8, 3)), _batch(rng, (4, 8, 8, 3), 10)
    else:
        b = built_graphs(transformer_fn, (2, 5), x_dtype=tf.int32)
        x, y = _batch(rng, (2, 5), 3, ints=11)
    graph = b.capture()
    program = Program(graph, capture_tf.read_weights(b.session, graph), capture_tf.read_state(b.session, graph))
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    loss, grads = program.gradients([x, y])
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


def test_batch_norm_running_mean_follows_keras(built_graphs):
    rng = np.random.default_rng(1)
    b = built_graphs(cnn_fn, (4, 8, 8, 3))
    graph = b.capture()
    x, y = _batch(rng, (4, 8, 8, 3), 10)
    program = Program(graph, capture_tf.read_weights(b.session, graph), capture_tf.read_state(b.session, graph))
    program.forward([x, y], training=True)
    # Keras 3 assigns its moving averages with ops nothing depends on (the runner runs them)
    mean = "batch_normalization/moving_mean"
    assign = [op for op in b.graph.get_operations() if op.type == "AssignVariableOp"
              and op.inputs[0].op.name == mean and not op.name.startswith(mean)]
    b.run(assign, x, y)
    # (the running variance differs: Keras averages the biased batch variance, the runtime
    # the unbiased one as torch does)
    _close(program.get_state()[mean], capture_tf.read_state(b.session, graph)[mean], 1e-5)


def test_eval_graph_forward_matches_tf(built_graphs):
    rng = np.random.default_rng(2)
    b = built_graphs(lambda x, y: cnn_fn(x, y, training=False), (4, 8, 8, 3), train=False)
    graph = b.capture()
    # running statistics other than the initial 0 and 1
    capture_tf.write_weights(b.session, graph, {name: rng.uniform(0.5, 2.0, 4).astype(np.float32)
                                                for name in graph.state.values()})
    program = Program(graph, capture_tf.read_weights(b.session, graph), capture_tf.read_state(b.session, graph))
    x, y = _batch(rng, (4, 8, 8, 3), 10)
    result = program.forward([x, y], training=False)
    tf_loss, tf_logits = b.run([b.loss, b.outputs["logits"]], x, y)
    _close(result["loss"], tf_loss, 1e-5)
    _close(result["logits"], tf_logits, 1e-5)


def test_more_tf_ops_match_tf(built_graphs):
    """The rest of the lowering table, forward and gradients: slicing, concat, transposed
    matmuls, the activations, tanh and erf GELU, dense-label cross entropy, pooling."""
    def model_fn(x, y):  # x: (4, 6, 6, 2)
        h = layers.Conv2D(3, 3, strides=2, padding="valid")(x)  # (4, 2, 2, 3)
        h = tf.nn.avg_pool2d(tf.nn.leaky_relu(h, 0.2), 2, 1, "SAME")
        flat = tf.reshape(h, [4, 12])
        a = layers.Dense(8, activation="elu")(flat)
        b = layers.Dense(8, activation="selu")(flat)
        c = tf.concat([a[:, 2:6], tf.nn.gelu(b, approximate=True)[:, ::2]], axis=1)  # (4, 8)
        d = 0.5 * c * (1.0 + tf.math.erf(c / tf.sqrt(2.0)))
        w = tf.matmul(d, b, transpose_a=True)  # (8, 8)
        e = tf.matmul(a, w, transpose_b=True)  # (4, 8)
        e = tf.math.squared_difference(e, tf.sigmoid(a)) + tf.square(tf.tanh(a))
        logits = layers.Dense(5)(e)
        onehot = tf.one_hot(y, 5)
        loss = v1.losses.softmax_cross_entropy(onehot, logits) + tf.reduce_mean(tf.nn.log_softmax(logits)[:, 0])
        return loss, {"max": tf.reduce_max(logits, axis=1)}

    b = built_graphs(model_fn, (4, 6, 6, 2))
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS) and "one_hot" in {n.op for n in graph.nodes}
    # feed the one-hot labels as an input instead: the rest must match TF
    onehot = b.graph.get_tensor_by_name("one_hot:0")
    graph = capture_tf.capture(b.graph, inputs=[b.x, onehot], loss=b.loss, outputs=b.outputs)
    assert {n.op for n in graph.nodes} <= set(OPS)
    assert {"gelu", "elu", "selu", "slice", "concat", "avg_pool2d", "log_softmax", "maximum"} <= \
        {n.op for n in graph.nodes}
    rng = np.random.default_rng(3)
    x, y = _batch(rng, (4, 6, 6, 2), 5)
    labels = np.eye(5, dtype=np.float32)[y]
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    loss, grads = program.gradients([x, labels])
    tf_loss, tf_grads = b.session.run([b.loss, b.grads], {b.x: x, onehot: labels})
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


def test_slice_and_stack_match_tf(built_graphs):
    """tf.slice (a -1 size; a size from tf.shape of a static tensor, as a position table cut to
    the sequence length) and tf.stack (of one tensor, as tf.matmul(x, (w,)) makes one; of two)."""
    def model_fn(x, y):  # x: (4, 5, 6)
        table = v1.get_variable("table", (9, 6), initializer=v1.random_normal_initializer(seed=1))
        h = x + tf.slice(table, [0, 0], [tf.shape(x)[1], -1])  # (4, 5, 6)
        w = v1.get_variable("w", (6, 3), initializer=v1.random_normal_initializer(seed=2))
        h = tf.matmul(h, tf.stack([w]))  # (1, 6, 3) broadcast over the batch: (4, 5, 3)
        pair = tf.stack([h[:, 0], tf.slice(h, [0, 2, 1], [-1, 1, 2])[:, 0, :1] * h[:, 1]], axis=1)  # (4, 2, 3)
        logits = tf.reduce_sum(pair, axis=1)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {}

    b = built_graphs(model_fn, (4, 5, 6))
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS) and {"slice", "concat"} <= {n.op for n in graph.nodes}
    rng = np.random.default_rng(6)
    x, y = _batch(rng, (4, 5, 6), 3)
    loss, grads = Program(graph, capture_tf.read_weights(b.session, graph)).gradients([x, y])
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


def test_softplus_is_one_node_and_matches_tf(built_graphs):
    def model_fn(x, y):  # x: (4, 6)
        logits = layers.Dense(3)(tf.nn.softplus(layers.Dense(5)(x)))
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)), {}

    b = built_graphs(model_fn, (4, 6))
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS) and validate(graph, mode="train", profile=None).ok
    assert [n.op for n in graph.nodes].count("softplus") == 1
    x, y = _batch(np.random.default_rng(5), (4, 6), 3)
    x *= 4  # reach where softplus is nearly linear and nearly zero
    loss, grads = Program(graph, capture_tf.read_weights(b.session, graph)).gradients([x, y])
    tf_loss, tf_grads = b.session.run([b.loss, b.grads], {b.x: x, b.y: y})
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_fused_batch_norm_matches_tf(training):
    """tf.compat.v1.nn.fused_batch_norm: batch_norm in training (TF's running variance is
    unbiased, as the runtime's), the elementwise formula with fixed statistics otherwise."""
    graph_tf = tf.Graph()
    with graph_tf.as_default():
        x = v1.placeholder(tf.float32, [4, 3, 3, 2])
        y = v1.placeholder(tf.int32, [4])

        def variable(name, value, trainable=True):
            return v1.get_variable(name, initializer=np.float32(value), trainable=trainable, use_resource=True)

        gamma, beta = variable("gamma", [1.5, 0.5]), variable("beta", [0.1, -0.2])
        mean, var = variable("mean", [0.3, -0.1], False), variable("var", [1.2, 0.7], False)
        out, batch_mean, batch_var = v1.nn.fused_batch_norm(
            x, gamma, beta, mean=mean.read_value(), variance=var.read_value(), epsilon=1e-3, is_training=training,
            exponential_avg_factor=0.1 if training else 1.0)
        logits = tf.reshape(out, [4, 18])[:, :5]
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        grads = tf.gradients(loss, [gamma, beta])
        graph = capture_tf.capture(graph_tf, inputs=[x, y], loss=loss)
        init = v1.global_variables_initializer()
    ops = {n.op for n in graph.nodes}
    assert ops <= set(OPS) and ("batch_norm" in ops) == training
    rng = np.random.default_rng(6)
    batch = _batch(rng, (4, 3, 3, 2), 5)
    with v1.Session(graph=graph_tf) as session:
        session.run(init)
        program = Program(graph, capture_tf.read_weights(session, graph), capture_tf.read_state(session, graph))
        tf_loss, tf_grads, tf_mean, tf_var = session.run([loss, grads, batch_mean, batch_var], dict(zip((x, y), batch)))
    if not training:
        _close(program.forward(list(batch), training=False)["loss"], tf_loss, 1e-5)
        return
    assert next(n for n in graph.nodes if n.op == "batch_norm").attrs == {"axis": 3, "eps": 0.001, "momentum": 0.1}
    loss_value, grads_value = program.gradients(list(batch))
    _close(loss_value, tf_loss, 1e-5)
    _close_grads(grads_value, [gamma, beta], tf_grads, 1e-5)
    _close(program.get_state()["mean"], tf_mean, 1e-5)
    _close(program.get_state()["var"], tf_var, 1e-5)


def test_fifty_adam_steps_match_tf(built_graphs):
    rng = np.random.default_rng(4)
    b = built_graphs(mlp_fn, (8, 784), optimizer=v1.train.AdamOptimizer(1e-3))
    graph = b.capture()
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    lr = graph.optimizer.hyper["lr"]
    for step in range(50):
        x, y = _batch(rng, (8, 784), 10)
        tf_loss, _ = b.run([b.loss, b.train_op], x, y)
        loss = program.train_step([x, y], lr)
        assert loss == pytest.approx(float(tf_loss), rel=1e-4), f"step {step}"


def test_emulator_state_resumes_in_tf_through_a_checkpoint(built_graphs, tmp_path):
    """Weights and Adam slots written from the emulator into a TF checkpoint continue
    training in TF exactly as the emulator continues."""
    rng = np.random.default_rng(5)
    b = built_graphs(mlp_fn, (8, 784))
    graph = b.capture()
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    lr = graph.optimizer.hyper["lr"]
    batches = [_batch(rng, (8, 784), 10) for _ in range(8)]
    for x, y in batches[:5]:
        program.train_step([x, y], lr)
    capture_tf.write_weights(b.session, graph, program.get_weights())
    capture_tf.write_optimizer_state(b.session, graph, program.get_optimizer_state())
    with b.graph.as_default():  # a v1 Saver outside its graph builds itself for eager mode
        saver = v1.train.Saver()
        path = saver.save(b.session, str(tmp_path / "model.ckpt"), global_step=5)
    with v1.Session(graph=b.graph) as resumed, b.graph.as_default():
        saver.restore(resumed, path)
        state = capture_tf.read_optimizer_state(resumed, graph)
        expected = program.get_optimizer_state()
        assert state["step"] == expected["step"] == 5  # from beta1_power
        for name in graph.params.values():
            _close(state[name]["m"], expected[name]["m"], 1e-6)
        for x, y in batches[5:]:
            tf_loss, _ = resumed.run([b.loss, b.train_op], {b.x: x, b.y: y})
            assert program.train_step([x, y], lr) == pytest.approx(float(tf_loss), rel=1e-4)
    assert set(capture_tf.optimizer_slots(b.graph, graph)["dense/kernel"].values()) == \
        {"dense/kernel/Adam", "dense/kernel/Adam_1"}


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_cnn_and_transformer_validate_compile_and_train_on_the_emulator(built_graphs, model, tmp_path):
    """Beyond the MLP: the zoo's vision and language building blocks go through every stage."""
    from device.api import compile_graph, validate_graph

    rng = np.random.default_rng(5)
    adam = v1.train.AdamOptimizer(1e-2)
    if model == "cnn":
        b, (x, y) = built_graphs(cnn_fn, (4, 8, 8, 3), optimizer=adam), _batch(rng, (4, 8, 8, 3), 10)
        kinds = {"conv", "pool", "dense", "softmax_loss"}
    else:
        b = built_graphs(transformer_fn, (2, 5), x_dtype=tf.int32, optimizer=adam)
        x, y = _batch(rng, (2, 5), 3, ints=11)
        kinds = {"embedding", "layer_norm", "attention", "dense", "softmax_loss"}
    graph = b.capture()
    assert validate_graph(graph, mode="train", profile_name="small").ok
    result = compile_graph(graph, mode="train", profile_name="small", out_dir=tmp_path / "compile")
    assert kinds <= {k.kind for k in result.kernels}
    assert (tmp_path / "compile" / "placement.svg").exists()
    program = Program(graph, capture_tf.read_weights(b.session, graph), capture_tf.read_state(b.session, graph))
    losses = [program.train_step([x, y], 1e-2) for _ in range(10)]
    assert losses[-1] < 0.5 * losses[0]  # it learns the (fixed) batch


# --------------------------------------------------- language ops: masks, gathers, tied weights


def language_fn(ids, y):  # ids: (2, 5) int32, 0 = padding
    """Padding masks, comparisons, position buckets and gathers, each on batch-dependent values."""
    embed = layers.Embedding(9, 8)
    x = layers.Dense(8)(embed(ids))  # (B, T, C)
    pad = tf.equal(ids, 0)
    keep = tf.logical_not(pad)
    scores = tf.where(pad[:, None, :], -1e9, tf.matmul(x, x, transpose_b=True))  # (B, T, T)
    a = tf.where(keep[..., None], tf.matmul(tf.nn.softmax(scores), x), -x)
    both = tf.logical_or(tf.logical_and(ids > 2, ids <= 6), tf.logical_not(tf.not_equal(ids, 4)))
    b = a * tf.cast(both, tf.float32)[..., None] + tf.math.log1p(tf.abs(x) + 1) + tf.floor(x * 3) * x
    pos = tf.cumsum(tf.cast(keep, tf.int32), axis=1) * tf.cast(keep, tf.int32)
    bucket = tf.minimum(pos // 2, 1) + tf.math.floordiv(pos, 3)
    c = b + embed(bucket)
    positions = tf.constant([[2, 0], [4, 4]]) + tf.reduce_max(ids) * 0  # computed in the graph
    picked = tf.gather(c, positions, axis=1, batch_dims=1)  # (B, 2, C): BERT's masked-position gather
    column = tf.gather(c[..., 0], [4, 1], axis=1)  # (B, 2)
    total = tf.reduce_sum(picked) + tf.reduce_sum(column ** 2) + tf.reduce_sum(tf.one_hot(y, 3) * picked[:, 0, :3])
    lower = tf.linalg.band_part(tf.matmul(c, c, transpose_b=True), -1, 0)  # of a computed matrix
    return total + tf.reduce_mean(tf.cumsum(c, axis=1, exclusive=True, reverse=True)) + tf.reduce_mean(lower), {}


def test_language_ops_lower_to_device_ops_and_match_tf(built_graphs):
    b = built_graphs(language_fn, (2, 5), x_dtype=tf.int32)
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS)
    assert validate(graph, mode="train", profile=None).ok
    assert {"where", "logical_not", "logical_and", "logical_or", "greater", "less_equal", "not_equal", "abs", "log1p",
            "floor", "cumsum", "floor_div", "minimum", "gather", "one_hot"} <= {n.op for n in graph.nodes}
    x = np.array([[3, 5, 8, 0, 0], [1, 4, 6, 7, 2]], np.int32)
    y = np.array([1, 2], np.int32)
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    loss, grads = program.gradients([x, y])
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


def keras_attention_fn(ids, y):  # ids: (2, 5), 0 = padding
    """Keras MultiHeadAttention with a padding mask and a causal mask, and a tied output head."""
    embed = layers.Embedding(9, 8)
    x = embed(ids)
    keep = ids > 0
    h = layers.MultiHeadAttention(2, 4)(x, x, attention_mask=keep[:, None, :] & keep[:, :, None])
    h = h + layers.MultiHeadAttention(2, 4)(h, h, use_causal_mask=True)
    logits = tf.matmul(h, embed.embeddings, transpose_b=True)  # (B, T, 9): the embedding, used twice
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=ids, logits=logits))
    return loss + 0.0 * tf.reduce_sum(tf.cast(y, tf.float32)), {}


def test_keras_attention_with_masks_and_a_tied_embedding_match_tf(built_graphs):
    b = built_graphs(keras_attention_fn, (2, 5), x_dtype=tf.int32)
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS) and "where" in {n.op for n in graph.nodes}
    assert validate(graph, mode="train", profile=None).ok
    assert sum("embeddings" in name for name in graph.params.values()) == 1  # one weight, read twice
    x = np.array([[3, 5, 8, 0, 0], [1, 4, 6, 7, 2]], np.int32)
    y = np.array([1, 2], np.int32)
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    loss, grads = program.gradients([x, y])
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


def test_one_hot_on_an_axis_other_than_the_last_is_refused(built_graphs):
    def model_fn(x, y):
        logits = layers.Dense(3)(x)
        hot = tf.one_hot(y, 3, axis=0)  # <one-hot-axis0>
        return tf.reduce_mean(logits * tf.transpose(hot)), {}

    graph = built_graphs(model_fn, (4, 6)).capture()
    report = validate(graph, mode="train", profile=None)
    assert any(f.line == _line("one-hot-axis0") and "axis=0" in f.message for f in report.errors), report.to_text()


def test_v1_where_with_a_vector_condition_picks_rows_as_tf(built_graphs):
    def model_fn(x, y):  # x: (4, 6)
        h = layers.Dense(3)(x)
        rows = v1.where(y > 0, h, -2.0 * h)  # Select: the (4,) condition picks whole rows
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=rows)), {}

    b = built_graphs(model_fn, (4, 6))
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS) and "where" in {n.op for n in graph.nodes}
    x, y = _batch(np.random.default_rng(5), (4, 6), 3)
    y[:2] = 0  # both branches taken
    loss, grads = Program(graph, capture_tf.read_weights(b.session, graph)).gradients([x, y])
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)


# ---------------------------------------------- integer arithmetic: exact on int64, as TF's

_DIVISOR = np.array([[3, 7, -2], [2, -5, 2**61 - 1]], np.int64)  # signs unlike x's, but for one: trunc is not floor


def integer_fn(x, y):  # x: (2, 3) int64 beyond float64's 53 bits; y: (2,) span positions, some beyond the span
    """A question-answering head's clamp of its span positions (tf.clip_by_value on integers) before its
    loss, and TF's integer arithmetic (each result an output, compared bit for bit)."""
    divisor = tf.constant(_DIVISOR)
    logits = layers.Dense(6)(tf.cast(tf.math.floormod(x, 7), tf.float32))  # (B, 6): a score per position
    positions = tf.clip_by_value(y, 0, 5)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=positions, logits=logits))
    return loss, {"positions": positions, "clip": tf.clip_by_value(x, -(2**62), 2**62 + 1),
                  "minimum": tf.minimum(x, divisor), "maximum": tf.maximum(x, divisor), "floordiv": x // divisor,
                  "floormod": tf.math.floormod(x, divisor), "truncatediv": tf.truncatediv(x, divisor),
                  "truncatemod": tf.truncatemod(x, divisor), "arithmetic": (x // 4) * 3 - divisor + 1}


def test_integer_arithmetic_is_exact_and_clipped_positions_train_as_in_tf(built_graphs):
    b = built_graphs(integer_fn, (2, 3), x_dtype=tf.int64)
    graph = b.capture()
    assert {n.op for n in graph.nodes} <= set(OPS)
    assert validate(graph, mode="train", profile=None).ok
    x = np.array([[2**62 + 3, -(2**62) - 5, 7], [-9, 2**53 + 1, -(2**63)]], np.int64)
    y = np.array([9, -2], np.int32)
    program = Program(graph, capture_tf.read_weights(b.session, graph))
    outputs = program.eval_step([x, y])
    expected = b.run(b.outputs, x, y)
    for name, value in expected.items():  # bit for bit: no float in between
        assert outputs[name].dtype == value.dtype, name
        np.testing.assert_array_equal(outputs[name], value, err_msg=name)
    np.testing.assert_array_equal(outputs["positions"], [5, 0])
    loss, grads = program.gradients([x, y])
    tf_loss, tf_grads = b.run([b.loss, b.grads], x, y)
    _close(loss, tf_loss, 1e-5)
    _close_grads(grads, b.variables, tf_grads, 1e-5)
