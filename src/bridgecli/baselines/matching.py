"""Budget matching for the compared methods (docs/compared-methods.md, "Budget matching").

Two-sided methods (BRIDGE's schedules, ``random``, ``llm+tc``, ``tokenseek-approx``) get BRIDGE's
per-example budgets b_p = ceil(rho_p m), b_r = ceil(rho_r n). A single-side method keeps its
original scope: the side it does not select is kept whole (the prompt is executed in full, or every
response token is supervised), and the side it selects gets a budget chosen by ``match``:

- ``tokens`` (default): the same *total retained-token budget* over the stream.
  B = sum_k (b_p,k + b_r,k) (BRIDGE's total); a response-only method keeps M = sum_k m_k prompt
  tokens, so it supervises R = B - M response tokens in all (clamped to [0, N]), apportioned to the
  examples in proportion to n_k by the largest-remainder method (exact total, ties to the earlier
  example). Prompt-only methods: the same with the roles swapped.
- ``example``: the same total per example: b_r,k = clamp(b_p,k + b_r,k - m_k, 0, n_k).
- ``ratio``: the same summed ratio rho_p + rho_r (the paper's Fig. 2a): the selected side gets
  rho' = clamp(rho_p + rho_r - 1, 0, 1), b = ceil(rho' * eligible).
- ``none``: the selected side gets its own ratio (b_r = ceil(rho_r n)); no matching.

A method that ranks across examples (``ranking=global`` or ``batch``) then spends the total of its
per-example budgets over the whole stream (or each batch of consecutive examples) on the
highest-scoring tokens there, so its per-example counts vary but the total is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from ..core.budgets import budget

SCOPES = ("both", "prompt", "response")
MATCH_RULES = ("tokens", "example", "ratio", "none")
RANKINGS = ("sample", "global", "batch")


def _ceil(x: Fraction) -> int:
    return math.ceil(x)


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder, exact sum;
    equal remainders go to the earlier entry). Each share is at most its weight when
    ``total <= sum(weights)``."""
    weights = [int(w) for w in weights]
    whole = sum(weights)
    if total < 0 or (whole == 0 and total > 0):
        raise ValueError(f"cannot apportion {total} over weights summing to {whole}")
    if whole == 0:
        return [0] * len(weights)
    shares = [total * w // whole for w in weights]
    rema = [total * w % whole for w in weights]
    left = total - sum(shares)
    order = sorted(range(len(weights)), key=lambda k: (-rema[k], k))
    for k in order[:left]:
        shares[k] += 1
    return shares


@dataclass
class Matched:
    """Per-example budgets of a stream and what they add up to."""

    budgets: list[tuple[int, int]]
    summary: dict = field(default_factory=dict)


def matched_budgets(
    sizes: Sequence[tuple[int, int]], rho_p: float, rho_r: float, scope: str, match: str = "tokens"
) -> Matched:
    """Per-example (b_p, b_r) for a method of ``scope`` under the matching rule ``match``.
    ``sizes`` are the (m, n) eligible counts of the examples, in stream order."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if match not in MATCH_RULES:
        raise ValueError(f"unknown budget rule {match!r}; choose one of {', '.join(MATCH_RULES)}")
    base = [(budget(rho_p, m), budget(rho_r, n)) for m, n in sizes]
    M = sum(m for m, _ in sizes)
    N = sum(n for _, n in sizes)
    B = sum(bp + br for bp, br in base)
    summary: dict[str, Any] = {"scope": scope, "bridge_total": B, "eligible_prompt": M, "eligible_response": N}
    if scope != "both":
        summary["match"] = match
    if scope == "both":
        out = base
    else:
        # own: the selected side's sizes and budgets; other: the side kept whole
        side = 1 if scope == "response" else 0
        own = [s[side] for s in sizes]
        other = [s[1 - side] for s in sizes]
        own_base = [b[side] for b in base]
        if match == "tokens":
            target = B - sum(other)
            total = min(max(target, 0), sum(own))
            if target < 0:
                summary["unmatched_by"] = -target  # keeping the other side whole already exceeds B
            chosen = apportion(total, own)
        elif match == "example":
            chosen = []
            for (bp, br), o, w in zip(base, other, own):
                chosen.append(min(max(bp + br - o, 0), w))
        elif match == "ratio":
            rho = Fraction(str(rho_p)) + Fraction(str(rho_r)) - 1
            rho = min(max(rho, Fraction(0)), Fraction(1))
            summary["rho"] = float(rho)
            chosen = [_ceil(rho * w) for w in own]
        else:  # none
            chosen = own_base
        out = [(c, n) if side == 0 else (m, c) for c, (m, n) in zip(chosen, sizes)]
    summary["total_p"] = sum(b[0] for b in out)
    summary["total_r"] = sum(b[1] for b in out)
    summary["total"] = summary["total_p"] + summary["total_r"]
    return Matched(budgets=out, summary=summary)


def rank_across(scores: Sequence[np.ndarray], counts: Sequence[int], group: int | None = None) -> list[int]:
    """Spend the total of ``counts`` on the highest ``scores`` across examples instead of per example.

    ``scores[k]`` are example k's per-token scores; ``group=None`` ranks over all examples (global),
    ``group=g`` over each run of g consecutive examples (a batch). Order: score descending, then
    example, then position, so the result is deterministic. Returns the new per-example counts (their
    sum per group equals the sum of ``counts`` there)."""
    K = len(scores)
    out = [0] * K
    size = K if group is None else max(int(group), 1)
    for start in range(0, K, max(size, 1)):
        ks = list(range(start, min(start + size, K)))
        total = sum(int(counts[k]) for k in ks)
        if total <= 0:
            continue
        vals = np.concatenate([np.asarray(scores[k], dtype=np.float64).ravel() for k in ks]) if ks else np.zeros(0)
        owner = np.concatenate([np.full(len(scores[k]), k, dtype=np.int64) for k in ks])
        if total >= len(vals):
            picked = owner
        else:
            pos = np.arange(len(vals))  # concatenation order is (example, position)
            order = np.lexsort((pos, -vals))
            picked = owner[order[:total]]
        for k, c in zip(*np.unique(picked, return_counts=True)):
            out[int(k)] = int(c)
    return out
