"""datasets/prepare_tfds_mnist.py writes tfds's mnist from the embedded digits: tfds.load reads
it offline, as the vendor's TF folders call it."""

import importlib.util
import os

import numpy as np
import pytest

from common.data import embedded_digits, load_mnist_arrays

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
tfds = pytest.importorskip("tensorflow_datasets")


def _script():
    spec = importlib.util.spec_from_file_location("prepare_tfds_mnist",
                                                  os.path.join(ROOT, "datasets", "prepare_tfds_mnist.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tfds_load_reads_the_embedded_digits_without_a_download(tmp_path, capsys):
    script = _script()
    assert script.main(["--data_dir", str(tmp_path)]) == 0
    assert f"{tmp_path}/mnist: test 360 examples" in capsys.readouterr().out
    data, info = tfds.load("mnist", data_dir=str(tmp_path), with_info=True, download=False)
    assert info.splits["test"].num_examples == 360
    images, labels = load_mnist_arrays(embedded_digits(), "test")
    read = sorted((int(e["label"]), e["image"].numpy().tobytes()) for e in data["test"])
    assert read == sorted((int(label), image[..., None].tobytes()) for image, label in zip(images, labels))
    assert next(iter(data["train"]))["image"].dtype == np.uint8
    assert script.main(["--data_dir", str(tmp_path)]) == 2
    assert "exists: remove it first" in capsys.readouterr().err
