"""Structure-aware projection: segmenter spans -> token units -> exact 0/1 knapsack.

q(u) = |u|^(-alpha) * sum_{j in u} score_j. Choose units maximising sum q(u) subject to
sum |u| <= b_r; units with q(u) <= 0 are never chosen (paper eq. "closure_projection",
docs/method.md, "Closure").
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

import numpy as np

#: Text pieces a unit boundary never cuts: a GSM8K calculation ``<<...>>`` with the number right after it
#: (``<<5*3=15>>15``), a number (``1,000.5``), a word (letters/digits/underscore, inner apostrophes:
#: ``don't``). Tried in this order at each position.
ATOM = re.compile(r"<<[^<>\r\n]*>>(?:\d+(?:[.,]\d+)*)?|\d+(?:[.,]\d+)*|\w+(?:['’]\w+)*")


def atoms(text: str) -> list[tuple[int, int]]:
    """``[start, end)`` of every word, number and ``<<...>>`` calculation of ``text`` (sorted, disjoint)."""
    return [m.span() for m in ATOM.finditer(text)]


def _widen(spans: list[tuple[int, int]], pieces: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Grow each span to cover every atom it cuts (an atom partly inside joins the span), then merge
    spans that come to overlap."""
    if not pieces:
        return spans
    return _widen_to(spans, [a for a, _ in pieces], [b for _, b in pieces])


def _widen_to(spans: list[tuple[int, int]], starts: list[int], ends: list[int]) -> list[tuple[int, int]]:
    """:func:`_widen` with the atoms given as their ascending starts and ends."""
    out: list[tuple[int, int]] = []
    for s, e in spans:
        k = bisect_right(ends, s)  # first atom ending after s
        if k < len(starts) and starts[k] < s:
            s = starts[k]
        k = bisect_left(starts, e) - 1  # last atom starting before e
        if k >= 0 and ends[k] > e:
            e = ends[k]
        if out and s < out[-1][1]:
            out[-1] = (min(out[-1][0], s), max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def _joined(token_spans: np.ndarray, pieces: list[tuple[int, int]]) -> np.ndarray:
    """``joined[t]`` is True when tokens t and t+1 share an atom (both overlap it), so no unit boundary
    may fall between them."""
    n = token_spans.shape[0]
    if n < 2 or not pieces:
        return np.zeros(max(n - 1, 0), dtype=bool)
    bounds = np.array(pieces, dtype=np.int64)
    return _joined_to(token_spans, bounds[:, 0], bounds[:, 1])


def _joined_to(token_spans: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """:func:`_joined` (for at least two tokens and one atom) with the atoms' starts and ends as arrays."""
    s, e = token_spans[:, 0], token_spans[:, 1]
    lo = ends.searchsorted(s, side="right")  # atoms [lo, hi) overlap the token (empty when s == e)
    hi = np.where(e > s, starts.searchsorted(e, side="left"), lo)
    return np.maximum(lo[:-1], lo[1:]) < np.minimum(hi[:-1], hi[1:])


def units_from_spans(
    token_spans: np.ndarray, char_spans: list[tuple[int, int]], text: str | None = None
) -> list[np.ndarray]:
    """Partition tokens into units. ``token_spans`` is [n, 2] character ranges of the tokens (in the
    same coordinates as ``char_spans``). A token joins the span it overlaps most (ties: the earlier
    span); tokens that overlap no span become units of their own. Units come back in token order,
    each an ascending array of token indices (consecutive ones: see :func:`unit_cuts`).

    With ``text`` (the characters those coordinates index), no unit boundary falls inside a word, a
    number or a ``<<...>>`` calculation (:data:`ATOM`): a span that cuts one grows to cover it, and
    two neighbouring tokens that share one always end up in the same unit ("hamb" + "urger")."""
    cuts = unit_cuts(token_spans, char_spans, text)
    return [np.arange(a, b, dtype=np.int64) for a, b in zip(cuts, cuts[1:])]


def unit_cuts(token_spans: np.ndarray, char_spans: list[tuple[int, int]], text: str | None = None) -> list[int]:
    """:func:`units_from_spans`'s units as cut points: unit k holds tokens ``cuts[k]`` to ``cuts[k + 1] - 1``
    (``cuts[0] == 0``, ``cuts[-1] == n``; ``[0]`` when there are no tokens)."""
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    n = token_spans.shape[0]
    if n == 0:
        return [0]
    spans = sorted((int(s), int(e)) for s, e in char_spans if e > s)
    pieces = atoms(text) if text is not None else []
    if pieces:
        p_starts, p_ends = [a for a, _ in pieces], [b for _, b in pieces]
        spans = _widen_to(spans, p_starts, p_ends)
    if spans:
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        ends = np.array([e for _, e in spans], dtype=np.int64)
        overlap = np.minimum(token_spans[:, 1:2], ends[None, :]) - np.maximum(
            token_spans[:, 0:1], starts[None, :]
        )  # [n, S]
        best = overlap.argmax(axis=1)  # argmax returns the first maximum: ties go to the earlier span
        owner = np.where(overlap[np.arange(n), best] > 0, best, -1)
        # a unit starts at every token that owns no span, and wherever the owning span changes
        new = owner < 0
        new[1:] |= owner[1:] != owner[:-1]
        new[0] = True
        cuts = np.flatnonzero(new)
    else:
        cuts = np.arange(n, dtype=np.int64)  # every token its own unit
    if pieces and len(cuts) > 1:  # a unit whose first token shares an atom with the one before joins it
        rest = cuts[1:]
        joined = _joined_to(token_spans, np.array(p_starts, dtype=np.int64), np.array(p_ends, dtype=np.int64))
        cuts = np.concatenate([cuts[:1], rest[~joined[rest - 1]]])
    return cuts.tolist() + [n]


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
    w_list, v_list = weights.tolist(), values.tolist()
    items = [i for i in range(len(w_list)) if v_list[i] > 0 and 0 < w_list[i] <= capacity]
    if sum(w_list[i] for i in items) <= capacity:
        return _all_fit(items, values)
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


def _all_fit(items: list[int], values: np.ndarray) -> np.ndarray:
    """:func:`knapsack`'s answer when its ``items`` all fit together, without the table. Every capacity
    from the items' total weight up then holds the value ``S_k`` of the first k items, summed in order
    (adding a positive value never lowers a float sum, so no subset does better), and the DP takes item
    k exactly when ``S_{k-1} + v_k > S_{k-1}`` in float64: all of them, unless a value is below the
    rounding of the sum so far."""
    chosen, total = [], 0.0
    for i in items:
        more = total + float(values[i])
        if more > total:
            chosen.append(i)
            total = more
    return np.array(chosen, dtype=np.int64)


@dataclass
class Projection:
    units: list[np.ndarray]
    chosen: np.ndarray
    supervise: np.ndarray  # ascending indices of supervised tokens


def project(
    units: list[np.ndarray], scores: np.ndarray, b_r: int, alpha: float, protected: np.ndarray | None = None
) -> Projection:
    """Choose whole units by knapsack under budget ``b_r``; return the chosen units and tokens.

    ``protected`` (token indices) forces in every unit holding one of them, whatever its value; those
    units count against ``b_r`` and the knapsack fills what is left (exact: the best unit set under the
    budget among those containing the forced units). Forced units alone may exceed ``b_r``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    q = unit_values(units, scores, alpha)
    sizes = np.array([len(u) for u in units], dtype=np.int64)
    forced = forced_units(units, protected)
    if len(forced):
        rest = np.setdiff1d(np.arange(len(units), dtype=np.int64), forced, assume_unique=True)
        extra = rest[knapsack(sizes[rest], q[rest], b_r - int(sizes[forced].sum()))]
        chosen = np.sort(np.concatenate([forced, extra])).astype(np.int64)
    else:
        chosen = knapsack(sizes, q, b_r)
    supervise = np.sort(np.concatenate([units[k] for k in chosen])) if len(chosen) else np.zeros(0, dtype=np.int64)
    return Projection(units=units, chosen=chosen, supervise=supervise)


def forced_units(units: list[np.ndarray], protected: np.ndarray | None) -> np.ndarray:
    """Ascending indices of the units that hold at least one of the ``protected`` token indices."""
    if protected is None or len(protected) == 0:
        return np.zeros(0, dtype=np.int64)
    protected = np.asarray(protected, dtype=np.int64)
    return np.array([k for k, u in enumerate(units) if np.isin(u, protected).any()], dtype=np.int64)


def np_sum(x: list[float], lo: int, n: int) -> float:
    """``np.sum`` of the float64 values ``x[lo:lo + n]``, bit for bit: numpy adds the pairwise sum of the
    values (blocks of at most 128, halved at multiples of 8; eight running sums inside a block, added in a
    tree, then the rest one by one) to 0.0. ``tests/test_closure_cuts.py`` checks it against numpy."""
    if n < 8:
        total = 0.0
        for i in range(lo, lo + n):
            total += x[i]
        return 0.0 + total
    return 0.0 + _pairwise(x, lo, n)


def _pairwise(x: list[float], lo: int, n: int) -> float:
    if n < 8:
        total = 0.0
        for i in range(lo, lo + n):
            total += x[i]
        return total
    if n <= 128:
        r0, r1, r2, r3, r4, r5, r6, r7 = x[lo : lo + 8]
        i, stop = lo + 8, lo + n - n % 8
        while i < stop:
            r0 += x[i]
            r1 += x[i + 1]
            r2 += x[i + 2]
            r3 += x[i + 3]
            r4 += x[i + 4]
            r5 += x[i + 5]
            r6 += x[i + 6]
            r7 += x[i + 7]
            i += 8
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(stop, lo + n):
            total += x[i]
        return total
    half = n // 2
    half -= half % 8
    return _pairwise(x, lo, half) + _pairwise(x, lo + half, n - half)


_COLUMNS = np.arange(7, dtype=np.int64)


def unit_sums(x: np.ndarray, cuts: list[int]) -> list[float]:
    """``float(x[cuts[u]:cuts[u + 1]].sum())`` for every unit u, bit for bit, with a few numpy calls: numpy
    sums fewer than 8 values one after another from 0.0, so the units shorter than 8 are summed as the rows
    of one matrix (padded with zeros, which change no sum), the longer ones by :func:`np_sum`."""
    k = len(cuts) - 1
    if k <= 0:
        return []
    c = np.array(cuts, dtype=np.int64)
    sizes = c[1:] - c[:-1]
    padded = np.append(x, 0.0)  # index len(x): the padding
    rows = np.where(_COLUMNS[None, :] < sizes[:, None], c[:-1, None] + _COLUMNS[None, :], len(x))
    sums = padded[rows].sum(axis=1).tolist()
    long = np.flatnonzero(sizes >= 8)
    if len(long):
        values = x.tolist()
        for u in long.tolist():
            sums[u] = np_sum(values, cuts[u], cuts[u + 1] - cuts[u])
    return sums


def project_cuts(
    cuts: list[int], scores: np.ndarray, b_r: int, alpha: float, protected: np.ndarray | None = None
) -> tuple[list[int], list[int]]:
    """:func:`project` on the units of :func:`unit_cuts` (unit k: tokens ``cuts[k]`` to ``cuts[k + 1] - 1``),
    with the same q(u) bit for bit and so the same choice: ``(chosen, forced)``, the ascending indices of
    the chosen units and of the units forced in by ``protected``."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    k = len(cuts) - 1
    sizes = [cuts[u + 1] - cuts[u] for u in range(k)]
    # q(u) as unit_values computes it: numpy's sum of the unit's scores times |u|^(-alpha)
    q = unit_sums(np.asarray(scores, dtype=np.float64), cuts)
    if alpha != 0.0:  # |u|^(-0.0) is 1.0, and q * 1.0 is q
        q = [v * (size ** (-alpha)) for v, size in zip(q, sizes)]
    forced = forced_cuts(cuts, protected)
    if forced:
        taken = set(forced)
        rest = [u for u in range(k) if u not in taken]
        budget = b_r - sum(sizes[u] for u in forced)
        extra = knapsack(
            np.array([sizes[u] for u in rest], dtype=np.int64), np.array([q[u] for u in rest], dtype=np.float64), budget
        ).tolist()
        return sorted(forced + [rest[i] for i in extra]), forced
    return knapsack(np.array(sizes, dtype=np.int64), np.array(q, dtype=np.float64), b_r).tolist(), forced


def fill_cuts(
    cuts: list[int], scores: np.ndarray, b_r: int, alpha: float, chosen: list[int]
) -> tuple[list[int], list[int]]:
    """Spend what the knapsack left of ``b_r`` (``close --fill``): ``(units, tokens)`` added to ``chosen``.

    The knapsack never takes a unit with q(u) <= 0, nor one longer than what is left, so it can leave
    budget unspent. Filling takes, from the units not chosen, the best by q(u) (ties: the earlier unit)
    that still fit, one after another; then, when budget is left, single tokens of the units still
    unchosen, the highest ``scores`` first (ties: the earlier token), until ``|supervision| ==
    min(b_r, n)``. Both lists are ascending (units: indices into the units; tokens: indices into the
    response)."""
    k = len(cuts) - 1
    sizes = [cuts[u + 1] - cuts[u] for u in range(k)]
    left = min(b_r, cuts[-1] if k > 0 else 0) - sum(sizes[u] for u in chosen)
    if left <= 0:
        return [], []
    scores = np.asarray(scores, dtype=np.float64)
    q = unit_sums(scores, cuts)
    if alpha != 0.0:
        q = [v * (size ** (-alpha)) for v, size in zip(q, sizes)]
    taken = set(chosen)
    units: list[int] = []
    for u in sorted((u for u in range(k) if u not in taken), key=lambda u: (-q[u], u)):
        if sizes[u] <= left:
            units.append(u)
            left -= sizes[u]
            if left == 0:
                break
    tokens: list[int] = []
    if left > 0:
        taken.update(units)
        rest = np.array([j for u in range(k) if u not in taken for j in range(cuts[u], cuts[u + 1])], dtype=np.int64)
        if len(rest):
            best = rest[np.argsort(-scores[rest], kind="stable")[:left]]
            tokens = sorted(best.tolist())
    return sorted(units), tokens


def forced_cuts(cuts: list[int], protected: np.ndarray | None) -> list[int]:
    """:func:`forced_units` on the units of :func:`unit_cuts`."""
    if protected is None or len(protected) == 0:
        return []
    k = len(cuts) - 1
    return sorted({u for u in (bisect_right(cuts, int(p)) - 1 for p in np.asarray(protected).tolist()) if 0 <= u < k})
