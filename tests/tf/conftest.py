"""Fixtures of the TF-side tests: generated MNIST files and tf/mnist's run module.

The tests run tf/mnist's ``main(argv)`` in this process (one TensorFlow import for all)
on small generated IDX files; never the network.
"""

import os

import pytest

from common.data import write_fake_mnist
from common.folder import load_run_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TF_MNIST = os.path.join(ROOT, "tf", "mnist")
TINY = os.path.join(TF_MNIST, "configs", "params_tiny.yaml")


@pytest.fixture(scope="session")
def mnist_dir(tmp_path_factory):
    """A data_dir holding MNIST/raw with 320 training and 96 test images (10 separable blobs)."""
    folder = tmp_path_factory.mktemp("mnist")
    write_fake_mnist(folder, n_train=320, n_test=96, seed=0)
    return str(folder)


@pytest.fixture(scope="session")
def tf_mnist():
    return load_run_module(TF_MNIST)


@pytest.fixture
def tiny_args(mnist_dir, tmp_path):
    """argv for tf/mnist's tiny config on the generated data, writing into tmp_path/model."""

    def args(*extra, model_dir=None):
        return ["--params", TINY, "--model_dir", str(model_dir or tmp_path / "model"),
                f"train_input.data_dir={mnist_dir}", f"eval_input.data_dir={mnist_dir}",
                "train_input.dataset=mnist", "eval_input.dataset=mnist", *extra]

    return args
