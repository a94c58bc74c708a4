"""MNIST on disk, shared by the TF and PyTorch input pipelines (numpy and stdlib only).

One module per concern, in the order a run meets them:

    layout.py    torchvision's MNIST/raw layout both frameworks read, MnistLocation,
                 load_mnist_arrays (the TF side's reader)
    idx.py       the IDX file format: read_idx, write_idx
    resolve.py   resolve_mnist: which folder a run reads (data_dir, or the embedded digits)
    embedded.py  the UCI handwritten digits committed in the repository
    prepare.py   prepare_mnist: real MNIST into a data_dir once (datasets/prepare_mnist.py)
    fake.py      write_fake_mnist: a small fake MNIST for tests

Nothing is downloaded at run time: ``prepare_mnist`` puts real MNIST into a data_dir
once, and ``resolve_mnist`` falls back to the embedded digits when it holds no MNIST.
"""

from common.data.mnist.embedded import EMBEDDED_DIGITS_ROOT, embedded_digits
from common.data.mnist.fake import write_fake_mnist
from common.data.mnist.idx import read_idx, write_idx
from common.data.mnist.layout import (DATASETS, IMAGE_SIZE, MNIST_FILES, MNIST_MEAN, MNIST_STD, NUM_CLASSES, SPLITS,
                                      MnistLocation, load_mnist_arrays)
from common.data.mnist.prepare import PREPARE_SCRIPT, PreparedFile, prepare_mnist
from common.data.mnist.resolve import resolve_mnist

__all__ = ["DATASETS", "EMBEDDED_DIGITS_ROOT", "IMAGE_SIZE", "MNIST_FILES", "MNIST_MEAN", "MNIST_STD", "NUM_CLASSES",
           "PREPARE_SCRIPT", "SPLITS", "MnistLocation", "PreparedFile", "embedded_digits", "load_mnist_arrays",
           "prepare_mnist", "read_idx", "resolve_mnist", "write_fake_mnist", "write_idx"]
