"""Ranking and selection agreement between a proxy score and an exact reference (paper Table 2).

All functions take 1-D score vectors over the same eligible positions. Top-b sets use
:func:`bridgecli.core.topk.top_b` (ties prefer the lower index), as selection does.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..core.topk import top_b


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank (as ``scipy.stats.rankdata``)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(n, dtype=np.float64)
    sx = x[order]
    # boundaries of runs of equal values
    starts = np.flatnonzero(np.r_[True, sx[1:] != sx[:-1]])
    ends = np.r_[starts[1:], n]
    for s, e in zip(starts, ends):
        ranks[order[s:e]] = 0.5 * (s + e - 1) + 1.0
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho (Pearson correlation of average ranks); NaN when either side is constant or
    there are fewer than two positions."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"shapes differ: {x.shape} vs {y.shape}")
    if x.shape[0] < 2:
        return math.nan
    rx, ry = rankdata(x), rankdata(y)
    rx -= rx.mean()
    ry -= ry.mean()
    den = math.sqrt(float((rx * rx).sum()) * float((ry * ry).sum()))
    if den == 0.0:
        return math.nan
    return float((rx * ry).sum() / den)


def bottom_b(scores: np.ndarray, b: int) -> np.ndarray:
    """Indices of the ``b`` smallest entries (ties prefer the higher index: the mirror of top_b)."""
    s = np.asarray(scores, dtype=np.float64)
    n = s.shape[0]
    return np.sort(n - 1 - top_b(-s[::-1], b))


@dataclass
class Agreement:
    """One example, one side, one proxy."""

    spearman: float
    overlap: float  # |top_b(proxy) & top_b(exact)| / b
    jaccard: float  # |intersection| / |union|
    regret: float  # normalised regret in exact utility; NaN when undefined
    b: int
    size: int

    def as_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def normalised_regret(exact: np.ndarray, proxy_set: np.ndarray, b: int) -> float:
    """[U(exact top-b) - U(proxy top-b)] / [U(exact top-b) - U(exact bottom-b)], U = sum of exact
    scores over a set. In [0, 1]; NaN when the denominator is 0 (b = 0, b >= size, or all exact
    scores equal)."""
    exact = np.asarray(exact, dtype=np.float64)
    best = exact[top_b(exact, b)].sum()
    worst = exact[bottom_b(exact, b)].sum()
    den = best - worst
    if b <= 0 or b >= exact.shape[0] or den <= 0:
        return math.nan
    return float((best - exact[proxy_set].sum()) / den)


def agreement(proxy: np.ndarray, exact: np.ndarray, b: int) -> Agreement:
    proxy = np.asarray(proxy, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    n = exact.shape[0]
    b = max(0, min(int(b), n))
    sp, se = top_b(proxy, b), top_b(exact, b)
    inter = len(np.intersect1d(sp, se))
    union = len(np.union1d(sp, se))
    return Agreement(
        spearman=spearman(proxy, exact),
        overlap=inter / b if b else math.nan,
        jaccard=inter / union if union else math.nan,
        regret=normalised_regret(exact, sp, b),
        b=b,
        size=n,
    )


def summary(values) -> dict:
    """mean, std (population), count of the finite values, and how many were undefined (NaN)."""
    v = np.asarray([np.nan if x is None else x for x in values], dtype=np.float64)
    ok = v[np.isfinite(v)]
    return {
        "mean": float(ok.mean()) if ok.size else None,
        "std": float(ok.std()) if ok.size else None,
        "median": float(np.median(ok)) if ok.size else None,
        "count": int(ok.size),
        "undefined": int(v.size - ok.size),
    }
