"""Write TFRecords of a class-per-folder image tree, the ImageNet layout tf/resnet reads.

    python datasets/prepare_imagefolder.py --source DIR --data_dir OUT [--shard_size N]

DIR holds ``train/<class>/<image>`` and ``val/<class>/<image>`` (as torchvision's
ImageFolder and pytorch/resnet read them directly). Writes ``OUT/train-00000-of-000NN.tfrecord``
..., ``OUT/val-...``, each example the image's encoded bytes as they are on disk
(``image/encoded``), its class index (``image/class/label``, classes in sorted order) and
its file name; and ``OUT/classes.txt``, one class name a line. Every image is decoded by
TensorFlow before anything is written, so training never meets an unreadable one; an
empty class folder, a class of val/ missing from train/, or an image that does not
decode, stops with one line naming it ("error: ...", exit status 2).
"""

import argparse
import os
import sys

from common.data.images import list_image_folder
from common.errors import UserError

SPLITS = ("train", "val")


def check_images(samples: list[tuple[str, int]]) -> None:
    """Decode each image (one at a time: ImageNet does not fit in memory); one line on the first that fails."""
    import common.tf.run  # noqa: F401  (the runners' import of TensorFlow, which drops its start-up noise)
    import tensorflow as tf

    for path, _ in samples:
        with open(path, "rb") as f:
            data = f.read()
        try:
            tf.io.decode_image(data, channels=3, expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.UnknownError) as e:
            first = str(e.message).strip().splitlines()[0] if str(e.message).strip() else type(e).__name__
            raise UserError(f"{path}: not an image TensorFlow decodes ({first}); remove or replace it") from None


def write_split(source: str, data_dir: str, split: str, classes: list[str] | None, shard_size: int
                ) -> tuple[list[str], list[str], int]:
    import tensorflow as tf

    samples, found = list_image_folder(os.path.join(source, split))
    if classes is not None and found != classes:
        extra = sorted(set(found) - set(classes)) or sorted(set(classes) - set(found))
        raise UserError(f"{os.path.join(source, split)}: its classes differ from train/'s (e.g. {extra[0]!r}); "
                        f"both splits need the same class folders")
    shards = max(1, -(-len(samples) // shard_size))
    paths = []
    for shard in range(shards):
        path = os.path.join(data_dir, f"{split}-{shard:05d}-of-{shards:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for image_path, label in samples[shard * shard_size:(shard + 1) * shard_size]:
                with open(image_path, "rb") as f:
                    data = f.read()
                feature = {
                    "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                    "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    "image/filename": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[os.path.relpath(image_path, source).encode()])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True))
        paths.append(path)
    return paths, found, len(samples)


def prepare(source: str, data_dir: str, shard_size: int = 1024) -> list[str]:
    """Check both splits, then write them; returns the lines to print."""
    if shard_size < 1:
        raise UserError(f"--shard_size must be at least 1, got {shard_size}")
    for split in SPLITS:  # both trees' layout, then every image decoded, before anything is written
        check_images(list_image_folder(os.path.join(source, split))[0])
    os.makedirs(data_dir, exist_ok=True)
    lines, classes = [], None
    for split in SPLITS:
        paths, classes, count = write_split(source, data_dir, split, classes, shard_size)
        lines.append(f"{split}: {count:,} images of {len(classes)} classes in {len(paths)} file(s) "
                     f"{os.path.join(data_dir, split)}-*.tfrecord")
    with open(os.path.join(data_dir, "classes.txt"), "w", encoding="utf-8") as f:
        f.write("".join(f"{name}\n" for name in classes))
    lines.append(f"ready: use data_dir {data_dir} with dataset: imagefolder and model.num_classes {len(classes)}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="folder holding train/<class>/ and val/<class>/")
    parser.add_argument("--data_dir", required=True, help="where the TFRecords and classes.txt go")
    parser.add_argument("--shard_size", type=int, default=1024, help="images per TFRecord file")
    args = parser.parse_args(argv)
    try:
        lines = prepare(args.source, args.data_dir, args.shard_size)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
