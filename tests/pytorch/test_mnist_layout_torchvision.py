"""torchvision's MNIST reads the layout common.data writes, with no download."""

import gzip
from pathlib import Path

import numpy as np
import pytest

torchvision = pytest.importorskip("torchvision")

from common.data.mnist import (  # noqa: E402  (after the importorskip)
    MNIST_FILES,
    load_mnist_arrays,
    prepare_mnist,
    resolve_mnist,
    write_fake_mnist,
)


@pytest.mark.parametrize("split", ["train", "test"])
def test_torchvision_reads_fake_mnist(tmp_path, split):
    location = write_fake_mnist(tmp_path, 20, 10, seed=0)
    dataset = torchvision.datasets.MNIST(location.root, train=split == "train", download=False)
    images, labels = load_mnist_arrays(location, split)
    assert len(dataset) == len(labels)
    np.testing.assert_array_equal(dataset.data.numpy(), images)
    np.testing.assert_array_equal(dataset.targets.numpy(), labels)
    image, label = dataset[3]
    assert image.size == (28, 28) and label == labels[3]


def test_torchvision_reads_prepared_mnist(tmp_path):
    fake = write_fake_mnist(tmp_path / "fake", 20, 10, seed=1)
    source = tmp_path / "downloads"
    source.mkdir()
    for name in MNIST_FILES["train"] + MNIST_FILES["test"]:
        (source / f"{name}.gz").write_bytes(gzip.compress((Path(fake.raw_dir) / name).read_bytes()))
    prepare_mnist(str(source), str(tmp_path / "data"))
    location = resolve_mnist(str(tmp_path / "data"), "mnist")
    dataset = torchvision.datasets.MNIST(location.root, train=False, download=False)
    np.testing.assert_array_equal(dataset.data.numpy(), load_mnist_arrays(fake, "test")[0])


def test_torchvision_reads_embedded_digits():
    location = resolve_mnist("", "uci_digits")
    train = torchvision.datasets.MNIST(location.root, train=True, download=False)
    test = torchvision.datasets.MNIST(location.root, train=False, download=False)
    assert (len(train), len(test)) == (1437, 360)
    assert sorted(test.targets.unique().tolist()) == list(range(10))
