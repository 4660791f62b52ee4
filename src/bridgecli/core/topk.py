"""Deterministic Top-b: largest scores first, ties broken by lower index."""

from __future__ import annotations

import numpy as np


def top_b(scores: np.ndarray, b: int) -> np.ndarray:
    """Indices of the ``b`` largest entries of ``scores``, sorted ascending. Ties prefer the lower
    index, so the result is a deterministic function of the scores."""
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[0]
    if b <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    if b >= n:
        return np.arange(n, dtype=np.int64)
    # a stable sort of -score: ties keep index order (the same order as lexsort((arange(n), -scores)))
    chosen = (-scores).argsort(kind="stable")[:b]
    chosen.sort()
    return chosen if chosen.dtype == np.int64 else chosen.astype(np.int64)


def top_b_forced(scores: np.ndarray, b: int, forced: np.ndarray | None = None) -> np.ndarray:
    """``forced`` (indices that must be in) plus the ``b - |forced|`` largest of the other entries, by
    :func:`top_b`'s rule; sorted ascending. When ``forced`` alone reaches ``b`` the result is ``forced``
    (which may exceed ``b``). This is the exact maximiser of ``sum(scores[S])`` over sets ``S`` of
    size ``max(b, |forced|)`` (clipped to ``len(scores)``) that contain ``forced``."""
    if forced is None or len(forced) == 0:
        return top_b(scores, b)
    scores = np.asarray(scores, dtype=np.float64)
    n = scores.shape[0]
    forced = np.unique(np.asarray(forced, dtype=np.int64))
    if forced[0] < 0 or forced[-1] >= n:
        raise ValueError(f"forced indices must lie in [0, {n}), got {forced.tolist()}")
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), forced, assume_unique=True)
    extra = rest[top_b(scores[rest], b - len(forced))] if b > len(forced) else np.zeros(0, dtype=np.int64)
    return np.sort(np.concatenate([forced, extra])).astype(np.int64)
