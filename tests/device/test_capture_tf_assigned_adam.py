"""An Adam written out in TF ops (BERT's AdamWeightDecay, as the vendor's TF AdamW is) on the
emulator, and learning-rate schedules of a user's own optimizer read at every step.

``BertStyleAdam`` below is written here from the update rule (device/capture/tf/optimizer.py's
docstring): assignments of the weight and its two slots, the decay added to the step, an
optional bias correction from beta-power variables updated after the step.
"""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.errors import UserError  # noqa: E402
from device.capture import tf as capture_tf  # noqa: E402
from device.runtime.program import Program  # noqa: E402

v1 = tf.compat.v1


class BertStyleAdam(v1.train.Optimizer):
    """Adam with the weight decay added to the step, in plain TF ops (no Apply kernel)."""

    def __init__(self, learning_rate, weight_decay=0.0, beta1=0.9, beta2=0.999, epsilon=1e-6,
                 bias_correction=False, exclude=(), name="AdamW"):
        super().__init__(False, name)
        self.lr, self.wd, self.b1, self.b2, self.eps = learning_rate, weight_decay, beta1, beta2, epsilon
        self.bias_correction, self.exclude = bias_correction, exclude

    def _create_slots(self, var_list):
        if self.bias_correction:
            first = min(var_list, key=lambda var: var.name)
            self._create_non_slot_variable(initial_value=self.b1, name="beta1_power", colocate_with=first)
            self._create_non_slot_variable(initial_value=self.b2, name="beta2_power", colocate_with=first)
        for var in var_list:
            self._zeros_slot(var, "m", self._name)
            self._zeros_slot(var, "v", self._name)

    def _powers(self):
        graph = v1.get_default_graph()
        return (self._get_non_slot_variable("beta1_power", graph=graph),
                self._get_non_slot_variable("beta2_power", graph=graph))

    def _resource_apply_dense(self, grad, var):
        m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
        next_m = tf.multiply(self.b1, m) + tf.multiply(1.0 - self.b1, grad)
        next_v = tf.multiply(self.b2, v) + tf.multiply(1.0 - self.b2, tf.square(grad))
        update = next_m / (tf.sqrt(next_v) + self.eps)
        if self.bias_correction:
            b1_power, b2_power = self._powers()
            update *= tf.sqrt(1.0 - b2_power) / (1.0 - b1_power)
        if self.wd and not any(word in var.op.name for word in self.exclude):
            update += self.wd * var
        return tf.group(var.assign(var - self.lr * update), m.assign(next_m), v.assign(next_v))

    def _finish(self, update_ops, name_scope):
        if not self.bias_correction:
            return tf.group(update_ops)
        b1_power, b2_power = self._powers()
        with tf.control_dependencies(update_ops):
            return tf.group(*update_ops, b1_power.assign(b1_power * self.b1),
                            b2_power.assign(b2_power * self.b2), name=name_scope)


class PlainSgdAssigned(BertStyleAdam):
    """A written-out update the device does not read as an optimizer (var -= lr * g)."""

    def _resource_apply_dense(self, grad, var):
        return var.assign(var - self.lr * grad)


class Mlp:
    """features (8, 6) -> 16 tanh -> 3 logits, its loss, ``optimizer.minimize`` and a session."""

    def __init__(self, make_optimizer, seed=0):
        self.graph = tf.Graph()
        with self.graph.as_default():
            v1.set_random_seed(seed)
            self.x = v1.placeholder(tf.float32, (8, 6), name="features")
            self.y = v1.placeholder(tf.int32, (8,), name="labels")
            init = v1.random_normal_initializer(stddev=0.5, seed=seed)
            w1 = v1.get_variable("dense/kernel", (6, 16), initializer=init)
            b1 = v1.get_variable("dense/bias", (16,), initializer=init)
            w2 = v1.get_variable("out/kernel", (16, 3), initializer=init)
            logits = tf.matmul(tf.tanh(tf.matmul(self.x, w1) + b1), w2)
            self.loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.y, logits=logits))
            self.global_step = v1.train.get_or_create_global_step()
            self.train_op = make_optimizer(self.global_step).minimize(self.loss, self.global_step)
            self.session = v1.Session(graph=self.graph)
            self.session.run(v1.global_variables_initializer())

    def capture(self):
        return capture_tf.capture(self.graph, inputs=[self.x, self.y], loss=self.loss, train_op=self.train_op,
                                  session=self.session)


def _batches(count):
    rng = np.random.default_rng(3)
    return [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 3, 8).astype(np.int32))
            for _ in range(count)]


@pytest.mark.parametrize("bias_correction", [False, True])
def test_bert_style_adam_is_read_and_trains_as_tf_does(bias_correction):
    """Ten steps under an exponential-decay schedule: the emulator's losses and weights are
    TF's to float32 rounding; the schedule is read at every step, not frozen at capture."""
    def make(step):
        lr = v1.train.exponential_decay(0.05, step, 2, 0.5)
        return BertStyleAdam(lr, weight_decay=0.1, beta1=0.8, beta2=0.99, bias_correction=bias_correction,
                             exclude=("bias",))
    model = Mlp(make)
    graph = model.capture()
    spec = graph.optimizer
    assert (spec.kind, spec.form, spec.semantics) == ("adamw", "bert", "tf")
    assert spec.hyper == {"beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.1,
                          "bias_correction": float(bias_correction)}  # no "lr": a schedule
    assert spec.weight_decay_exclude == ("dense/bias",)
    lr_tensor = capture_tf.learning_rate(model.graph, model.train_op, graph)
    assert lr_tensor is not None
    slots = capture_tf.optimizer_slots(model.graph, graph)
    assert slots["out/kernel"] == {"m": "out/kernel/AdamW", "v": "out/kernel/AdamW_1"}

    program = Program(graph, capture_tf.read_weights(model.session, graph))
    rates = []
    for x, y in _batches(10):
        lr = model.session.run(lr_tensor)
        rates.append(float(lr))
        tf_loss, _ = model.session.run([model.loss, model.train_op], {model.x: x, model.y: y})
        assert program.train_step([x, y], float(lr)) == pytest.approx(float(tf_loss), rel=1e-5)
    assert rates[0] == pytest.approx(0.05) and rates[-1] == pytest.approx(0.05 * 0.5 ** 4.5)
    tf_weights = capture_tf.read_weights(model.session, graph)
    for name, value in program.get_weights().items():
        np.testing.assert_allclose(value, tf_weights[name], rtol=1e-5, atol=1e-6)
    if bias_correction:  # the step count comes back from the beta powers, as TF's Adam's
        assert capture_tf.read_optimizer_state(model.session, graph)["step"] == 10


def test_the_decay_term_is_what_makes_it_adamw():
    graph = Mlp(lambda step: BertStyleAdam(0.01)).capture()
    assert (graph.optimizer.kind, graph.optimizer.form, graph.optimizer.hyper["lr"]) == ("adam", "bert", 0.01)


def test_another_written_out_update_is_refused_naming_the_variable():
    model = Mlp(lambda step: PlainSgdAssigned(0.1))
    with pytest.raises(UserError, match=r"assigns 'dense/bias' with ops the device does not read as an optimizer"):
        model.capture()


def test_a_schedule_of_the_users_apply_adam_is_read_every_step():
    """Before: capture with a session froze the schedule at its first value."""
    model = Mlp(lambda step: v1.train.AdamOptimizer(v1.train.exponential_decay(0.05, step, 1, 0.5)))
    graph = model.capture()
    assert "lr" not in graph.optimizer.hyper
    lr_tensor = capture_tf.learning_rate(model.graph, model.train_op, graph)
    program = Program(graph, capture_tf.read_weights(model.session, graph))
    for x, y in _batches(4):
        lr = float(model.session.run(lr_tensor))
        tf_loss, _ = model.session.run([model.loss, model.train_op], {model.x: x, model.y: y})
        assert program.train_step([x, y], lr) == pytest.approx(float(tf_loss), rel=1e-5)
    assert lr == pytest.approx(0.05 / 8)


def test_two_learning_rates_are_refused():
    class TwoRates:
        def minimize(self, loss, step):
            variables = v1.trainable_variables()
            return tf.group(v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=variables[:1]),
                            v1.train.GradientDescentOptimizer(0.2).minimize(loss, step, var_list=variables[1:]))
    with pytest.raises(UserError, match="2 different learning rates; the device runs one"):
        Mlp(lambda step: TwoRates()).capture()
