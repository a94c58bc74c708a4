"""Write tfds's ``mnist`` into a data_dir from the digits on disk, with no download.

    python datasets/prepare_tfds_mnist.py --data_dir ./tfds                  # the embedded digits
    python datasets/prepare_tfds_mnist.py --data_dir ./tfds --source ./data  # DATA/MNIST/raw (prepare_mnist.py)

A folder from the vendor's zoo reads MNIST with ``tfds.load("mnist", data_dir=...)``, which
downloads it on first use. This writes what that download would prepare: DATA_DIR/mnist/3.0.1,
tfds's own MNIST builder (its features, image (28, 28, 1) uint8 and label of 10 classes,
and its version) with the train and test splits of the source. Afterwards
``tfds.load("mnist", data_dir=DATA_DIR)`` reads them without touching the network. Prints one
line per split; bad input is one ``error:`` line and exit status 2.
"""

import argparse
import os
import sys

from common.data import embedded_digits, load_mnist_arrays
from common.data.mnist.layout import mnist_location
from common.errors import UserError


def write_tfds_mnist(data_dir: str, source: str | None = None) -> dict[str, int]:
    """tfds's mnist under ``data_dir`` from ``source`` (a data_dir holding MNIST/raw; None: the
    embedded digits); returns {split: examples}."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.image_classification.mnist import MNIST

    location = embedded_digits() if source is None else mnist_location(source)
    splits = {split: load_mnist_arrays(location, split) for split in ("train", "test")}
    if os.path.isdir(os.path.join(data_dir, "mnist", str(MNIST.VERSION))):
        raise UserError(f"{os.path.join(data_dir, 'mnist', str(MNIST.VERSION))} exists: remove it first, or give "
                        f"another --data_dir")

    def examples(split):
        images, labels = splits[split]  # (N, 28, 28) uint8, (N,)
        for i, (image, label) in enumerate(zip(images, labels)):
            yield i, {"image": image[..., None], "label": int(label)}

    with tfds.core.registered.skip_registration():
        class LocalMNIST(MNIST):
            """tfds's MNIST builder, its examples from arrays instead of the download."""

            name = "mnist"
            __module__ = MNIST.__module__  # dataset_info.json records it: the same as tfds's builder

            def _split_generators(self, dl_manager):
                return {split: examples(split) for split in splits}

    LocalMNIST(data_dir=data_dir).download_and_prepare()
    return {split: len(labels) for split, (_, labels) in splits.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", required=True, help="tfds's data_dir: the vendor's train_input.data_dir")
    parser.add_argument("--source", help="a data_dir holding MNIST/raw (default: the embedded digits)")
    args = parser.parse_args(argv)
    try:
        counts = write_tfds_mnist(args.data_dir, args.source)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for split, count in counts.items():
        print(f"{args.data_dir}/mnist: {split} {count:,} examples")
    print(f"tfds mnist ready: tfds.load('mnist', data_dir={args.data_dir!r}) reads it without a download")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
