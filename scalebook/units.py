"""Units and number formatting used everywhere in the book.

The book's unit policy (see book/notation.md):

* counts of floating-point operations are ``FLOPs``; rates are ``FLOP/s``;
* sizes are in bytes, bandwidths in bytes/s, both decimal (1 GB = 1e9 bytes);
  GiB (2**30 bytes) appears only where a vendor states a capacity in GiB;
* times are in seconds, printed with an SI prefix (ms, us, ...);
* large numbers are printed in scientific notation with three significant
  figures, written the way Python reads them back: ``1.97e14``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

# Bytes per element of each HLO element type (and the usual NumPy/JAX names).
DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8,
    "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
    "s4": 0.5, "u4": 0.5, "s2": 0.25, "u2": 0.25,
    "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e4m3b11fnuz": 1,
    "f8e3m4": 1, "f8e8m0fnu": 1, "f4e2m1fn": 0.5, "token": 0,
}
_ALIASES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
            "int8": "s8", "uint8": "u8", "int16": "s16", "int32": "s32", "int64": "s64",
            "uint32": "u32", "uint64": "u64", "bool": "pred", "float8_e4m3fn": "f8e4m3fn",
            "float8_e5m2": "f8e5m2", "int4": "s4", "uint4": "u4", "complex64": "c64"}


def dtype_bytes(dtype) -> float:
    """Bytes per element of a dtype given as an HLO name ("bf16") or a NumPy/JAX dtype."""
    if not isinstance(dtype, str):
        try:
            dtype = np.dtype(dtype).name
        except TypeError:
            raise ValueError(f"dtype {dtype!r} is not a dtype") from None
    name = dtype.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one the book knows; known: "
                         f"{', '.join(sorted(DTYPE_BYTES))}")
    return DTYPE_BYTES[name]


__all__ = [
    "DTYPE_BYTES", "dtype_bytes", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB",
    "sci", "fmt_time", "fmt_bytes", "fmt_rate", "check_positive", "check_nonnegative",
    "check_positive_int",
]


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_positive(name: str, value) -> float:
    """Return ``value`` as a float, or raise a ValueError that names the argument."""
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise ValueError(f"{name} must be a positive, finite number; got {value!r}")
    return float(value)


def check_nonnegative(name: str, value) -> float:
    if not _is_real(value) or not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return float(value)


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


def sci(x: float, digits: int = 3) -> str:
    """Scientific notation with ``digits`` significant figures: ``sci(1.97e14) == '1.97e14'``.

    Numbers between 0.01 and 10,000 are printed plainly (``sci(240.5) == '240'``,
    ``sci(0.5) == '0.5'``, ``sci(2734.5) == '2734'``), since an exponent adds nothing there.
    """
    x = float(x)
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    if 1e3 <= abs(x) < 1e4:
        return f"{x:.0f}"
    if 1e-2 <= abs(x) < 1e3:
        return f"{x:.{digits}g}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}e{int(exponent)}"


_PREFIXES = [(1e0, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n"), (1e-12, "p")]


def fmt_time(seconds: float, digits: int = 3) -> str:
    """A duration with an SI prefix: ``fmt_time(0.00123) == '1.23 ms'``."""
    s = float(seconds)
    if s == 0 or not math.isfinite(s):
        return f"{s:g} s"
    if abs(s) >= 3600 * 24:
        return f"{s / 86400:.{digits}g} days"
    if abs(s) >= 3600:
        return f"{s / 3600:.{digits}g} h"
    if abs(s) >= 60:
        return f"{s / 60:.{digits}g} min"
    for scale, prefix in _PREFIXES:
        if abs(s) >= scale:
            return f"{s / scale:.{digits}g} {prefix}s"
    return f"{sci(s, digits)} s"


def fmt_bytes(n: float, digits: int = 3) -> str:
    """A size in decimal units: ``fmt_bytes(1.6e10) == '16 GB'``."""
    n = float(n)
    for scale, unit in [(1e15, "PB"), (1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")]:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}g} {unit}"
    return f"{n:.{digits}g} B"


def fmt_rate(x: float, unit: str, digits: int = 3) -> str:
    """A rate in scientific notation with its unit: ``fmt_rate(1.97e14, 'FLOP/s')``."""
    return f"{sci(x, digits)} {unit}"
