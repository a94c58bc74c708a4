"""Never a traceback from capture (PyTorch): a catalog of constructs the device cannot run.

Each case is a line a user may write in a model: control flow on a tensor's value, a
data-dependent output size, sparse or complex tensors, in-place writes, ops the device
lacks. Each goes through what the runner does (``capture`` then ``validate_graph``,
common/pytorch/device_run.py) and must be refused cleanly: a ``UserError``, or a failed
validation, whose text names the op and points at the case's own line in this file.
"""

from __future__ import annotations

import pathlib

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.api import validate_graph  # noqa: E402
from device.capture.torch import capture  # noqa: E402
from zoo_base.errors import UserError  # noqa: E402

_SOURCE = pathlib.Path(__file__).read_text().splitlines()


def _line(tag: str) -> int:
    """The line of this file that ends with ``# <tag>``."""
    return next(i + 1 for i, text in enumerate(_SOURCE) if text.rstrip().endswith(f"# <{tag}>"))


# Each case: (x (2, 8) float, img (2, 4, 6, 6) float, ids (2, 8) int64) -> a tensor the loss adds up.
# The tag of the refused line is the case's name; the names a refusal must mention follow it.

def data_dependent_if(x, img, ids):
    if x.sum() > 0:  # <data_dependent_if>
        return x * 2
    return x


def data_dependent_loop(x, img, ids):
    total = x
    for _ in range(int(ids.max())):  # <data_dependent_loop>
        total = total + 1
    return total


def item_as_python_number(x, img, ids):
    return x * x.mean().item()  # <item_as_python_number>


def tolist(x, img, ids):
    return torch.tensor(ids.tolist()).float()  # <tolist>


def nonzero(x, img, ids):
    return torch.nonzero(x > 0).float()  # <nonzero>


def boolean_mask_index(x, img, ids):
    return x[x > 0]  # <boolean_mask_index>


def masked_select(x, img, ids):
    return torch.masked_select(x, x > 0)  # <masked_select>


def unique(x, img, ids):
    return torch.unique(ids).float()  # <unique>


def data_dependent_slice(x, img, ids):
    return x[:, : ids.max()]  # <data_dependent_slice>


def repeat_interleave_by_tensor(x, img, ids):
    return torch.repeat_interleave(x[0], ids[0].clamp(0, 2))  # <repeat_interleave_by_tensor>


def topk(x, img, ids):
    return torch.topk(x, 3).values  # <topk>


def sort(x, img, ids):
    return torch.sort(x, dim=1).values  # <sort>


def argsort(x, img, ids):
    return torch.argsort(x, dim=1).float()  # <argsort>


def cumprod(x, img, ids):
    return torch.cumprod(x, dim=1)  # <cumprod>


def median(x, img, ids):
    return torch.median(x, dim=1).values  # <median>


def grouped_conv_transpose(x, img, ids):
    return F.conv_transpose2d(img, torch.ones(4, 2, 3, 3), groups=2)  # <grouped_conv_transpose>


def adaptive_max_pool(x, img, ids):
    return F.adaptive_max_pool2d(img, 4)  # <adaptive_max_pool>


def bitwise_and_on_ints(x, img, ids):
    return (ids & 3).float()  # <bitwise_and_on_ints>


def sparse_tensor(x, img, ids):
    return torch.sparse.sum(x.to_sparse(), dim=1).to_dense()  # <sparse_tensor>


def complex_tensor(x, img, ids):
    return torch.view_as_complex(x.reshape(2, 4, 2)).abs()  # <complex_tensor>


def fft(x, img, ids):
    return torch.fft.rfft(x).abs()  # <fft>


def index_put(x, img, ids):
    h = x.clone()
    h[:, ids[0]] = 0.0  # positions read from the data  # <index_put>
    return h


def scatter_reduce(x, img, ids):
    return torch.zeros(2, 8).scatter_reduce(1, ids % 8, x, reduce="amax")  # <scatter_reduce>


def torch_cond(x, img, ids):
    return torch.cond(x.sum() > 0, lambda a: a * 2, lambda a: a - 1, (x,))  # <torch_cond>


def int64_product(x, img, ids):
    return torch.prod(ids + 1, dim=1).float()  # <int64_product>


def float64(x, img, ids):
    return x.double() * 2  # <float64>


def matrix_inverse(x, img, ids):
    return torch.linalg.inv(x.reshape(2, 2, 2, 2) + 3 * torch.eye(2))  # <matrix_inverse>


def bincount(x, img, ids):
    return torch.bincount(ids[0]).float()  # <bincount>


def multinomial_sample(x, img, ids):
    return torch.multinomial(x.softmax(1), 2).float()  # <multinomial_sample>


# case -> names of which at least one must appear in the refusal (the op as the user wrote it, or its aten op)
CASES = {
    data_dependent_if: ("data-dependent", "sum"),
    data_dependent_loop: ("data-dependent", "max", "int"),
    item_as_python_number: ("item", "data-dependent"),
    tolist: ("tolist", "data-dependent", "item"),
    nonzero: ("nonzero",),
    boolean_mask_index: ("index", "nonzero"),
    masked_select: ("masked_select",),
    unique: ("unique",),
    data_dependent_slice: ("data-dependent", "max", "slice"),
    repeat_interleave_by_tensor: ("repeat_interleave",),
    topk: ("topk",),
    sort: ("sort",),
    argsort: ("sort",),
    cumprod: ("cumprod",),
    median: ("median",),
    grouped_conv_transpose: ("conv_transpose2d", "convolution"),
    adaptive_max_pool: ("adaptive_max_pool2d",),
    bitwise_and_on_ints: ("bitwise_and",),
    sparse_tensor: ("sparse",),
    complex_tensor: ("complex",),
    fft: ("fft",),
    index_put: ("index_put",),
    scatter_reduce: ("scatter_reduce",),
    torch_cond: ("cond",),
    int64_product: ("prod",),
    float64: ("float64",),
    matrix_inverse: ("inv", "linalg"),
    bincount: ("bincount",),
    multinomial_sample: ("multinomial",),
}


class Catalog(nn.Module):
    def __init__(self, case):
        super().__init__()
        self.case = case
        self.lin = nn.Linear(8, 8)

    def forward(self, x, img, ids):
        return self.lin(x).mean() + self.case(x, img, ids).float().mean()


def refusal(case) -> str:
    """The runner's path: capture, then validate; the text of the refusal (a UserError's or the report's)."""
    torch.manual_seed(0)
    model = Catalog(case)
    batch = (torch.randn(2, 8), torch.randn(2, 4, 6, 6), torch.randint(0, 6, (2, 8)))
    try:
        graph = capture(lambda b: model(*b), model, batch)
    except UserError as e:
        return str(e)
    report = validate_graph(graph, mode="train", profile_name="tiny")
    assert not report.ok, f"{case.__name__} was not refused: {report.to_text()}"
    return report.to_text()


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: c.__name__)
def test_each_construct_is_refused_with_its_op_and_line(case):
    text = refusal(case)
    assert f"{__file__}:{_line(case.__name__)}:" in text, text
    assert any(name in text for name in CASES[case]), text


def test_the_catalog_has_at_least_twenty_constructs():
    assert len(CASES) >= 20
