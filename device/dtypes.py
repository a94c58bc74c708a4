"""Every dtype of the device IR and every compute precision, in one place, and rounding to them.

The wafer keeps weights in fp32 and computes in fp32 or in a 16-bit format with fp32
accumulation (/work/shared/reference/wafer-facts.md, number formats). A graph's compute
precision (``graph.precision``, the runners' ``mixed_precision.dtype``) is one of
PRECISIONS; the emulator stores every floating value as float32 and rounds it to the
16-bit format where the device would hold it in 16 bits: at the boundary of each kernel
(device/runtime/program.py). ``round_to(x, fmt)`` returns a float32 array whose every
element is exactly representable in ``fmt``.

Formats (sign bit + exponent bits + mantissa bits, all round-to-nearest-even):

    float16   1 + 5 + 10, bias 15   IEEE 754 half
    bfloat16  1 + 8 + 7,  bias 127  the top 16 bits of a float32
    cb16      1 + 6 + 9,  bias 31   the device's own format

For all three, as in IEEE 754: the all-ones exponent holds inf and NaN, a finite value
that rounds past the largest finite one becomes inf, and subnormals are kept (gradual
underflow, not flushed to zero). So cb16's largest finite value is (2 - 2**-9) * 2**31,
its smallest normal 2**-30 and its smallest subnormal 2**-39.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Format:
    name: str
    exponent_bits: int
    mantissa_bits: int  # stored bits, without the implicit leading one

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def min_exponent(self) -> int:  # exponent of the smallest normal number
        return 1 - self.bias

    @property
    def max_exponent(self) -> int:  # the all-ones exponent field is inf/NaN
        return 2**self.exponent_bits - 2 - self.bias

    @property
    def max(self) -> float:
        return (2.0 - 2.0**-self.mantissa_bits) * 2.0**self.max_exponent

    @property
    def min_normal(self) -> float:
        return 2.0**self.min_exponent

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.min_exponent - self.mantissa_bits)


# the 16-bit compute formats, and their bit layouts
FORMATS: dict[str, Format] = {
    "float16": Format("float16", 5, 10),
    "bfloat16": Format("bfloat16", 8, 7),
    "cb16": Format("cb16", 6, 9),
}
HALF_PRECISIONS: tuple[str, ...] = tuple(FORMATS)
# the compute precisions a graph may run in: float32, or a 16-bit format (mixed precision)
PRECISIONS: tuple[str, ...] = ("float32", *HALF_PRECISIONS)

# the floating dtypes of device values (the emulator stores them all as float32)
FLOATS: tuple[str, ...] = PRECISIONS
INTEGERS: tuple[str, ...] = ("int32", "int64")
# every dtype the device computes in
DEVICE_DTYPES: tuple[str, ...] = (*FLOATS, *INTEGERS, "bool")
# what an IR value may be typed: float64 exists only so that validation can reject it (the
# frontends keep any other framework dtype the IR lacks under its framework name)
IR_DTYPES: tuple[str, ...] = (*DEVICE_DTYPES, "float64")

# bytes of one element on the device (and float64's, for the input-transmission estimate)
BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "cb16": 2, "int32": 4, "int64": 8, "bool": 1,
                         "float64": 8}

# numpy dtype of a value in the emulator: the 16-bit formats are float32 rounded to the format
EMULATOR_STORAGE: dict[str, type] = {"float32": np.float32, "float16": np.float32, "bfloat16": np.float32,
                                     "cb16": np.float32, "float64": np.float64, "int64": np.int64,
                                     "int32": np.int32, "bool": np.bool_}

# numpy dtype of a captured constant: numpy's own where it has one, float32 where numpy
# has none (bfloat16, cb16: the values are exact in float32)
NUMPY_STORAGE: dict[str, type] = {**EMULATOR_STORAGE, "float16": np.float16}


# ---------------------------------------------------------------------------- rounding


def round_to(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round a float32 array to ``fmt`` (a name in FORMATS or "float32"); float32 result."""
    x = np.asarray(x, dtype=np.float32)
    if fmt == "float32":
        return x
    if fmt == "float16":
        # numpy's float32 -> float16 conversion is IEEE round-to-nearest-even with
        # subnormals and overflow to inf
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    if fmt == "bfloat16":
        return _round_bfloat16(x)
    if fmt in FORMATS:
        return round_generic(x, FORMATS[fmt])
    raise ValueError(f"unknown number format {fmt!r}; expected float32 or one of {sorted(FORMATS)}")


def _round_bfloat16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even on the top 16 bits of each float32 word."""
    bits = x.view(np.uint32)
    # adding 0x7FFF plus the lowest kept bit rounds half to even; a carry out of the
    # mantissa bumps the exponent, and from the largest finite value reaches inf (0x7F80)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    out = rounded.view(np.float32)
    # the carry trick would turn a NaN with only low payload bits into inf
    return np.where(np.isnan(x), x, out)


def round_generic(x: np.ndarray, fmt: Format) -> np.ndarray:
    """Round float32 values to any binary format narrower than float32 (RNE, subnormals kept).

    Each value is scaled by its quantum (the spacing of ``fmt`` at that magnitude, which
    stops shrinking below the smallest normal: gradual underflow), rounded to an integer
    half-to-even, and scaled back; every step is exact in float32 except the rounding.
    """
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # overflow gives inf, as wanted; NaN and inf pass
        _, exp2 = np.frexp(x)  # x = m * 2**exp2 with 0.5 <= |m| < 1
        exponent = np.maximum(exp2 - 1, fmt.min_exponent)  # exponent of the leading bit
        quantum_exp = (exponent - fmt.mantissa_bits).astype(np.int32)
        rounded = np.ldexp(np.rint(np.ldexp(x, -quantum_exp)), quantum_exp).astype(np.float32)
    # past the largest finite value (including a round-up to the next binade) -> inf
    return np.where(np.abs(rounded) > fmt.max, np.copysign(np.float32(np.inf), x), rounded)
