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

KB = 1e3
MB = 1e6
GB = 1e9
TB = 1e12
KiB = 2**10
MiB = 2**20
GiB = 2**30

__all__ = [
    "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB",
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
