"""One list of the optimizers the device runs (device/optimizer.py FRAMEWORK_OPTIMIZERS): each
framework class in it is read by its frontend, a class outside it is refused there, and the
porting assistant accepts exactly the list."""

import importlib.util

import pytest

from common.port.static import SUPPORTED_OPTIMIZERS
from device.optimizer import FRAMEWORK_OPTIMIZERS, KINDS
from zoo_base.errors import UserError


def test_the_porting_assistant_accepts_the_devices_list():
    assert SUPPORTED_OPTIMIZERS == {name for names in FRAMEWORK_OPTIMIZERS.values() for name in names}
    assert FRAMEWORK_OPTIMIZERS["optimizer_type"] == KINDS  # what params' optimizer_type takes


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_each_torch_class_is_read_and_another_refused():
    import torch

    from device.capture.torch.optimizer import optimizer_spec

    module = torch.nn.Linear(3, 2)
    kinds = {name: optimizer_spec(getattr(torch.optim, name)(module.parameters(), lr=0.1), module).kind
             for name in FRAMEWORK_OPTIMIZERS["torch"]}
    assert kinds == {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw"}
    with pytest.raises(UserError, match="optimizer RMSprop is not supported on the device; supported: SGD, Adam, AdamW"):
        optimizer_spec(torch.optim.RMSprop(module.parameters(), lr=0.1), module)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="tensorflow not installed")
def test_each_tf_class_is_read_and_another_refused():
    import numpy as np
    import tensorflow as tf

    from device.capture import tf as capture_tf

    v1 = tf.compat.v1

    def kind(make):
        graph = tf.Graph()
        with graph.as_default():
            x = v1.placeholder(tf.float32, (4, 3))
            w = v1.get_variable("w", (3, 2), initializer=v1.constant_initializer(np.ones((3, 2), np.float32)))
            loss = tf.reduce_mean(tf.matmul(x, w) ** 2)
            train_op = make().minimize(loss, v1.train.get_or_create_global_step())
            return capture_tf.capture(graph, inputs=[x], loss=loss, train_op=train_op).optimizer.kind

    made = {"GradientDescentOptimizer": lambda: v1.train.GradientDescentOptimizer(0.1),
            "MomentumOptimizer": lambda: v1.train.MomentumOptimizer(0.1, 0.9),
            "AdamOptimizer": lambda: v1.train.AdamOptimizer(0.1)}
    assert set(made) == set(FRAMEWORK_OPTIMIZERS["tf"])
    assert {name: kind(make) for name, make in made.items()} == \
        {"GradientDescentOptimizer": "sgd", "MomentumOptimizer": "momentum", "AdamOptimizer": "adam"}
    with pytest.raises(UserError, match="ResourceApplyAdagrad"):
        kind(lambda: v1.train.AdagradOptimizer(0.1))
