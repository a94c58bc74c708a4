"""Make a binary segmentation set in the vendor's TF unet TFRecords layout, for its unet/tf folder.

    python datasets/prepare_vendor_unet.py --output_dir DIR [--image_size 32]

Not DAGM 2007: the zoo's own offline task, the embedded UCI digits placed on a canvas, ink
against background (common/data/vendor/unet.py). Writes what the vendor's
DAGM2007TFRecordsDataset (configs/params_dagm_tfrecords.yaml) reads: DIR/train/train-NNN.tfrecords
and DIR/test/test-NNN.tfrecords, each record an image (zero-centered floats) and a mask
(0/1 floats) of image_size x image_size x 1. The last line gives the config keys to set. DIR
must be new or empty (nothing is overwritten). On bad input prints "error: ..." to stderr
and exits with status 2.
"""

import argparse
import sys
from pathlib import Path

from common.data.vendor.unet import prepare_vendor_unet
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--image_size", type=int, default=32, help="height and width of each image (a multiple of 8)")
    parser.add_argument("--digits_per_image", type=int, default=2, help="digits placed on each canvas")
    parser.add_argument("--digit_size", type=int, default=14, help="height and width of each digit")
    parser.add_argument("--images_per_file", type=int, default=256, help="records in each .tfrecords file")
    args = parser.parse_args(argv)
    try:
        made = prepare_vendor_unet(args.output_dir, image_size=args.image_size,
                                   digits_per_image=args.digits_per_image, digit_size=args.digit_size,
                                   images_per_file=args.images_per_file)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    out = Path(args.output_dir).resolve()
    for split in ("train", "test"):
        print(f"{split}: {made[split]['what']}, in {made[split]['files']} file(s) under {out / split}")
    print("set in the vendor config:")
    shape = ",".join(str(n) for n in made["image_shape"])
    print(f"  train_input.dataset_path={out} train_input.image_shape=[{shape}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
