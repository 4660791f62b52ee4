"""Top-b within strata (``select --method stratified``): each stratum of the response (a token class) gets
its own share of the budget, in proportion to its size, and keeps its best tokens.

``allocate`` gives the shares: b_s = floor(b n_s / n), then the remaining tokens one each to the strata
with the largest remainders (ties: the earlier stratum), never more than a stratum holds, so the shares
sum to min(b, n). ``top_b_stratified`` keeps the ``b_s`` highest scores of each stratum (ties: the lower
index, as :func:`~bridgecli.core.topk.top_b`): the exact maximiser of the sum of scores over the sets with
those per-stratum sizes.
"""

from __future__ import annotations

import numpy as np

from .topk import top_b


def allocate(sizes: list[int], b: int) -> list[int]:
    """Per-stratum budgets proportional to ``sizes`` (largest remainder), summing to ``min(b, sum(sizes))``."""
    n = sum(sizes)
    b = max(0, min(int(b), n))
    if n == 0 or b == 0:
        return [0] * len(sizes)
    shares = [b * s // n for s in sizes]
    # remainders b * s / n - floor(...) compared exactly as integers b * s mod n
    order = sorted(range(len(sizes)), key=lambda k: (-((b * sizes[k]) % n), k))
    left = b - sum(shares)
    for k in order:
        if left == 0:
            break
        if shares[k] < sizes[k]:
            shares[k] += 1
            left -= 1
    return shares


def strata_of(labels: list[str]) -> tuple[list[str], np.ndarray]:
    """(stratum names in order of first appearance, index of each token's stratum)."""
    names: list[str] = []
    index: dict[str, int] = {}
    out = np.empty(len(labels), dtype=np.int64)
    for j, label in enumerate(labels):
        if label not in index:
            index[label] = len(names)
            names.append(label)
        out[j] = index[label]
    return names, out


def top_b_stratified(scores: np.ndarray, strata: np.ndarray, b: int) -> np.ndarray:
    """Ascending indices: in every stratum (``strata[j]``, 0..S-1), its :func:`allocate` share of ``b``
    highest scores."""
    scores = np.asarray(scores, dtype=np.float64)
    strata = np.asarray(strata, dtype=np.int64)
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    count = int(strata.max()) + 1
    members = [np.flatnonzero(strata == s) for s in range(count)]
    shares = allocate([len(m) for m in members], b)
    chosen = [m[top_b(scores[m], share)] for m, share in zip(members, shares) if share]
    return np.sort(np.concatenate(chosen)).astype(np.int64) if chosen else np.zeros(0, dtype=np.int64)
