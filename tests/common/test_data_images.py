"""common/data/images.py: the framework-neutral readers behind both resnet folders."""

import os

import numpy as np
import pytest

from common.data.images import (digits_arrays, list_image_folder, read_cifar10, resize_by_pooling,
                                write_fake_cifar10, write_fake_image_folder)
from common.errors import UserError


def test_pooling_averages_and_repeating_copies():
    images = np.arange(16, dtype=np.uint8).reshape(1, 4, 4) * 10
    assert resize_by_pooling(images, 2).tolist() == [[[25, 45], [105, 125]]]  # each 2x2 mean, rounded
    assert np.array_equal(resize_by_pooling(images, 8)[0, ::2, ::2], images[0])
    with pytest.raises(UserError, match="divides"):
        resize_by_pooling(images, 3)


def test_digits_keep_labels_and_copy_grey_to_channels():
    images, labels, what = digits_arrays("test", 16, 3)
    assert images.shape == (360, 16, 16, 3) and images.dtype == np.uint8 and labels.shape == (360,)
    assert np.array_equal(images[..., 0], images[..., 1]) and set(labels.tolist()) == set(range(10))
    assert "embedded" in what


@pytest.mark.parametrize("kind", ["python", "binary"])
def test_both_cifar_formats_give_the_same_images(tmp_path, kind):
    write_fake_cifar10(tmp_path / "a", per_batch=6, kind=kind, seed=3)
    images, labels, _ = read_cifar10(str(tmp_path / "a"), "train")
    assert images.shape == (30, 32, 32, 3) and labels.shape == (30,)
    other = "binary" if kind == "python" else "python"
    write_fake_cifar10(tmp_path / "b", per_batch=6, kind=other, seed=3)
    images_b, labels_b, _ = read_cifar10(str(tmp_path / "b"), "train")
    assert np.array_equal(images, images_b) and np.array_equal(labels, labels_b)


def test_missing_cifar_names_the_folder(tmp_path):
    with pytest.raises(UserError, match="cifar-10-batches-py"):
        read_cifar10(str(tmp_path), "test")


def test_binary_cifar_with_a_partial_record(tmp_path):
    folder = write_fake_cifar10(tmp_path, per_batch=2, kind="binary")
    path = os.path.join(folder, "test_batch.bin")
    with open(path, "ab") as f:
        f.write(b"\0" * 7)
    with pytest.raises(UserError, match="test_batch.bin: 6,153 bytes, not a whole number"):
        read_cifar10(str(tmp_path), "test")


def test_image_folder_lists_sorted_classes_and_refuses_an_empty_one(tmp_path):
    write_fake_image_folder(tmp_path, classes=3, per_class=2)
    samples, classes = list_image_folder(str(tmp_path))
    assert classes == ["class_0", "class_1", "class_2"] and [label for _, label in samples] == [0, 0, 1, 1, 2, 2]
    (tmp_path / "class_3").mkdir()
    (tmp_path / "class_3" / "notes.txt").write_text("not an image")
    with pytest.raises(UserError, match="class_3: class folder 'class_3' holds no image"):
        list_image_folder(str(tmp_path))
