"""Percentile bootstrap intervals over examples (pure numpy, no torch).

The statistic is a ratio of sums, ``sum(loss_sum) / sum(tokens)``: every example contributes its
summed token loss and its token count, so long examples weigh by their tokens, as in training.
Examples (not tokens) are resampled with replacement, since tokens of one example are correlated.
A plain mean over examples (accuracy: 1 or 0 per item; a per-item loss) is the same statistic with
every count 1.

:func:`paired_bootstrap` gives the interval of a difference between two runs on the same examples:
each resample draws one set of example indices and takes both runs' statistics on it, so what the
examples share (an item both runs find hard) cancels, and the interval is much narrower than the
two separate intervals suggest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

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
    _check(resamples, level, c)
    mean = float(s.sum() / c.sum())
    stats = _resampled(len(s), resamples, seed, lambda idx: s[idx].sum(axis=1) / c[idx].sum(axis=1))
    return _interval(mean, stats, level, resamples, seed)


def paired_bootstrap(
    a_sums: Sequence[float],
    a_counts: Sequence[float],
    b_sums: Sequence[float],
    b_counts: Sequence[float],
    *,
    resamples: int = RESAMPLES,
    level: float = LEVEL,
    seed: int = SEED,
) -> Interval:
    """``ratio(a) - ratio(b)`` (``ratio = sum(sums) / sum(counts)``) with a ``level`` percentile
    bootstrap interval, resampling examples jointly: example ``k`` is ``a_*[k]`` in run a and
    ``b_*[k]`` in run b. The draws are those of :func:`ratio_bootstrap` (same seed, same indices)."""
    arrays = [np.asarray(x, dtype=np.float64) for x in (a_sums, a_counts, b_sums, b_counts)]
    if any(x.ndim != 1 or x.shape != arrays[0].shape for x in arrays) or len(arrays[0]) == 0:
        raise ValueError("the four sequences must be non-empty and of the same length")
    sa, ca, sb, cb = arrays
    _check(resamples, level, ca, cb)
    mean = float(sa.sum() / ca.sum() - sb.sum() / cb.sum())

    def difference(idx: np.ndarray) -> np.ndarray:
        return sa[idx].sum(axis=1) / ca[idx].sum(axis=1) - sb[idx].sum(axis=1) / cb[idx].sum(axis=1)

    stats = _resampled(len(sa), resamples, seed, difference)
    return _interval(mean, stats, level, resamples, seed)


def _check(resamples: int, level: float, *counts: np.ndarray) -> None:
    if any((c <= 0).any() for c in counts):
        raise ValueError("every example needs at least one token")
    if resamples < 1 or not 0 < level < 1:
        raise ValueError("resamples must be at least 1 and level in (0, 1)")


def _resampled(n: int, resamples: int, seed: int, statistic: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``statistic`` of each resample (rows of example indices in, one value per row out), in order."""
    stats = np.empty(resamples, dtype=np.float64)
    for start, idx in _draws(n, resamples, seed):
        stats[start : start + len(idx)] = statistic(idx)
    return stats


def _draws(n: int, resamples: int, seed: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first resample, indices)`` chunks: resample ``b`` is row ``b - first`` of ``indices``, ``n``
    example indices drawn by ``numpy.random.default_rng(seed).integers`` in resample order."""
    rng = np.random.default_rng(seed)
    chunk = max(1, (1 << 22) // n)  # about 32 MiB of indices at a time
    for start in range(0, resamples, chunk):
        rows = min(chunk, resamples - start)
        yield start, rng.integers(0, n, size=(rows, n))


def _interval(mean: float, stats: np.ndarray, level: float, resamples: int, seed: int) -> Interval:
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high), level, resamples, seed)
