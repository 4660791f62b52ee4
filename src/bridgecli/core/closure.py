"""Structure-aware projection: segmenter spans -> token units -> exact 0/1 knapsack.

q(u) = |u|^(-alpha) * sum_{j in u} score_j. Choose units maximising sum q(u) subject to
sum |u| <= b_r; units with q(u) <= 0 are never chosen (paper eq. "closure_projection",
METHOD_NOTES "Structure-aware projection").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def units_from_spans(token_spans: np.ndarray, char_spans: list[tuple[int, int]]) -> list[np.ndarray]:
    """Partition tokens into units. ``token_spans`` is [n, 2] character ranges of the tokens (in the
    same coordinates as ``char_spans``). A token joins the span it overlaps most (ties: the earlier
    span); tokens that overlap no span become units of their own. Units come back in token order,
    each an ascending array of token indices."""
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    n = token_spans.shape[0]
    spans = sorted((int(s), int(e)) for s, e in char_spans if e > s)
    owner = np.full(n, -1, dtype=np.int64)
    if spans and n:
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        ends = np.array([e for _, e in spans], dtype=np.int64)
        overlap = (np.minimum(token_spans[:, 1:2], ends[None, :])
                   - np.maximum(token_spans[:, 0:1], starts[None, :]))  # [n, S]
        best = overlap.argmax(axis=1)  # argmax returns the first maximum: ties go to the earlier span
        has = overlap[np.arange(n), best] > 0
        owner[has] = best[has]
    units: list[np.ndarray] = []
    t = 0
    while t < n:
        if owner[t] < 0:
            units.append(np.array([t], dtype=np.int64))
            t += 1
            continue
        u = t
        while u < n and owner[u] == owner[t]:
            u += 1
        units.append(np.arange(t, u, dtype=np.int64))
        t = u
    return units


def unit_values(units: list[np.ndarray], scores: np.ndarray, alpha: float) -> np.ndarray:
    """q(u) = |u|^(-alpha) * sum of the unit's scores."""
    scores = np.asarray(scores, dtype=np.float64)
    return np.array([scores[u].sum() * (len(u) ** (-alpha)) for u in units], dtype=np.float64)


def knapsack(weights: np.ndarray, values: np.ndarray, capacity: int) -> np.ndarray:
    """Exact 0/1 knapsack by dynamic programming in O(len(weights) * capacity).

    Returns the ascending indices of a value-maximising item set with total weight <= capacity.
    Items with value <= 0 or weight > capacity are never chosen. Among equal-value solutions the
    DP keeps the earlier decision (an item is taken only when it strictly improves), so the result
    is deterministic."""
    weights = np.asarray(weights, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    capacity = int(capacity)
    if capacity <= 0:
        return np.zeros(0, dtype=np.int64)
    items = [i for i in range(len(weights)) if values[i] > 0 and 0 < weights[i] <= capacity]
    dp = np.zeros(capacity + 1, dtype=np.float64)
    take = np.zeros((len(items), capacity + 1), dtype=bool)
    for row, i in enumerate(items):
        w, v = int(weights[i]), values[i]
        cand = dp[:-w] + v if w > 0 else dp + v
        better = cand > dp[w:]
        take[row, w:] = better
        dp[w:] = np.where(better, cand, dp[w:])
    chosen = []
    c = capacity
    for row in range(len(items) - 1, -1, -1):
        if take[row, c]:
            i = items[row]
            chosen.append(i)
            c -= int(weights[i])
    return np.array(sorted(chosen), dtype=np.int64)


@dataclass
class Projection:
    units: list[np.ndarray]
    chosen: np.ndarray
    supervise: np.ndarray  # ascending indices of supervised tokens


def project(units: list[np.ndarray], scores: np.ndarray, b_r: int, alpha: float) -> Projection:
    """Choose whole units by knapsack under budget ``b_r``; return the chosen units and tokens."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    q = unit_values(units, scores, alpha)
    sizes = np.array([len(u) for u in units], dtype=np.int64)
    chosen = knapsack(sizes, q, b_r)
    supervise = np.sort(np.concatenate([units[k] for k in chosen])) if len(chosen) else np.zeros(0, dtype=np.int64)
    return Projection(units=units, chosen=chosen, supervise=supervise)
