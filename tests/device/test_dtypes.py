"""device/dtypes.py: rounding to float16, bfloat16 and cb16 on float32 storage."""

from __future__ import annotations

import numpy as np
import pytest

from device.dtypes import FORMATS, round_generic, round_to

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


def test_float32_is_untouched_and_unknown_formats_fail():
    x = _random_magnitudes(100)
    np.testing.assert_array_equal(round_to(x, "float32"), x)
    with pytest.raises(ValueError, match="unknown number format"):
        round_to(x, "fp8")
