"""device/dtypes.py: rounding to float16, bfloat16 and cb16 on float32 storage,
and where the runtime rounds: each kernel boundary of a training step, against references
written without the runtime's code (torch and ml_dtypes for float16 and bfloat16, cb16
from the list of its values).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from device.dtypes import FORMATS, round_generic, round_to
from device.runtime.program import Program
from tests.device.graphs import mlp_graph

RNG = np.random.default_rng(0)


def f32(*values):
    return np.array(values, dtype=np.float32)


def _random_magnitudes(n=200_000):
    # values spread over many binades, both signs, including each format's subnormals
    return (RNG.standard_normal(n) * np.exp2(RNG.integers(-45, 40, n))).astype(np.float32)


def _decode_cb16(bits: np.ndarray) -> np.ndarray:
    """Every cb16 bit pattern (1 sign, 6 exponent bits with bias 31, 9 mantissa bits) as float64."""
    sign = np.where(bits >> 15, -1.0, 1.0)
    exponent = (bits >> 9) & 0x3F
    mantissa = (bits & 0x1FF) / 512.0
    normal = sign * np.exp2(exponent.astype(np.float64) - 31) * (1 + mantissa)
    subnormal = sign * 2.0**-30 * mantissa
    value = np.where(exponent == 0, subnormal, normal)
    return np.where(exponent == 63, np.where(mantissa == 0, sign * np.inf, np.nan), value)


def test_format_constants():
    cb16 = FORMATS["cb16"]
    assert (cb16.exponent_bits, cb16.mantissa_bits, cb16.bias) == (6, 9, 31)
    assert cb16.max == (2 - 2**-9) * 2**31
    assert (cb16.min_normal, cb16.min_subnormal) == (2.0**-30, 2.0**-39)
    assert FORMATS["float16"].max == 65504.0 and FORMATS["float16"].min_subnormal == 2.0**-24
    assert FORMATS["bfloat16"].max == (2 - 2**-7) * 2.0**127


@pytest.mark.parametrize("fmt, values, expected", [
    # float16: 10 mantissa bits; ties go to the even neighbour
    ("float16", f32(1 + 2**-11, 1 + 3 * 2**-11, 65504, 65519, 65520, -65520, 2**-24, 2**-25, 3 * 2**-25),
     f32(1, 1 + 2**-9, 65504, 65504, np.inf, -np.inf, 2**-24, 0, 2**-23)),
    # bfloat16: 7 mantissa bits, float32's exponent range
    ("bfloat16", f32(1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, (1 + 2**-7 + 2**-9) * 2.0**120, -3.4e38, 2**-133),
     f32(1, 1 + 2**-6, 1 + 2**-7, (1 + 2**-7) * 2.0**120, -np.inf, 2**-133)),
    # cb16: 9 mantissa bits, largest (2 - 2**-9) * 2**31, subnormals down to 2**-39
    ("cb16", f32(1 + 2**-10, 1 + 3 * 2**-10, (2 - 2**-9) * 2**31, (2 - 2**-9) * 2**31 + 2**21 - 256,
                 (2 - 2**-9) * 2**31 + 2**21, -2.0**33, 2**-39, 2**-40, 3 * 2**-40, 2**-30 * 1.5),
     f32(1, 1 + 2**-8, (2 - 2**-9) * 2**31, (2 - 2**-9) * 2**31, np.inf, -np.inf, 2**-39, 0, 2**-38, 2**-30 * 1.5)),
])
def test_known_values(fmt, values, expected):
    got = round_to(values, fmt)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_specials_and_signs_survive(fmt):
    got = round_to(f32(np.inf, -np.inf, np.nan, 0.0, -0.0), fmt)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2])
    assert got[3] == 0 and not np.signbit(got[3]) and np.signbit(got[4])
    # a NaN whose payload sits only in the low bits must not turn into inf
    quiet_low = np.array([0x7F800001], dtype=np.uint32).view(np.float32)
    assert np.isnan(round_to(quiet_low, fmt)[0])


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_rounding_is_idempotent_and_odd(fmt):
    x = _random_magnitudes()
    once = round_to(x, fmt)
    np.testing.assert_array_equal(round_to(once, fmt), once)
    np.testing.assert_array_equal(round_to(-x, fmt), -once)
    finite = np.isfinite(once)
    relative = np.abs(once[finite] - x[finite]) / np.maximum(np.abs(x[finite]), FORMATS[fmt].min_normal)
    assert relative.max() <= 2.0 ** -(FORMATS[fmt].mantissa_bits + 1)  # half an ulp


def test_every_float16_value_round_trips():
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(halves)
    np.testing.assert_array_equal(round_to(halves[finite], "float16"), halves[finite])


def test_every_cb16_value_round_trips_and_midpoints_tie_to_even():
    bits = np.arange(2**15, dtype=np.int64)  # the positive half; rounding is odd-symmetric
    values = _decode_cb16(bits)
    finite = np.isfinite(values)
    values, mantissa_even = values[finite], (bits[finite] & 1) == 0
    np.testing.assert_array_equal(round_to(values.astype(np.float32), "cb16"), values)
    # halfway between two neighbours (exact in float32): the one with an even mantissa
    low, high = values[:-1], values[1:]
    midpoint = ((low + high) / 2).astype(np.float32)
    expected = np.where(mantissa_even[:-1], low, high)
    np.testing.assert_array_equal(round_to(midpoint, "cb16"), expected)
    # just off the midpoint: the nearer neighbour
    np.testing.assert_array_equal(round_to(np.nextafter(midpoint, np.float32(0)), "cb16"), low)
    np.testing.assert_array_equal(round_to(np.nextafter(midpoint, np.float32(np.inf)), "cb16"), high)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16"])
def test_generic_rounding_agrees_with_the_fast_paths(fmt):
    x = np.concatenate([_random_magnitudes(), f32(65504, 65520, 3.4e38, -3.4e38, 1e-45)])
    np.testing.assert_array_equal(round_generic(x, FORMATS[fmt]), round_to(x, fmt))


def test_bfloat16_matches_torch():
    torch = pytest.importorskip("torch")
    x = _random_magnitudes()
    np.testing.assert_array_equal(round_to(x, "bfloat16"), torch.from_numpy(x).bfloat16().float().numpy())


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_other_inputs_are_rounded_from_their_float32_value(fmt):
    """float64 (or a list) is first made float32, as the runtime stores it: one rounding from
    there, not one from the float64 value (which can differ next to a midpoint)."""
    midpoint = 1 + 2.0 ** -FORMATS[fmt].mantissa_bits / 2  # between 1 and the next value: ties to 1
    x = [midpoint + 2.0**-40, 3.0, -0.1]  # in float64 just above the midpoint, in float32 on it
    expected = round_to(np.array(x, np.float32), fmt)
    assert expected[0] == 1.0
    for given in (x, np.array(x), np.array(x, np.float64)):
        got = round_to(given, fmt)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(round_generic(np.array(x), FORMATS[fmt]), expected)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_overflow_and_nan_round_without_warnings(fmt):
    """inf from overflow and NaN passing through are the intended results, not numpy warnings
    (which a run would print for every batch)."""
    signalling_nan = np.array([0x7F800001], dtype=np.uint32).view(np.float32)[0]
    x = f32(3.4028235e38, -3.4028235e38, np.nan, np.inf, 1.0, signalling_nan)  # float32 max: rounds up past it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = round_to(x, fmt)
        generic = round_generic(x, FORMATS[fmt])
    np.testing.assert_array_equal(got, generic)
    assert np.isnan(got[2]) and got[3] == np.inf and got[4] == 1.0 and np.isnan(got[5])


def test_float32_is_untouched_and_unknown_formats_fail():
    x = _random_magnitudes(100)
    np.testing.assert_array_equal(round_to(x, "float32"), x)
    with pytest.raises(ValueError, match="unknown number format"):
        round_to(x, "fp8")


# ------------------------------------------------ independent definitions of the formats


def _cb16_reference(x: np.ndarray) -> np.ndarray:
    """cb16 rounding from the list of its values, without the runtime's arithmetic (frexp, ldexp,
    rint): the nearest value, a tie to the even bit pattern, inf from halfway past the largest."""
    bits = np.arange(63 * 512 + 1)  # every finite non-negative pattern, and the first of exponent 63
    values = np.append(_decode_cb16(bits[:-1]), 2.0**32)  # 2**32 stands for inf: ties to it (even) overflow
    even = bits % 2 == 0
    with np.errstate(invalid="ignore"):  # NaN passes through
        a = np.abs(x.astype(np.float64))
    high = np.clip(np.searchsorted(values, a), 1, len(values) - 1)  # values[high - 1] < a <= values[high]
    low = high - 1
    up = (values[high] - a < a - values[low]) | ((values[high] - a == a - values[low]) & even[high])
    rounded = np.where(up, values[high], values[low])
    rounded = np.where(rounded == 2.0**32, np.inf, rounded)
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(x), x, np.copysign(rounded, x)).astype(np.float32)


def reference_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """``x`` (float32) rounded to ``fmt`` by a library, or for cb16 by the list of its values."""
    x = np.asarray(x, np.float32)
    if fmt == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        with np.errstate(invalid="ignore"):  # NaN passes through
            return x.astype(ml_dtypes.bfloat16).astype(np.float32)
    if fmt == "float16":
        torch = pytest.importorskip("torch")
        return torch.from_numpy(x).half().float().numpy()
    return _cb16_reference(x)


def _midpoints(fmt: str, n: int = 50_000) -> np.ndarray:
    """float32 values halfway between two neighbours of ``fmt`` (in its normal range): the
    dropped bits of the float32 word are exactly one half of the format's last place."""
    dropped = 23 - FORMATS[fmt].mantissa_bits
    exponent = RNG.integers(FORMATS[fmt].min_exponent, FORMATS[fmt].max_exponent, n) + 127
    words = (RNG.integers(0, 2, n) << 31) | (exponent << 23) | RNG.integers(0, 2**23, n)
    words = (words >> dropped << dropped) | (1 << (dropped - 1))
    return words.astype(np.uint32).view(np.float32)


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_rounding_matches_an_independent_definition(fmt):
    every_word = RNG.integers(0, 2**32, 200_000).astype(np.uint32).view(np.float32)  # NaN, inf, subnormals too
    x = np.concatenate([_random_magnitudes(), _midpoints(fmt), every_word])
    np.testing.assert_array_equal(round_to(x, fmt), reference_round(x, fmt))


# ----------------------------------------------------- where a training step rounds


def _round16(fmt):
    """A kernel boundary in the reference model: the value rounded going forward, its gradient going back."""
    torch = pytest.importorskip("torch")

    class Round16(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.from_numpy(reference_round(x.detach().numpy(), fmt))

        @staticmethod
        def backward(ctx, g):
            return torch.from_numpy(reference_round(g.numpy(), fmt))

    return Round16.apply


def _reference_mlp(weights, batch, fmt):
    """mlp_graph's model in torch, fp32, with every kernel's inputs and outputs in ``fmt`` and
    the loss in fp32 (device/README.md, runtime): the loss, the logits and the gradients."""
    import torch
    import torch.nn.functional as F

    r = _round16(fmt)

    def kernel(fn, *inputs):  # inputs rounded on the way in, the output on the way out
        return r(fn(*[r(t) for t in inputs]))

    P = {name: torch.tensor(w, requires_grad=True) for name, w in weights.items()}
    h = torch.tensor(batch[0])
    for i in range(2):
        h = kernel(torch.add, kernel(torch.matmul, h, P[f"fc{i}.weight"]), P[f"fc{i}.bias"])
        h = kernel(torch.relu, h) if i == 0 else h
    loss = F.cross_entropy(h, torch.tensor(batch[1]).long())
    grads = torch.autograd.grad(loss, list(P.values()))
    return loss.item(), h.detach().numpy(), {name: g.numpy() for name, g in zip(P, grads)}


def _assert_same_16_bit_values(got, expected, fmt, what):
    """Equal, but for a few elements one unit in the last place of ``fmt`` apart: the two sum in
    another order in float32, which can move a value across a rounding midpoint."""
    ulp = 2.0 ** -FORMATS[fmt].mantissa_bits * np.maximum(np.abs(expected), FORMATS[fmt].min_normal)
    assert np.all(np.abs(got - expected) <= ulp), what
    assert np.mean(got != expected) <= 0.05, f"{what}: {np.mean(got != expected):.0%} of the values differ"


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "cb16"])
def test_every_kernel_boundary_rounds_as_the_reference(fmt):
    """Inputs and weights rounded as a kernel reads them, outputs as it writes them, gradients
    entering and leaving its backward; the loss in fp32; the master weights stay fp32."""
    pytest.importorskip("torch", reason="the reference is written in torch (absent in the TF-only env)")
    graph = mlp_graph(batch=16, sizes=(24, 32, 10), optimizer_kind="sgd", precision=fmt)
    rng = np.random.default_rng(7)
    weights = {"fc0.weight": rng.standard_normal((24, 32)) / 5, "fc0.bias": rng.standard_normal(32) / 10,
               "fc1.weight": rng.standard_normal((32, 10)) / 6, "fc1.bias": rng.standard_normal(10) / 10}
    weights = {name: w.astype(np.float32) for name, w in weights.items()}
    batch = [rng.standard_normal((16, 24)).astype(np.float32), rng.integers(0, 10, 16).astype(np.int32)]
    program = Program(graph, weights)
    expected_loss, expected_logits, expected_grads = _reference_mlp(weights, batch, fmt)

    logits = program.forward(batch, training=False)["logits"]
    _assert_same_16_bit_values(logits, expected_logits, fmt, "logits")
    loss, grads = program.gradients(batch)
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    for name, g in grads.items():
        np.testing.assert_array_equal(g, reference_round(g, fmt), err_msg=f"{name}: leaves its kernel in {fmt}")
        _assert_same_16_bit_values(g, expected_grads[name], fmt, f"gradient of {name}")

    # the update is fp32 on the fp32 master weights: p - lr * g, not rounded to the format
    program.train_step(batch, 0.1)
    for name, w in program.get_weights().items():
        np.testing.assert_array_equal(w, weights[name] - 0.1 * grads[name], err_msg=name)
        assert not np.array_equal(w, reference_round(w, fmt)), f"{name}: master weights rounded to {fmt}"
