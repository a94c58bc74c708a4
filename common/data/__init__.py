"""Framework-neutral data on disk (numpy and stdlib only; neither torch nor tensorflow).

Named ``common.data`` rather than a top-level ``datasets`` package, which would shadow
Hugging Face's ``datasets``; the repository's ``datasets/`` folder holds only commands
and the embedded data, and is not a package.
"""

from common.data.mnist import (
    DATASETS,
    EMBEDDED_DIGITS_ROOT,
    MNIST_FILES,
    MNIST_MEAN,
    MNIST_STD,
    MnistLocation,
    PreparedFile,
    embedded_digits,
    load_mnist_arrays,
    prepare_mnist,
    read_idx,
    resolve_mnist,
    write_fake_mnist,
    write_idx,
)

__all__ = [
    "DATASETS",
    "EMBEDDED_DIGITS_ROOT",
    "MNIST_FILES",
    "MNIST_MEAN",
    "MNIST_STD",
    "MnistLocation",
    "PreparedFile",
    "embedded_digits",
    "load_mnist_arrays",
    "prepare_mnist",
    "read_idx",
    "resolve_mnist",
    "write_fake_mnist",
    "write_idx",
]
