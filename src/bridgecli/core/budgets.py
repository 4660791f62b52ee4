"""Per-example token budgets: b = ceil(rho * |eligible|)."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache


def budget(rho: float, eligible: int) -> int:
    """``ceil(rho * eligible)`` computed exactly on the decimal value of ``rho`` (so that
    ``budget(0.7, 10) == 7``, not 8 from floating-point rounding). ``rho`` must lie in [0, 1]."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"a retention ratio must lie in [0, 1], got {rho}")
    if eligible < 0:
        raise ValueError("eligible count must be >= 0")
    return _ceil(rho, eligible)


@lru_cache(maxsize=1 << 14)
def _ceil(rho: float, eligible: int) -> int:
    return math.ceil(_exact(rho) * eligible)


@lru_cache(maxsize=64)
def _exact(rho: float) -> Fraction:
    return Fraction(str(rho))
