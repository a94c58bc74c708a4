"""Segmentation data in the layout the vendor's TF unet folder reads (R1.6): ``zoo prepare vendor_unet``.

The vendor's ``DAGM2007TFRecordsDataset`` (configs/params_dagm_tfrecords.yaml) reads
``<dataset_path>/train/train-*.tfrecords`` to train and ``<dataset_path>/test/test-*.tfrecords``
to evaluate; each record is a ``tf.train.Example`` of two float lists,
parsed as ``FixedLenSequenceFeature(image_shape, float32)``:

    image   H * W * 1 floats, the grey image already normalized as its raw reader's
            zero_centered method does (pixel / 127.5 - 1)
    mask    H * W * 1 floats, 1.0 on a defect (foreground) pixel, 0.0 elsewhere

Not DAGM 2007 (not shipped, not offline): the zoo's own binary segmentation task, the
embedded UCI digits placed on a canvas (common/data/segmentation.py ``digit_canvases``,
binary: ink is foreground), so the vendor's binary defect-vs-background net has a real task.
The vendor's raw readers (DAGM2007Dataset, SeverstalDataset) need pandas, which this zoo
does not install; its TFRecords reader needs only TF.
"""

from __future__ import annotations

import numpy as np

from common.data.segmentation import digit_canvases
from common.data.vendor.text import check_output_dir, check_positive, claim_output_dir
from common.errors import UserError

SPLITS = {"train": "train", "test": "test"}  # the zoo's split -> the vendor's folder and file prefix


def zero_centered(images: np.ndarray) -> np.ndarray:
    """uint8 pixels as the vendor's raw DAGM reader normalizes them (normalize_data_method zero_centered)."""
    return images.astype(np.float32) / 127.5 - 1.0


def write_split(images: np.ndarray, masks: np.ndarray, folder, prefix: str, images_per_file: int) -> list[str]:
    """(N, H, W, 1) uint8 images and (N, H, W) 0/1 masks as ``folder/<prefix>-NNN.tfrecords`` files."""
    import tensorflow as tf  # here, as the other vendor writers: common.data imports without TF

    def floats(values: np.ndarray) -> tf.train.Feature:
        return tf.train.Feature(float_list=tf.train.FloatList(value=values.reshape(-1).tolist()))

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for first in range(0, len(images), images_per_file):
        path = folder / f"{prefix}-{len(paths):03d}.tfrecords"
        with tf.io.TFRecordWriter(str(path)) as writer:
            for image, mask in zip(images[first:first + images_per_file], masks[first:first + images_per_file]):
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": floats(zero_centered(image)),
                    "mask": floats(mask.astype(np.float32)),
                }))
                writer.write(example.SerializeToString())
        paths.append(str(path))
    return paths


def prepare_vendor_unet(output_dir, image_size: int = 32, digits_per_image: int = 2, digit_size: int = 14,
                        images_per_file: int = 256) -> dict:
    """Writes both splits; returns the image shape the config must give (train_input.image_shape) and counts."""
    check_positive(image_size=image_size, digits_per_image=digits_per_image, digit_size=digit_size,
                   images_per_file=images_per_file)
    if image_size % 8:
        raise UserError(f"--image_size {image_size}: must be a multiple of 8 (the vendor's unet pools three times "
                        f"and concatenates each level with its upsampled one)")
    check_output_dir(output_dir)
    splits = {split: digit_canvases(split, (image_size, image_size), digits_per_image, digit_size, binary=True)
              for split in SPLITS}
    out = claim_output_dir(output_dir)
    made = {"image_shape": [image_size, image_size, 1]}
    for split, prefix in SPLITS.items():
        images, masks, what = splits[split]
        files = write_split(images, masks, out / prefix, prefix, images_per_file)
        made[split] = {"images": len(images), "files": len(files), "what": what}
    return made

