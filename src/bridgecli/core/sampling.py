"""Fixed-size unequal-probability sampling of response tokens (``select --method importance``).

A token's inclusion probability rises with a non-negative tilt score ``t_j`` and keeps a uniform floor:

    x_j = floor / n + (1 - floor) * t_j / sum(t)          (uniform x when sum(t) == 0)
    pi_j = min(1, c * x_j),  c chosen so that sum(pi) == b  (water-filling: tokens at 1 are capped)

Systematic sampling (Madow 1949) then draws exactly ``b`` tokens with exactly these first-order inclusion
probabilities: with cumulative sums ``C_j = pi_1 + ... + pi_j`` (``C_0 = 0``, ``C_n = b``) and one uniform
``u`` in [0, 1), token j is drawn when an integer lies in ``[C_{j-1} - u, C_j - u)``. Going through the
tokens in position order spreads the draw over the response.

Weighting a drawn token's loss by ``(b / n) / pi_j`` (Horvitz-Thompson) makes the expected weighted
gradient ``(b / n) * sum_j grad l_j``: the same expectation as a uniform draw of b tokens, with a variance
that depends on how well ``pi`` follows the size of each token's gradient.
"""

from __future__ import annotations

import math

import numpy as np


def inclusion_probabilities(tilt: np.ndarray, b: int, floor: float) -> np.ndarray:
    """``pi`` [n] (float64) for a fixed-size draw of ``b`` of ``n`` tokens (see the module docstring).

    ``tilt`` must be finite and >= 0; ``floor`` in [0, 1] (1: uniform, ``b / n`` each). ``sum(pi) == b``
    up to rounding, every ``pi`` in [0, 1], and ``pi`` never decreases as ``tilt`` grows (ties get equal
    ``pi``). With ``floor == 0`` and fewer than ``b`` positive tilts, the tokens of zero tilt share what
    the positive ones (all at 1) leave, uniformly."""
    t = np.asarray(tilt, dtype=np.float64)
    n = t.shape[0]
    if not 0.0 <= floor <= 1.0 or math.isnan(floor):
        raise ValueError(f"floor must lie in [0, 1], got {floor}")
    if t.size and (not np.isfinite(t).all() or (t < 0).any()):
        raise ValueError("tilt scores must be finite and >= 0")
    if b <= 0 or n == 0:
        return np.zeros(n, dtype=np.float64)
    if b >= n:
        return np.ones(n, dtype=np.float64)
    total = float(t.sum())
    if total > 0.0 and floor < 1.0:
        x = floor / n + (1.0 - floor) * (t / total)
    else:
        x = np.full(n, 1.0 / n)
    positive = x > 0
    if int(positive.sum()) < b:  # floor 0 and too few positive tilts: those at 1, the rest shares what is left
        pi = np.where(positive, 1.0, (b - int(positive.sum())) / (n - int(positive.sum())))
        return pi
    return _water_fill(x, b)


def _water_fill(x: np.ndarray, b: int) -> np.ndarray:
    """``min(1, c * x)`` with ``c`` such that the sum is ``b`` (``x > 0`` on at least ``b`` entries)."""
    order = np.argsort(-x, kind="stable")
    xs = x[order]
    # capping the k largest at 1 is consistent when c = (b - k) / sum(xs[k:]) keeps the (k+1)-th at <= 1;
    # the smallest such k is the answer, and k = b - 1 always qualifies. Written without forming c, which
    # overflows when the tail's sum is subnormal (tilts of 1e-311 beside tilts of 1).
    tail = np.cumsum(xs[::-1])[::-1]  # tail[k] = sum(xs[k:])
    k = 0
    while (b - k) * xs[k] > tail[k]:
        k += 1
    pi = np.ones_like(x)
    pi[order[k:]] = np.minimum(1.0, (b - k) * (xs[k:] / tail[k]))
    return pi


def systematic_sample(pi: np.ndarray, u: float) -> np.ndarray:
    """Ascending indices drawn by systematic sampling with inclusion probabilities ``pi`` (each in
    [0, 1], summing to an integer b up to rounding) and start ``u`` in [0, 1): exactly b of them."""
    pi = np.asarray(pi, dtype=np.float64)
    n = pi.shape[0]
    if not 0.0 <= u < 1.0:
        raise ValueError(f"u must lie in [0, 1), got {u}")
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    b = int(round(float(pi.sum())))
    if b <= 0:
        return np.zeros(0, dtype=np.int64)
    cum = np.cumsum(pi)
    cum *= b / cum[-1]  # the end at b exactly: exactly b integers in [-u, b - u)
    cum[-1] = b
    hits = np.ceil(cum - u) - np.ceil(np.concatenate(([0.0], cum[:-1])) - u)
    chosen = np.flatnonzero(hits > 0)
    if len(chosen) != b:  # rounding put two integers into one token of pi == 1 (or none into one)
        chosen = _repair(chosen, pi, b)
    return chosen.astype(np.int64)


def _repair(chosen: np.ndarray, pi: np.ndarray, b: int) -> np.ndarray:
    """Exactly ``b`` indices from a draw that rounding left one or two short or over: the largest ``pi``
    outside the draw are added, or the smallest inside it dropped (ties: the earlier index)."""
    chosen = np.asarray(chosen, dtype=np.int64)
    if len(chosen) < b:
        rest = np.setdiff1d(np.arange(len(pi), dtype=np.int64), chosen)
        extra = rest[np.argsort(-pi[rest], kind="stable")[: b - len(chosen)]]
        return np.sort(np.concatenate([chosen, extra]))
    keep = chosen[np.sort(np.argsort(-pi[chosen], kind="stable")[:b])]
    return np.sort(keep)


def ipw_weights(pi: np.ndarray, chosen: np.ndarray, b: int) -> np.ndarray:
    """The loss weights ``(b / n) / pi_j`` of the drawn tokens ``chosen`` (float64, in ``chosen``'s order):
    their expected weighted sum of per-token gradients is that of a uniform draw of ``b`` of the ``n``."""
    pi = np.asarray(pi, dtype=np.float64)
    n = pi.shape[0]
    if n == 0 or len(chosen) == 0:
        return np.zeros(0, dtype=np.float64)
    return (b / n) / pi[np.asarray(chosen, dtype=np.int64)]
