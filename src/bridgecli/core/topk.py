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
    # lexsort sorts by the last key first: primary -score, secondary index.
    order = np.lexsort((np.arange(n), -scores))
    return np.sort(order[:b]).astype(np.int64)
