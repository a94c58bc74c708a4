"""The PyTorch frontend on the vision and loss ops: ConvTranspose2d, Upsample, adaptive
pooling, repeat / unbind / chunk, BCEWithLogitsLoss and CrossEntropyLoss (classes on axis 1
of any rank, ignore_index, label_smoothing).

Each construct lowers to its record (one node, named as the user wrote it), and the
emulator's loss and gradients agree with torch's; an attribute value the kernels do not
implement is a validation error naming the op, the attribute and the user's line.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from device.capture.torch import capture, state_of, weights_of  # noqa: E402
from device.ops import OPS  # noqa: E402
from device.passes.validate import DEFAULT_SUGGESTION, validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402


class VisionMix(nn.Module):
    """Every vision op of this file once, on (N, 3, 4, 4) images; a BCE and a cross entropy."""

    def __init__(self):
        super().__init__()
        self.up_conv = nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1, output_padding=1)  # (N, 2, 8, 8)
        self.up_conv2 = nn.ConvTranspose2d(3, 3, 2, stride=2)  # (N, 3, 8, 8)
        self.bilinear = nn.Upsample(scale_factor=2, mode="bilinear")
        self.nearest = nn.Upsample(size=(8, 8), mode="nearest")
        self.pool2 = nn.AdaptiveAvgPool2d(2)
        self.pool1 = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Conv2d(3, 3, 1)

    def forward(self, x, labels, targets):
        masks = self.up_conv(x)[:, 0]  # (N, 8, 8)
        bce = F.binary_cross_entropy_with_logits(masks, targets)
        logits = self.head(self.bilinear(x) + self.nearest(x) + self.up_conv2(x))  # (N, 3, 8, 8)
        ce = F.cross_entropy(logits, labels, label_smoothing=0.1)
        parts = x.chunk(3, dim=1)  # 3 x (N, 1, 4, 4)
        channels = x.unbind(1)  # 3 x (N, 4, 4)
        tiled = F.pad(self.pool2(x), (1, 1, 0, 2), value=0.5)[:, :, :2, 1:3].repeat(1, 1, 2, 2)  # (N, 3, 4, 4)
        extra = (tiled * x).mean() + (parts[1] * channels[2].unsqueeze(1)).mean() + self.pool1(x).square().mean()
        return bce + ce + extra


def vision_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 3, (2, 8, 8), generator=g)
    labels[0, :2] = -100  # CrossEntropyLoss's default ignore_index
    return [torch.randn(2, 3, 4, 4, generator=g), labels, torch.rand(2, 8, 8, generator=g)]


def emulator_and_torch(model, step, batch):
    graph = capture(step, model, batch)
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    loss, grads = program.gradients([t.numpy() for t in batch])
    model.zero_grad()
    expected = step(batch)
    expected.backward()
    return graph, loss, grads, expected.item(), {n: p.grad.numpy() for n, p in model.named_parameters()}


def assert_matches(loss, grads, expected_loss, expected_grads):
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    assert set(grads) == set(expected_grads)
    atol = 1e-6 * max(np.abs(g).max() for g in expected_grads.values())
    for name, grad in grads.items():
        np.testing.assert_allclose(grad, expected_grads[name], rtol=1e-5, atol=atol, err_msg=name)


def test_vision_ops_lower_to_their_records_and_match_torch():
    torch.manual_seed(0)
    model = VisionMix()
    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(model, lambda b: model(*b), vision_batch())
    ops = [n.op for n in graph.nodes]
    assert set(ops) <= set(OPS) and validate(graph, mode="train", profile=None).ok
    assert ops.count("conv_transpose2d") == 2 and ops.count("resize2d") == 2 and ops.count("tile") == 1
    assert ops.count("sigmoid_cross_entropy") == 1 and ops.count("cross_entropy_loss") == 1 and ops.count("pad") == 1
    # findings and kernels name the user's loss, not the ops torch decomposes it into
    (bce,) = [n for n in graph.nodes if n.op == "sigmoid_cross_entropy"]
    assert bce.loc.framework_op == "aten.binary_cross_entropy_with_logits.default"
    (ce,) = [n for n in graph.nodes if n.op == "cross_entropy_loss"]
    assert ce.attrs == {"axis": 1, "reduction": "mean", "ignore_index": -100, "label_smoothing": 0.1}
    assert {n.attrs["method"] for n in graph.nodes if n.op == "resize2d"} == {"nearest", "bilinear"}
    assert_matches(loss, grads, expected_loss, expected_grads)


@pytest.mark.parametrize("ignore_index, label_smoothing, reduction, weighted", [
    (-100, 0.0, "mean", False), (0, 0.0, "mean", False), (2, 0.2, "mean", False), (0, 0.1, "sum", False),
    (-100, 0.0, "sum", False), (1, 0.1, "mean", True), (-100, 0.0, "mean", True)])
def test_cross_entropy_ignore_index_label_smoothing_and_weight_are_torchs_numbers(ignore_index, label_smoothing,
                                                                                   reduction, weighted):
    """(N, C, H, W) logits; the ignored labels count nothing, the mean is over the rest."""
    torch.manual_seed(1)
    model = nn.Conv2d(2, 4, 1)
    weight = torch.tensor([0.5, 1.0, 2.0, 3.0]) if weighted else None
    loss_fn = nn.CrossEntropyLoss(weight=weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                  reduction=reduction)
    labels = torch.randint(0, 4, (3, 5, 5))
    labels[:, 0] = ignore_index
    batch = [torch.randn(3, 2, 5, 5), labels]
    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(
        model, lambda b: loss_fn(model(b[0]), b[1]), batch)
    (node,) = [n for n in graph.nodes if n.op == "cross_entropy_loss"]
    assert node.attrs["ignore_index"] == ignore_index and node.attrs["reduction"] == reduction
    assert_matches(loss, grads, expected_loss, expected_grads)


def test_nll_loss_after_log_softmax_honours_ignore_index():
    torch.manual_seed(2)
    model = nn.Linear(4, 3)
    batch = [torch.randn(6, 4), torch.tensor([0, 2, 1, 0, 2, 1])]

    def step(b):
        return F.nll_loss(F.log_softmax(model(b[0]), dim=1), b[1], ignore_index=0)

    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(model, step, batch)
    assert [n.op for n in graph.nodes if n.op in OPS and OPS[n.op].category == "loss"] == ["cross_entropy_loss"]
    assert_matches(loss, grads, expected_loss, expected_grads)


class Refused(nn.Module):
    """Attribute values the kernels do not implement, one per line."""

    def __init__(self):
        super().__init__()
        self.grouped_up = nn.ConvTranspose2d(4, 4, 2, stride=2, groups=2)
        self.corners = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)

    def forward(self, x, labels, targets):  # x: (N, 4, 6, 6)
        a = self.grouped_up(x)  # <refused-groups>
        b = self.corners(x)  # <refused-align-corners>
        c = F.interpolate(x, scale_factor=1.5, mode="nearest")  # <refused-nearest-factor>
        d = F.adaptive_max_pool2d(x, 4)[0]  # <refused-adaptive-max>
        d = d + x.as_strided((2, 4, 3, 3), (144, 36, 6, 1)).mean()  # <refused-strided>
        e = F.binary_cross_entropy_with_logits(x, targets, pos_weight=targets.mean((0, 1, 2)))  # <refused-pos-weight>
        f = F.cross_entropy(x, labels, weight=targets.mean((0, 2, 3)))  # <refused-class-weight>
        return a.mean() + b.mean() + c.mean() + d.mean() + e + f


def _line(tag: str) -> int:
    lines, start = inspect.getsourcelines(Refused.forward)
    return start + next(i for i, text in enumerate(lines) if text.rstrip().endswith(f"# <{tag}>"))


@pytest.mark.parametrize("tag, framework_op, attribute", [
    ("refused-groups", "aten.convolution.default", "groups=2"),
    ("refused-align-corners", "aten.upsample_bilinear2d.vec", "align_corners=True"),
    ("refused-nearest-factor", "aten.upsample_nearest2d.vec", "scale_factor=[1.5, 1.5]"),
    ("refused-adaptive-max", "aten.adaptive_max_pool2d.default", "not supported"),
    ("refused-strided", "aten.as_strided.default", "strided window"),
    ("refused-pos-weight", "aten.binary_cross_entropy_with_logits.default", "pos_weight"),
    ("refused-class-weight", "aten.cross_entropy_loss.default", "weight"),
])
def test_unimplemented_attribute_values_are_refused_at_the_users_line(tag, framework_op, attribute):
    model = Refused()
    batch = [torch.randn(2, 4, 6, 6), torch.randint(0, 4, (2, 6, 6)), torch.rand(2, 4, 6, 6)]
    graph = capture(lambda b: model(*b), model, batch)
    report = validate(graph, mode="train", profile=None)
    found = [f for f in report.errors if f.line == _line(tag) and f.framework_op == framework_op]
    assert len(found) == 1, report.to_text()
    assert found[0].framework_op == framework_op and attribute in found[0].message
    assert found[0].file == inspect.getsourcefile(Refused)
    assert found[0].suggestion not in ("", DEFAULT_SUGGESTION)  # a suggestion for that op


class GalleryOps(nn.Module):
    """The ops torchvision's models add (tests/gallery): grouped and depthwise convolutions, reflect and
    replicate padding, adaptive average pooling whose windows overlap (VGG's 7x7 on a small map)."""

    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.depthwise = nn.Conv2d(6, 12, 3, stride=2, padding=1, groups=6, bias=False)
        self.head = nn.Linear(12 * 3 * 3, 3)

    def forward(self, x, labels):  # x: (N, 4, 5, 5)
        y = F.relu(self.grouped(F.pad(x, (1, 1, 2, 0), mode="reflect")))  # (N, 6, 7, 7)
        y = self.depthwise(F.pad(y, (0, 1, 1, 0), mode="replicate"))  # (N, 12, 4, 4)
        y = F.adaptive_avg_pool2d(y, 3)  # (N, 12, 3, 3): windows of 2 that overlap
        return F.cross_entropy(self.head(y.flatten(1)), labels)


def test_gallery_ops_lower_to_their_records_and_match_torch():
    torch.manual_seed(3)
    model = GalleryOps()
    batch = [torch.randn(2, 4, 5, 5), torch.tensor([0, 2])]
    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(model, lambda b: model(*b), batch)
    assert validate(graph, mode="train", profile=None).ok
    assert sorted(n.attrs.get("groups", 1) for n in graph.nodes if n.op == "conv2d") == [2, 6]
    assert sorted(n.attrs["mode"] for n in graph.nodes if n.op == "pad") == ["edge", "reflect"]
    assert [n.attrs["equation"] for n in graph.nodes if n.op == "einsum"] == ["nchw,ih,jw->ncij"]
    assert_matches(loss, grads, expected_loss, expected_grads)


class InOrderStrides(nn.Module):
    """torch.as_strided that keeps the elements in order: what F.adaptive_avg_pool2d's 1x1 output
    gets (ConvNeXt's head, then a permute), and a reshape written as strides."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(6, 3)

    def forward(self, x, labels):  # x: (N, 4, 3, 3)
        y = F.adaptive_avg_pool2d(x.reshape(2, 6, 2, 3), 1)  # (N, 6, 1, 1), strides (6, 1, 6, 6) in the graph
        y = y.permute(0, 2, 3, 1) + x.as_strided((2, 1, 1, 36), (36, 1, 36, 1))[..., :6]  # a reshape
        return F.cross_entropy(self.head(y.flatten(1)), labels)


def test_as_strided_in_element_order_is_a_reshape_and_matches_torch():
    torch.manual_seed(4)
    model = InOrderStrides()
    batch = [torch.randn(2, 4, 3, 3), torch.tensor([0, 2])]
    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(model, lambda b: model(*b), batch)
    assert validate(graph, mode="train", profile=None).ok
    assert not any("as_strided" in n.op for n in graph.nodes)
    assert_matches(loss, grads, expected_loss, expected_grads)


def test_in_place_dropout_and_stochastic_depth_draw_device_masks():
    """nn.Dropout(inplace=True) and torchvision's stochastic depth draw their masks with bernoulli_:
    the emulator draws them as dropout, with the keep rate and the scale of torch's."""
    from torchvision.ops import StochasticDepth

    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.25, inplace=True), StochasticDepth(0.5, "row"))
    batch = [torch.randn(64, 8)]
    graph = capture(lambda b: (model(b[0]).square().mean(), {"y": model(b[0])}), model, batch)
    assert validate(graph, mode="train", profile=None).ok
    assert sorted(n.attrs["rate"] for n in graph.nodes if n.op == "dropout") == [0.25, 0.25, 0.5, 0.5]
    program = Program(graph, weights_of(model, graph), state_of(model, graph), seed=0)
    with torch.no_grad():
        plain = model[0](batch[0]).numpy()
    y = program.forward([batch[0].numpy()], training=True)["y"]
    kept = y != 0  # kept entries are scaled by 1 / 0.75 (dropout), then 1 / 0.5 (stochastic depth)
    np.testing.assert_allclose(y[kept], (plain / 0.375)[kept], rtol=1e-5, atol=1e-6 * np.abs(plain).max())
    rows_dropped = ~kept.any(axis=1)  # stochastic depth ("row"): whole examples
    assert 0 < rows_dropped.sum() < 64 and 0.5 < kept[~rows_dropped].mean() < 0.95


class CeilPools(nn.Module):
    """GoogLeNet's pools: max_pool2d and avg_pool2d in ceil_mode, where it changes the output size and
    where it does not; avg_pool2d padded, counting the padding and not."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 3 * 3, 3)

    def forward(self, x, labels):  # x: (N, 3, 10, 10)
        y = F.relu(self.conv(x))  # (N, 4, 10, 10)
        a = F.max_pool2d(y, 3, 2, ceil_mode=True)  # (N, 4, 5, 5); 4 x 4 without ceil_mode
        b = F.avg_pool2d(y, 3, 2, padding=1, ceil_mode=True)  # (N, 4, 6, 6); 5 x 5 without
        c = F.avg_pool2d(y, 3, 2, padding=1, ceil_mode=True, count_include_pad=False)  # (N, 4, 6, 6)
        d = F.max_pool2d(a, 2, 2, ceil_mode=True)  # (N, 4, 3, 3); 2 x 2 without
        e = F.avg_pool2d(y[..., :9, :9], 3, 2, ceil_mode=True)  # (N, 4, 4, 4) either way
        return F.cross_entropy(self.head(d.flatten(1)), labels) + (b * c).mean() + e.square().mean() + a.mean()


def test_ceil_mode_pools_give_torchs_sizes_values_and_gradients():
    torch.manual_seed(4)
    model = CeilPools()
    batch = [torch.randn(2, 3, 10, 10), torch.tensor([0, 2])]
    graph, loss, grads, expected_loss, expected_grads = emulator_and_torch(model, lambda b: model(*b), batch)
    assert validate(graph, mode="train", profile=None).ok
    pools = [n for n in graph.nodes if n.op in ("max_pool2d", "avg_pool2d")]
    assert [graph.values[n.outputs[0]].shape[2:] for n in pools] == [(5, 5), (6, 6), (6, 6), (3, 3), (4, 4)]
    assert all(n.attrs["ceil_mode"] for n in pools)
    assert [n.attrs.get("count_include_pad", True) for n in pools] == [True, True, False, True, True]
    assert_matches(loss, grads, expected_loss, expected_grads)
