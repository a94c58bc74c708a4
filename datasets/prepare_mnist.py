"""Put real MNIST into DATA_DIR/MNIST/raw, the layout both frameworks read.

    python datasets/prepare_mnist.py --source DIR_OR_URL --data_dir DIR

DIR_OR_URL is a folder holding the four MNIST files (train-images-idx3-ubyte,
train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; gzipped or not,
with or without .gz, "-idx3-ubyte" or ".idx3-ubyte"), or a URL of a folder serving them.
Every file is checked before anything is written. Prints one line per file and a last
line; on bad input prints "error: ..." to stderr and exits with status 2.
"""

import argparse
import sys

from common.data.mnist import MNIST_FILES, prepare_mnist
from common.errors import UserError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", required=True, help="folder holding the four MNIST IDX files, or a URL of one")
    parser.add_argument(
        "--data_dir", required=True, help="writes DATA_DIR/MNIST/raw; give run.py the same data_dir"
    )
    args = parser.parse_args(argv)
    try:
        prepared = prepare_mnist(args.source, args.data_dir)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    for f in prepared:
        what = "images of 28x28" if len(f.shape) == 3 else "labels"
        print(f"{f.path}: {f.shape[0]:,} {what} from {f.source}")
    num_train = next(f.shape[0] for f in prepared if f.path.endswith(MNIST_FILES["train"][0]))
    num_test = next(f.shape[0] for f in prepared if f.path.endswith(MNIST_FILES["test"][0]))
    print(f"MNIST ready ({num_train:,} train / {num_test:,} test): use data_dir {args.data_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
