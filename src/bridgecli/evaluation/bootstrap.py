"""A percentile bootstrap interval for a token-mean over examples (pure numpy, no torch).

The statistic is a ratio of sums, ``sum(loss_sum) / sum(tokens)``: every example contributes its
summed token loss and its token count, so long examples weigh by their tokens, as in training.
Examples (not tokens) are resampled with replacement, since tokens of one example are correlated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
SEED = 0


@dataclass(frozen=True)
class Interval:
    mean: float  # the statistic on the examples themselves
    low: float
    high: float
    level: float
    resamples: int
    seed: int


def ratio_bootstrap(
    sums: Sequence[float],
    counts: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
) -> Interval:
    """``sum(sums) / sum(counts)`` with a ``level`` percentile bootstrap interval over examples.

    Resample ``b`` draws ``len(sums)`` example indices with ``numpy.random.default_rng(seed)``,
    one row of ``rng.integers`` at a time, so the draws (and the interval) depend only on the seed,
    the number of examples and ``resamples``. Every count must be positive."""
    s = np.asarray(sums, dtype=np.float64)
    c = np.asarray(counts, dtype=np.float64)
    if s.ndim != 1 or s.shape != c.shape or len(s) == 0:
        raise ValueError("sums and counts must be two non-empty sequences of the same length")
    if (c <= 0).any():
        raise ValueError("every example needs at least one token")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError("resamples must be at least 1 and level in (0, 1)")
    mean = float(s.sum() / c.sum())
    rng = np.random.default_rng(seed)
    n = len(s)
    stats = np.empty(resamples, dtype=np.float64)
    chunk = max(1, (1 << 22) // n)  # about 32 MiB of indices at a time
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        idx = rng.integers(0, n, size=(rows, n))
        stats[start : start + rows] = s[idx].sum(axis=1) / c[idx].sum(axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high), level, resamples, seed)
