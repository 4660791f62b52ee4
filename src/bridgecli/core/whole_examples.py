"""Selections of whole examples (``select --method example-importance`` and ``--method rho-loss``).

An example-level selection keeps a share of the stream's examples whole (every prompt token
executed, every response token and the EOS supervised) and leaves the others out (no training row).
The population is the examples with at least one eligible response token (an example without one
has nothing to train on and is never kept); ``k = ceil(rho * N)`` of its ``N`` examples are kept,
computed on the decimal value of rho as every budget is (:func:`bridgecli.core.budgets.budget`:
``rho = 0.5`` keeps 3,387 of 6,773).

- :func:`draw_examples`: an unequal-probability draw of exactly ``k`` examples with the inclusion
  probabilities of :func:`~bridgecli.core.sampling.inclusion_probabilities` (a tilt per example,
  a uniform ``floor`` share, water-filled at 1), by systematic sampling over the examples in a
  random order (Hartley and Rao 1962): each example has a random sort key, so the draw does not
  follow the stream's order (with equal probabilities it is a simple random sample, where systematic
  sampling in stream order at rho 0.5 could only take every other example), while every first-order
  inclusion probability is exactly ``pi``. :func:`~bridgecli.core.sampling.ipw_weights` gives the
  Horvitz-Thompson weights ``(k / N) / pi_i``.
- :func:`top_share`: the ``k`` examples of largest score, ties to the smaller tie-break key.

Pure numpy; the selectors in :mod:`bridgecli.builtin.whole_examples` read the scores from the stream.
"""

from __future__ import annotations

import numpy as np

from .budgets import budget
from .sampling import inclusion_probabilities, systematic_sample


def kept_count(rho: float, examples: int) -> int:
    """How many of ``examples`` a share ``rho`` keeps: ``ceil(rho * examples)`` on rho's decimal value."""
    return budget(rho, examples)


def draw_examples(tilt: np.ndarray, k: int, floor: float, keys: np.ndarray, u: float) -> tuple[np.ndarray, np.ndarray]:
    """``(pi, kept)``: the inclusion probabilities of the ``N`` examples (float64 [N], summing to
    ``min(k, N)``) and the positions of the examples drawn (ascending int64, exactly ``min(k, N)``).

    ``tilt`` [N] (finite, >= 0) leans the probabilities (:func:`inclusion_probabilities` with
    ``floor``); ``keys`` [N] order the examples for the systematic draw (ascending key, ties by
    position) and ``u`` in [0, 1) is its start."""
    tilt = np.asarray(tilt, dtype=np.float64)
    keys = np.asarray(keys, dtype=np.float64)
    n = tilt.shape[0]
    if keys.shape != (n,):
        raise ValueError(f"keys must have shape [{n}], got {list(keys.shape)}")
    if k < 0:
        raise ValueError(f"the kept count must be >= 0, got {k}")
    pi = inclusion_probabilities(tilt, k, floor)
    if n == 0 or k == 0:
        return pi, np.zeros(0, dtype=np.int64)
    order = np.lexsort((np.arange(n), keys))
    kept = order[systematic_sample(pi[order], u)]
    kept.sort()
    return pi, kept.astype(np.int64)


def top_share(scores: np.ndarray, tiebreak: np.ndarray, k: int) -> np.ndarray:
    """Positions (ascending int64) of the ``min(k, N)`` largest ``scores``; among equal scores the
    smaller ``tiebreak`` (an example's index) goes first. ``scores`` must be finite."""
    scores = np.asarray(scores, dtype=np.float64)
    tiebreak = np.asarray(tiebreak)
    n = scores.shape[0]
    if tiebreak.shape != (n,):
        raise ValueError(f"tiebreak must have shape [{n}], got {list(tiebreak.shape)}")
    if n and not np.isfinite(scores).all():
        raise ValueError("scores must be finite")
    if k <= 0 or n == 0:
        return np.zeros(0, dtype=np.int64)
    chosen = np.lexsort((tiebreak, -scores))[: min(k, n)]
    chosen.sort()
    return chosen.astype(np.int64)
