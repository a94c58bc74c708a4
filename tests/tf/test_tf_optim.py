"""common/tf/optim.py against numpy references: schedules, update rules, clipping, loss scaling."""

import math
import re

import numpy as np
import pytest
import tensorflow as tf

from common.errors import UserError
from common.params import load_params
from common.summaries import read_scalars
from common.tf.optim import (LEARNING_RATE_COLLECTION, LOSS_SCALE_COLLECTION, LOSS_SCALE_STEPS_COLLECTION,
                             build_optimizer, build_train_op, learning_rate)


def lr_at(spec, steps):
    graph = tf.Graph()
    with graph.as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        lr = learning_rate(spec, step)
        with tf.compat.v1.Session(graph=graph) as session:
            return [float(session.run(lr, {step: s})) for s in steps]


@pytest.mark.parametrize("spec, reference", [
    (0.01, lambda s: 0.01),
    ({"scheduler": "Constant", "learning_rate": 0.5}, lambda s: 0.5),
    ({"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5},
     lambda s: 0.1 * 0.5 ** (s / 10)),
    ({"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5,
      "staircase": True}, lambda s: 0.1 * 0.5 ** (s // 10)),
    ({"scheduler": "PiecewiseConstant", "values": [1.0, 0.5, 0.1], "boundaries": [10, 20]},
     lambda s: 1.0 if s < 10 else 0.5 if s < 20 else 0.1),
    ({"scheduler": "Polynomial", "initial_learning_rate": 1.0, "end_learning_rate": 0.1, "steps": 20, "power": 2.0},
     lambda s: 0.9 * (1 - min(s, 20) / 20) ** 2 + 0.1),
    ({"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0, "steps": 20},
     lambda s: -1.0 * (1 - min(s, 20) / 20) + 1.0),
    ({"scheduler": "Cosine", "initial_learning_rate": 1.0, "alpha": 0.1, "steps": 20},
     lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, 20) / 20))),
    ([{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0, "steps": 10},
      {"scheduler": "Cosine", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 20}],
     lambda s: s / 10 if s < 10 else 0.5 * (1 + math.cos(math.pi * min(s - 10, 20) / 20))),
])
def test_schedules_match_their_formulas(spec, reference):
    steps = [0, 1, 5, 9, 10, 11, 19, 20, 29, 30, 45]
    np.testing.assert_allclose(lr_at(spec, steps), [reference(s) for s in steps], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("spec, message", [
    ({"scheduler": "Warmup"}, "scheduler must be one of"),
    ({"scheduler": "Constant"}, "needs 'learning_rate'"),
    ({"scheduler": "Constant", "learning_rate": 0.1, "decay": 2}, "unknown key 'decay'"),
    ({"scheduler": "PiecewiseConstant", "values": [1.0], "boundaries": [5]}, "one more value than boundaries"),
    ({"scheduler": "Cosine", "initial_learning_rate": 1.0, "steps": 10}, "exactly one of"),
    ([{"scheduler": "Constant", "learning_rate": 0.1}, {"scheduler": "Constant", "learning_rate": 0.2}],
     r"\[0\]: every schedule but the last"),
])
def test_bad_schedules_name_the_key(spec, message):
    with pytest.raises(UserError, match=message):
        lr_at(spec, [0])


def one_step(optimizer, w0, b0, x, y, steps=1, mixed=None):
    """Train a linear regression (B, 3) @ (3, 2) + (2,) with build_train_op; returns (w, b, losses)."""
    params = load_params(None, {"optimizer": optimizer, **({"mixed_precision": mixed} if mixed else {})})
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(w0, name="dense/kernel")
        b = tf.compat.v1.Variable(b0, name="dense/bias")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        train_op = build_train_op(loss, params)
        session = tf.compat.v1.Session(graph=graph)
        session.run(tf.compat.v1.global_variables_initializer())
        losses = [session.run([train_op, loss])[1] for _ in range(steps)]
        w_value, b_value = session.run([w, b])
        scale = graph.get_collection("zoo_loss_scale")
        scale_value = session.run(scale[0]) if scale else None
        session.close()
    return w_value, b_value, losses, scale_value


@pytest.fixture
def problem():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=(2,)).astype(np.float32),
            rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4, 2)).astype(np.float32))


def gradients(w, b, x, y):
    error = x @ w + b - y  # (B, 2)
    scale = 2.0 / error.size
    return scale * x.T @ error, scale * error.sum(axis=0)


def test_sgd_with_coupled_weight_decay_and_norm_clipping(problem):
    w0, b0, x, y = problem
    w, b, _, _ = one_step({"optimizer_type": "sgd", "learning_rate": 0.1, "weight_decay": 0.5,
                           "max_gradient_norm": 0.05}, w0, b0, x, y)
    gw, gb = gradients(w0, b0, x, y)
    # clipped first, then L2 on the clipped kernel gradient (device/optimizer.py's order, as
    # torch.optim); the bias is excluded ("bias" in its name)
    norm = math.sqrt((gw ** 2).sum() + (gb ** 2).sum())
    factor = min(1.0, 0.05 / norm)
    assert factor < 1.0  # the clip acts, so the order shows
    np.testing.assert_allclose(w, w0 - 0.1 * (factor * gw + 0.5 * w0), rtol=1e-5)
    np.testing.assert_allclose(b, b0 - 0.1 * factor * gb, rtol=1e-5)


def test_nesterov_momentum(problem):
    w0, b0, x, y = problem
    w, _, _, _ = one_step({"optimizer_type": "momentum", "learning_rate": 0.1, "momentum": 0.9, "nesterov": True},
                          w0, b0, x, y, steps=2)
    ref_w, ref_b, accum_w, accum_b = w0.copy(), b0.copy(), 0.0, 0.0
    for _ in range(2):
        gw, gb = gradients(ref_w, ref_b, x, y)
        accum_w, accum_b = 0.9 * accum_w + gw, 0.9 * accum_b + gb
        ref_w, ref_b = ref_w - 0.1 * (gw + 0.9 * accum_w), ref_b - 0.1 * (gb + 0.9 * accum_b)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5)


def test_adamw_decays_decoupled_and_skips_biases(problem):
    w0, b0, x, y = problem
    lr, wd = 0.01, 0.1
    w, b, _, _ = one_step({"optimizer_type": "adamw", "learning_rate": lr, "weight_decay": wd}, w0, b0, x, y)
    gw, gb = gradients(w0, b0, x, y)
    # Adam's first step moves each weight by lr * g / (|g| + eps'), i.e. lr * sign(g)
    adam = lambda g: lr * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(w, w0 * (1 - lr * wd) - adam(gw), rtol=1e-4)
    np.testing.assert_allclose(b, b0 - adam(gb), rtol=1e-4)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_adam_follows_its_betas_and_epsilon(problem, kind):
    """Three steps against TF's Adam written out in numpy (lr_t = lr sqrt(1 - b2^t) / (1 - b1^t),
    eps added to sqrt(v)). Betas and an epsilon far from the defaults: with the defaults, or on
    the first step, every step would be about lr x sign(g) whatever they are."""
    w0, b0, x, y = problem
    b1, b2, eps, lr, wd = 0.5, 0.7, 0.05, 0.1, 0.2
    w, b, _, _ = one_step({"optimizer_type": kind, "learning_rate": lr, "beta1": b1, "beta2": b2, "epsilon": eps,
                           "weight_decay": wd}, w0, b0, x, y, steps=3)
    ref_w, ref_b = w0.astype(np.float64), b0.astype(np.float64)
    slots = {"w": [0.0, 0.0], "b": [0.0, 0.0]}
    for t in range(1, 4):
        gw, gb = gradients(ref_w, ref_b, x, y)
        if kind == "adam":
            gw = gw + wd * ref_w  # coupled L2 on the kernel; the bias is excluded ("bias" in its name)
        else:
            ref_w = ref_w * (1 - lr * wd)  # decoupled, before the update
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for name, g in (("w", gw), ("b", gb)):
            m, v = slots[name]
            slots[name] = [b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g]
        ref_w = ref_w - lr_t * slots["w"][0] / (np.sqrt(slots["w"][1]) + eps)
        ref_b = ref_b - lr_t * slots["b"][0] / (np.sqrt(slots["b"][1]) + eps)
    np.testing.assert_allclose(w, ref_w, rtol=1e-5)
    np.testing.assert_allclose(b, ref_b, rtol=1e-5)


def _sgd_params(scaling):
    """SGD at 0.1; with ``scaling`` (a factor or "dynamic"), loss scaling in bfloat16 mixed precision."""
    optimizer = {"optimizer_type": "sgd", "learning_rate": 0.1}
    mixed = {}
    if scaling is not None:
        optimizer["loss_scaling_factor"] = scaling
        mixed = {"mixed_precision": {"enabled": True, "dtype": "bfloat16"}}
    return load_params(None, {"optimizer": optimizer, **mixed})


@pytest.mark.parametrize("scaling", [None, 128.0, "dynamic"])
def test_the_train_op_steps_its_global_step_and_trains_only_var_list(problem, scaling):
    """The global step and var_list given are the ones used; the learning rate and loss scale
    are in their collections for the runner; the scale and its counter are not trained."""
    w0, b0, x, y = problem
    params = _sgd_params(scaling)
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(w0, name="dense/kernel")
        b = tf.compat.v1.Variable(b0, name="dense/bias")
        step = tf.compat.v1.Variable(0, dtype=tf.int64, trainable=False, name="my_step")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        train_op = build_train_op(loss, params, global_step=step, var_list=[w])  # b stays
        assert tf.compat.v1.trainable_variables() == [w, b]
        (lr,) = graph.get_collection(LEARNING_RATE_COLLECTION)
        scales = graph.get_collection(LOSS_SCALE_COLLECTION)
        counters = graph.get_collection(LOSS_SCALE_STEPS_COLLECTION)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(3):
                session.run(train_op)
            assert session.run(step) == 3 and session.run(lr) == pytest.approx(0.1)
            np.testing.assert_array_equal(session.run(b), b0)
            assert not np.array_equal(session.run(w), w0)
            if scaling is None:
                assert scales == [] and counters == []
            elif scaling == "dynamic":  # float32 scale, int64 count: the names the checkpoints hold
                assert [(v.op.name, v.dtype.base_dtype) for v in scales + counters] == [
                    ("loss_scale", tf.float32), ("loss_scale_good_steps", tf.int64)]
                assert session.run(scales[0]) == 32768.0 and session.run(counters[0]) == 3
            else:
                assert session.run(scales[0]) == 128.0 and counters == []


def test_adamw_decays_reference_variables_too(problem):
    """TF1 reference variables go through _apply_dense, resource variables through
    _resource_apply_dense: both decay and update alike."""
    w0, b0, x, y = problem
    params = load_params(None, {"optimizer": {"optimizer_type": "adamw", "learning_rate": 0.1,
                                              "weight_decay": 0.5}})
    results = []
    for use_resource in (True, False):
        graph = tf.Graph()
        with graph.as_default():
            w = tf.compat.v1.Variable(w0, name="dense/kernel", use_resource=use_resource)
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
            train_op = build_train_op(loss, params)
            with tf.compat.v1.Session(graph=graph) as session:
                session.run(tf.compat.v1.global_variables_initializer())
                session.run(train_op)
                results.append(session.run(w))
    gw = 2.0 / y.size * x.T @ (x @ w0 - y)
    np.testing.assert_allclose(results[0], w0 * (1 - 0.1 * 0.5) - 0.1 * np.sign(gw), rtol=1e-4)
    np.testing.assert_allclose(results[1], results[0], rtol=1e-6)  # TF's two kernels round alike but for an ulp


@pytest.mark.parametrize("case, message", [
    ("no variables", "optimizer: the model has no trainable variables"),
    ("loss of none", "optimizer: the loss depends on none of the trainable variables"),
    ("unknown type", "optimizer.optimizer_type must be one of sgd, momentum, adam, adamw, got 'lamb'"),
])
def test_train_op_errors_are_user_errors(case, message):
    params = load_params(None, {})
    with tf.Graph().as_default(), pytest.raises(UserError) as error:
        if case == "unknown type":  # params refuse it first; a mapping built by hand gets this
            build_optimizer({**params["optimizer"], "optimizer_type": "lamb"}, tf.constant(0.1))
        elif case == "no variables":
            build_train_op(tf.constant(1.0), params)
        else:
            tf.compat.v1.Variable(1.0, name="unused")
            build_train_op(tf.constant(1.0), params)
    assert str(error.value) == message


def test_value_clipping(problem):
    w0, b0, x, y = problem
    w, _, _, _ = one_step({"optimizer_type": "sgd", "learning_rate": 1.0, "max_gradient_value": 0.01},
                          w0, b0, x, y)
    gw, _ = gradients(w0, b0, x, y)
    np.testing.assert_allclose(w, w0 - np.clip(gw, -0.01, 0.01), rtol=1e-5)


def test_static_loss_scaling_gives_the_unscaled_update(problem):
    w0, b0, x, y = problem
    mixed = {"enabled": True, "dtype": "bfloat16"}
    w, _, _, scale = one_step({"optimizer_type": "sgd", "learning_rate": 0.1, "loss_scaling_factor": 128.0},
                              w0, b0, x, y, mixed=mixed)
    gw, _ = gradients(w0, b0, x, y)
    np.testing.assert_allclose(w, w0 - 0.1 * gw, rtol=1e-5)
    assert scale == 128.0


def test_dynamic_loss_scaling_skips_overflow_and_grows(problem):
    w0, b0, x, y = problem
    mixed = {"enabled": True, "dtype": "bfloat16"}
    optimizer = {"optimizer_type": "sgd", "learning_rate": 0.1, "loss_scaling_factor": "dynamic",
                 "initial_loss_scale": 3.0e38, "steps_per_increase": 2}
    # the first scaled loss overflows float32: the update is skipped and the scale halves, until finite
    w, _, _, scale = one_step(optimizer, w0, b0, x * 1e3, y, mixed=mixed)
    np.testing.assert_array_equal(w, w0)
    assert scale == pytest.approx(1.5e38)
    w, _, _, scale = one_step({**optimizer, "initial_loss_scale": 4.0}, w0, b0, x, y, steps=4, mixed=mixed)
    assert scale == 16.0  # doubled after every 2 finite steps
    assert not np.array_equal(w, w0)


def test_mixed_bfloat16_trains_tf_mnist(tf_mnist, tiny_args, tmp_path):
    tf_mnist.main(tiny_args("mixed_precision.enabled=true", "optimizer.loss_scaling_factor=dynamic",
                            "runconfig.max_steps=6", "model.dropout=0.0", "optimizer.learning_rate=0.01"))
    scalars = read_scalars(str(tmp_path / "model" / "train"))
    losses = [v for _, v in scalars["loss"]]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert scalars["loss_scale"][0][1] == 32768.0


def test_float16_is_refused_on_the_cpu(tf_mnist, tiny_args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tf_mnist.main(tiny_args("mixed_precision.enabled=true", "mixed_precision.dtype=float16"))
    assert exit_info.value.code == 2
    assert "float16 needs --device gpu" in capsys.readouterr().err


@pytest.mark.parametrize("use_resource", [True, False])
def test_adamw_decays_a_gathered_table_whole(use_resource):
    """An embedding table read by a gather gets a sparse gradient (IndexedSlices); AdamW still
    decays every row, as torch.optim.AdamW does: rows read by the step move by the decay and
    Adam's first step (lr * sign(g)), the others by the decay alone."""
    params = load_params(None, {"optimizer": {"optimizer_type": "adamw", "learning_rate": 0.1,
                                              "weight_decay": 0.5}})
    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.Variable(np.ones((6, 3), np.float32), name="embedding", use_resource=use_resource)
        loss = tf.reduce_sum(tf.gather(table, [0, 1, 1]))
        train_op = build_train_op(loss, params)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            after = session.run(table)
    expected = np.full((6, 3), 1 - 0.1 * 0.5, np.float32)
    expected[:2] -= 0.1
    np.testing.assert_allclose(after, expected, rtol=1e-6)


@pytest.mark.parametrize("has_strategy, cross_replica, expected", [
    (False, False, 1),  # no strategy: the default context
    (True, True, 1),  # a strategy's cross-replica context (its scope, outside a replica)
    (True, False, 2),  # a replica of a strategy of 2
])
def test_replicas_count_only_inside_a_replica_of_a_strategy(monkeypatch, has_strategy, cross_replica, expected):
    from common.tf.optim import in_replica_of_several

    class Strategy:
        num_replicas_in_sync = 2

    # the logical CPUs of a real MirroredStrategy of 2 must be set before TF starts (test_tf_distributed.py
    # runs those in a subprocess): here the three contexts are stated as tf.distribute reports them
    monkeypatch.setattr(tf.distribute, "has_strategy", lambda: has_strategy)
    monkeypatch.setattr(tf.distribute, "in_cross_replica_context", lambda: cross_replica)
    monkeypatch.setattr(tf.distribute, "get_strategy", lambda: Strategy())
    assert in_replica_of_several() == expected


@pytest.mark.parametrize("scaling", [None, 128.0, "dynamic"])
def test_loss_scaling_is_refused_in_a_replica_of_two(monkeypatch, scaling):
    # loss scaling's tf.cond around the update cannot be shared by replicas: refused from 2 replicas on
    monkeypatch.setattr("common.tf.optim.in_replica_of_several", lambda: 2)
    params = _sgd_params(scaling)
    with tf.Graph().as_default():
        w = tf.compat.v1.Variable(1.0, name="w")
        if scaling is None:  # without loss scaling the replicas train (the default context's all-reduce here)
            assert isinstance(build_train_op(w * w, params), tf.Operation)
            return
        with pytest.raises(UserError) as error:
            build_train_op(w * w, params)
    assert str(error.value) == (
        f"optimizer.loss_scaling_factor={scaling!r} with runconfig.train_distribute: loss scaling skips steps with "
        "a tf.cond around the update, which the replicas cannot share; train data parallel in bfloat16 or float32")


@pytest.mark.parametrize("scaling", [128, "dynamic"])
def test_loss_scale_is_a_float32_named_loss_scale_from_whole_numbers(problem, scaling):
    # whole numbers in the params (a fixed 128, an initial 1024) still give a float32 scale, which the
    # dynamic update halves and doubles; its name is the one a graph viewer and a checkpoint show
    w0, b0, x, y = problem
    optimizer = {"optimizer_type": "sgd", "learning_rate": 0.1, "loss_scaling_factor": scaling,
                 "initial_loss_scale": 1024}
    params = load_params(None, {"optimizer": optimizer, "mixed_precision": {"enabled": True, "dtype": "bfloat16"}})
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(w0, name="dense/kernel")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        train_op = build_train_op(loss, params)
        (scale,) = graph.get_collection(LOSS_SCALE_COLLECTION)
        assert (scale.op.name, scale.dtype.base_dtype) == ("loss_scale", tf.float32)
        assert train_op.name == "train_op"  # the step's group, as the graph shows it
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(train_op)
            assert session.run(scale) == (128.0 if scaling == 128 else 1024.0)


def test_a_replica_sums_the_replicas_gradients_and_hands_in_its_share(monkeypatch, problem):
    # two replicas of the same batch: the all-reduce adds their gradients up (2 g), and each replica
    # hands 1/2 of that to apply_gradients, whose merge adds the replicas up once more (here one
    # device, no merge): one step of plain SGD with the gradient g
    w0, b0, x, y = problem

    class TwoReplicas:
        def all_reduce(self, reduce_op, value):
            assert reduce_op == tf.distribute.ReduceOp.SUM
            return [g + g for g in value]

    monkeypatch.setattr("common.tf.optim.in_replica_of_several", lambda: 2)
    monkeypatch.setattr(tf.distribute, "get_replica_context", lambda: TwoReplicas())
    w, b, _, _ = one_step({"optimizer_type": "sgd", "learning_rate": 0.1}, w0, b0, x, y)
    gw, gb = gradients(w0, b0, x, y)
    np.testing.assert_allclose(w, w0 - 0.1 * gw, rtol=1e-5)
    np.testing.assert_allclose(b, b0 - 0.1 * gb, rtol=1e-5)


def test_a_constant_or_piecewise_learning_rate_after_a_warmup():
    # constant and piecewise segments are float64 as the others, so that tf.where can switch from one to the
    # next; at its start step (10) the next segment has taken over
    warmup = {"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1.0, "steps": 10}
    constant = [warmup, {"scheduler": "Constant", "learning_rate": 0.25}]
    np.testing.assert_allclose(lr_at(constant, [0, 5, 9, 10, 30]), [0.0, 0.5, 0.9, 0.25, 0.25], rtol=1e-6)
    piecewise = [warmup, {"scheduler": "PiecewiseConstant", "values": [0.5, 0.1], "boundaries": [5]}]
    np.testing.assert_allclose(lr_at(piecewise, [9, 10, 14, 15]), [0.9, 0.5, 0.5, 0.1], rtol=1e-6)


def test_the_learning_rate_tensor_and_the_key_its_errors_name():
    with tf.Graph().as_default():
        assert learning_rate(0.1, tf.constant(0, tf.int64)).name == "learning_rate:0"  # found by name in the graph
        with pytest.raises(UserError) as error:
            learning_rate({"scheduler": "Constant"}, tf.constant(0, tf.int64))
        assert str(error.value) == "optimizer.learning_rate: scheduler Constant needs 'learning_rate'"
        with pytest.raises(UserError) as error:
            learning_rate({"scheduler": "Constant"}, tf.constant(0, tf.int64), "model.lr")
        assert str(error.value) == "model.lr: scheduler Constant needs 'learning_rate'"


@pytest.mark.parametrize("use_resource", [True, False])
def test_adamw_decays_after_the_gradient_and_before_its_update(problem, use_resource):
    """The decay waits for the gradient (the whole forward pass, so no read of this step sees the
    decayed weight: else the loss would race the decay), and Adam's update waits for the decay."""
    w0, _, x, y = problem
    params = load_params(None, {"optimizer": {"optimizer_type": "adamw", "weight_decay": 0.5}})
    graph = tf.Graph()
    with graph.as_default():
        w = tf.compat.v1.Variable(w0, name="dense/kernel", use_resource=use_resource)
        build_train_op(tf.reduce_mean(tf.square(tf.matmul(x, w) - y)), params)
    decay_type, apply_type = ("AssignSubVariableOp", "ResourceApplyAdam") if use_resource else ("AssignSub", "ApplyAdam")
    [decay] = [op for op in graph.get_operations() if op.type == decay_type]
    [apply] = [op for op in graph.get_operations() if op.type == apply_type]
    grad = apply.inputs[9].op  # Adam's inputs: var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad
    assert grad in _runs_after(decay) and decay in _runs_after(apply)


def _runs_after(op):
    """The ops ``op`` waits for: its inputs' and control inputs' ops, transitively."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for before in [t.op for t in current.inputs] + list(current.control_inputs):
            if before not in seen:
                seen.add(before)
                todo.append(before)
    return seen


def test_check_finite_checks_the_loss_before_any_gradient_and_keeps_sparse_gradients_whole():
    from common.tf.optim import NON_FINITE, check_finite

    graph = tf.Graph()
    with graph.as_default():
        table = tf.compat.v1.Variable(np.ones((4, 2), np.float32), name="table")
        w = tf.compat.v1.Variable(np.ones((2,), np.float32), name="w")
        loss = tf.reduce_sum(tf.gather(table, [0, 2, 2]) * w)
        grads = tf.compat.v1.gradients(loss, [table, w])
        assert isinstance(grads[0], tf.IndexedSlices)
        checked = check_finite(loss, grads, [table, w])
        [loss_check] = [op for op in graph.get_operations()
                        if op.type == "CheckNumerics" and op.inputs[0] is loss]
        for g in (checked[0].values, checked[1]):  # every gradient's check waits for the loss's
            assert loss_check in _runs_after(g.op)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            dense = session.run(tf.convert_to_tensor(checked[0]))  # the rows, their indices, the table's shape
            np.testing.assert_array_equal(dense, [[1, 1], [0, 0], [2, 2], [0, 0]])
            np.testing.assert_array_equal(session.run(checked[1]), [3, 3])
            session.run(w.assign([np.nan, 1.0]))
            with pytest.raises(tf.errors.InvalidArgumentError, match=re.escape(f"{NON_FINITE}the loss")):
                session.run(checked[1])
