"""Every attribute of the vision and loss aten ops, walked from torch's own schema: each is
implemented (the emulator gives torch's numbers with a value other than the default) or
refused (a validation error naming the op, the attribute and the user's line). Never dropped.

An argument torch adds to one of these schemas fails test_every_schema_argument_is_walked
until it has a row here.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from device.capture.torch import capture, weights_of  # noqa: E402
from device.passes.validate import validate  # noqa: E402
from device.runtime.program import Program  # noqa: E402

aten = torch.ops.aten
IMPLEMENTED, REFUSED = "implemented", "refused"


def _images(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(3))


def _labels(high, *shape):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(4))


def _scales(overrides: dict):
    """upsample's scale_factors when no output_size is given (torch takes exactly one of them)."""
    return None if "output_size" in overrides else [2.0, 2.0]


# aten op -> (the inputs a call takes, the call with keyword overrides, {argument: (value, expectation)});
# arguments that are the op's tensor operands are listed as None
WALK = {
    "aten.convolution.default": (
        lambda: [_images(2, 4, 3, 3)],
        lambda x, w, **kw: aten.convolution(x, w, kw.get("bias"), kw.get("stride", [2, 2]), kw.get("padding", [0, 0]),
                                            kw.get("dilation", [1, 1]), True, kw.get("output_padding", [0, 0]),
                                            kw.get("groups", 1)),
        {"input": None, "weight": None, "transposed": None,
         "bias": ("bias", IMPLEMENTED), "stride": ([3, 1], IMPLEMENTED), "padding": ([1, 0], IMPLEMENTED),
         "dilation": ([2, 2], IMPLEMENTED), "output_padding": ([1, 0], IMPLEMENTED), "groups": (2, REFUSED)}),
    "aten.upsample_bilinear2d.vec": (
        lambda: [_images(2, 4, 3, 3)],
        lambda x, w, **kw: aten.upsample_bilinear2d.vec(x, kw.get("output_size"), kw.get("align_corners", False),
                                                        kw.get("scale_factors", _scales(kw))),
        {"input": None, "output_size": ([5, 7], IMPLEMENTED), "align_corners": (True, REFUSED),
         "scale_factors": ([3.0, 1.0], IMPLEMENTED)}),
    "aten.upsample_nearest2d.vec": (
        lambda: [_images(2, 4, 3, 3)],
        lambda x, w, **kw: aten.upsample_nearest2d.vec(x, kw.get("output_size"), kw.get("scale_factors", _scales(kw))),
        {"input": None, "output_size": ([6, 3], IMPLEMENTED), "scale_factors": ([1.5, 1.5], REFUSED)}),
    "aten._adaptive_avg_pool2d.default": (
        lambda: [_images(2, 4, 6, 6)],
        lambda x, w, **kw: aten._adaptive_avg_pool2d(x, kw.get("output_size", [2, 2])),
        {"self": None, "output_size": ([3, 2], IMPLEMENTED)}),
    "aten.repeat.default": (
        lambda: [_images(2, 4, 3, 3)],
        lambda x, w, **kw: aten.repeat(x, kw.get("repeats", [1, 1, 2, 2])),
        {"self": None, "repeats": ([2, 1, 1, 2, 3], IMPLEMENTED)}),
    "aten.constant_pad_nd.default": (
        lambda: [_images(2, 4, 3, 3)],
        lambda x, w, **kw: aten.constant_pad_nd(x, kw.get("pad", [1, 1]), kw.get("value", 0)),
        {"self": None, "pad": ([1, 0, 2, 1, 0, 1], IMPLEMENTED), "value": (0.5, IMPLEMENTED)}),
    "aten.binary_cross_entropy_with_logits.default": (
        lambda: [_images(2, 4, 3, 3), torch.rand(2, 4, 3, 3, generator=torch.Generator().manual_seed(5))],
        lambda x, w, z, **kw: aten.binary_cross_entropy_with_logits(x, z, kw.get("weight"), kw.get("pos_weight"),
                                                                    kw.get("reduction", 1)),
        {"self": None, "target": None, "weight": ("ones", IMPLEMENTED), "pos_weight": ("ones", IMPLEMENTED),
         "reduction": (2, IMPLEMENTED)}),
    "aten.cross_entropy_loss.default": (
        lambda: [_images(2, 4, 3, 3), _labels(4, 2, 3, 3)],
        lambda x, w, y, **kw: aten.cross_entropy_loss(x, y, kw.get("weight"), kw.get("reduction", 1),
                                                      kw.get("ignore_index", -100), kw.get("label_smoothing", 0.0)),
        {"self": None, "target": None, "weight": ("class_ones", IMPLEMENTED), "reduction": (0, IMPLEMENTED),
         "ignore_index": (1, IMPLEMENTED), "label_smoothing": (0.3, IMPLEMENTED)}),
}


def _overload(name: str):
    packet, overload = name.removeprefix("aten.").rsplit(".", 1)
    return getattr(getattr(aten, packet), overload)


@pytest.mark.parametrize("op", list(WALK))
def test_every_schema_argument_is_walked(op):
    arguments = {a.name for a in _overload(op)._schema.arguments}
    assert arguments == set(WALK[op][2]), f"{op}: add a row for each new argument"


class Call(nn.Module):
    """One call of the op on its inputs, the first scaled by a weight so that the graph trains."""

    def __init__(self, call, overrides: dict):
        super().__init__()
        self.call, self.overrides = call, overrides
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.w = nn.Parameter(_images(4, 3, 2, 2))  # the transposed convolution's weight (C_in, C_out, kh, kw)
        self.bias = nn.Parameter(_images(3))

    def forward(self, x, *rest):
        overrides = dict(self.overrides)
        for key, value in overrides.items():
            if value == "ones":  # broadcasts over (N, C, H, W)
                overrides[key] = torch.linspace(0.5, 2.0, x.shape[-1])
            elif value == "class_ones":
                overrides[key] = torch.linspace(0.5, 2.0, x.shape[1])
            elif value == "bias":
                overrides[key] = self.bias
        w = self.w[:, :2] if overrides.get("groups", 1) != 1 else self.w
        y = self.call(x * self.scale, w, *rest, **overrides)
        return y.square().mean() if y.dim() else y


CASES = [(op, argument, value, expectation) for op, (_, _, table) in WALK.items()
         for argument, row in table.items() if row is not None for value, expectation in [row]]


@pytest.mark.parametrize("op, argument, value, expectation", CASES,
                         ids=[f"{op.removeprefix('aten.')}-{argument}" for op, argument, _, _ in CASES])
def test_each_attribute_is_implemented_or_refused(op, argument, value, expectation):
    make_inputs, call, _ = WALK[op]
    model = Call(call, {argument: value})
    batch = make_inputs()
    graph = capture(lambda b: model(*b), model, batch)
    report = validate(graph, mode="train", profile=None)
    if expectation == REFUSED:
        # the user's line: the innermost frame outside torch, where the call (a lambda above) is written
        (finding,) = [f for f in report.errors if f.kind == "unsupported_op"]
        assert finding.framework_op == op and argument.removesuffix("s") in finding.message
        assert (finding.file, finding.line) == (__file__, call.__code__.co_firstlineno)
        return
    assert report.ok, report.to_text()
    loss, grads = Program(graph, weights_of(model, graph)).gradients([t.numpy() for t in batch])
    model.zero_grad()
    expected = model(*batch)
    expected.backward()
    np.testing.assert_allclose(loss, expected.item(), rtol=1e-5)
    for name, grad in grads.items():
        reference = dict(model.named_parameters())[name].grad.numpy()
        np.testing.assert_allclose(grad, reference, rtol=1e-5, atol=1e-7, err_msg=name)
