"""Segmentation TFRecords for the vendor's TF unet (common/data/vendor/unet.py, ``zoo prepare vendor_unet``):
each split read back as the vendor's DAGM2007TFRecordsDataset reads it (``<dataset_path>/train/train-*.tfrecords``
and ``test/test-*.tfrecords``, each record parsed as FixedLenSequenceFeature(image_shape, float32) and squeezed)
and compared with the canvases it was written from."""

import os
import subprocess
import sys

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from common.data.segmentation import digit_canvases  # noqa: E402
from common.data.vendor.unet import prepare_vendor_unet  # noqa: E402
from common.errors import UserError  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZE, DIGITS, DIGIT_SIZE = 16, 2, 8
SHAPE = [SIZE, SIZE, 1]


def _as_the_vendor_reads(dataset_path, split):
    """The records of one split, found and parsed as the vendor's tf/unet/input/dagm2007_tfrecords_dataset.py does."""
    files = sorted(str(p) for p in (dataset_path / split).glob(f"{split}-*.tfrecords"))
    spec = {"image": tf.io.FixedLenSequenceFeature(SHAPE, tf.float32, allow_missing=True),
            "mask": tf.io.FixedLenSequenceFeature(SHAPE, tf.float32, allow_missing=True)}
    assert files, f"no {split}-*.tfrecords under {dataset_path / split}"
    images, masks = [], []
    for record in tf.data.TFRecordDataset(files):
        example = tf.io.parse_single_example(record, spec)
        images.append(tf.squeeze(example["image"], axis=0).numpy())
        masks.append(tf.squeeze(example["mask"], axis=0).numpy())
    return files, np.stack(images), np.stack(masks)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("vendor_unet") / "data"
    made = prepare_vendor_unet(out, image_size=SIZE, digits_per_image=DIGITS, digit_size=DIGIT_SIZE,
                               images_per_file=100)
    return out, made


@pytest.mark.parametrize("split", ["train", "test"])
def test_records_are_the_canvases_as_the_vendor_reads_them(prepared, split):
    out, made = prepared
    images, masks, _ = digit_canvases(split, (SIZE, SIZE), DIGITS, DIGIT_SIZE, binary=True)
    files, read_images, read_masks = _as_the_vendor_reads(out, split)
    assert len(files) == -(-len(images) // 100) and made[split]["files"] == len(files)
    assert read_images.shape == (len(images), *SHAPE) and read_masks.shape == (len(images), *SHAPE)
    # zero_centered, as the vendor's raw reader normalizes (its TFRecords writer stores what that reader gives)
    np.testing.assert_allclose(read_images, images.astype(np.float32) / 127.5 - 1.0, atol=1e-6)
    np.testing.assert_array_equal(read_masks[..., 0], masks.astype(np.float32))
    assert set(np.unique(read_masks)) == {0.0, 1.0}
    assert made["image_shape"] == SHAPE


def test_refuses_an_image_size_the_net_cannot_take(tmp_path):
    with pytest.raises(UserError, match="--image_size 20: must be a multiple of 8"):
        prepare_vendor_unet(tmp_path / "new", image_size=20)
    assert not (tmp_path / "new").exists()


def test_cli_refuses_a_non_empty_folder_in_one_line(tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "common.zoo_cli", "prepare", "vendor_unet", "--output_dir",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (f"error: --output_dir {tmp_path}: not empty; give a new or empty "
                                                    "folder (nothing is overwritten)")
    assert "Traceback" not in proc.stderr and "keep.txt" in os.listdir(tmp_path) and len(os.listdir(tmp_path)) == 1
