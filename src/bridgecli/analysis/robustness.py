"""Theorem 1 of the paper: when is a full-state selection robust to the opposite side's state?

One side of one example: positions X (the side being selected, |X| = N), opposite positions Y
(|Y| = n), base utilities a_i and interaction coefficients B[i, j] (i in X, j in Y), with the
additive conditional score s_i(V) = a_i + sum_{j in V} B[i, j] for V a subset of Y.

S^F = Top_b s(Y) (the full-state selection). For i in S^F, i' not in S^F, sort
d_{ii',j} = B[i, j] - B[i', j] ascending; then

    kappa_q = min_{i, i'} [ a_i - a_i' + (sum of the q smallest d_{ii',j}) ],   q = 1..n.

S^F is an optimal size-b selection for every size-q subset V iff kappa_q >= 0. When kappa_q < 0,
the minimising pair (i, i') and V = the positions of its q smallest differences give
s_i(V) < s_i'(V): swapping i out and i' in strictly improves the selection under V.

For BRIDGE: prompt side a = 0, B = beta^T (B[i, j] = A[j, i] a_j); response side a = gamma
(a_j c_j), B = beta (B[j, i] = A[j, i] a_j).

Cost O(|S^F| |X \\ S^F| n log n), vectorised in chunks of pairs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.budgets import budget
from ..core.topk import top_b
from ..format.records import Example
from .metrics import summary

#: cap on the number of floats in one chunk of sorted differences
CHUNK_FLOATS = 1 << 22


@dataclass
class Kappa:
    """kappa[q-1] for q = 1..n, the minimising pair (indices into X) per q, and S^F."""

    kappa: np.ndarray  # [n]
    pair_in: np.ndarray  # [n] i in S^F
    pair_out: np.ndarray  # [n] i' not in S^F
    selected: np.ndarray  # S^F, ascending

    @property
    def n(self) -> int:
        return self.kappa.shape[0]

    def first_negative(self) -> int | None:
        """The smallest q with kappa_q < 0, or None."""
        neg = np.flatnonzero(self.kappa < 0)
        return int(neg[0]) + 1 if neg.size else None

    def robust_from(self) -> int:
        """The smallest q0 such that kappa_q >= 0 for every q >= q0 (n + 1 if kappa_n < 0, which
        only float ties can cause)."""
        neg = np.flatnonzero(self.kappa < 0)
        return int(neg[-1]) + 2 if neg.size else 1


def full_state_selection(a: np.ndarray, B: np.ndarray, b: int) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    return top_b(a + B.sum(axis=1), b)


def kappa(a: np.ndarray, B: np.ndarray, selected: np.ndarray) -> Kappa:
    """kappa_q for q = 1..n for the selection ``selected`` (indices into X). Needs
    1 <= |selected| < N and n >= 1 (ValueError otherwise)."""
    a = np.asarray(a, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    N, n = B.shape
    if a.shape != (N,):
        raise ValueError(f"a has shape {a.shape}, expected ({N},)")
    sel = np.asarray(selected, dtype=np.int64)
    mask = np.zeros(N, dtype=bool)
    mask[sel] = True
    rest = np.flatnonzero(~mask)
    sel = np.flatnonzero(mask)
    if sel.size == 0 or rest.size == 0 or n == 0:
        raise ValueError("kappa needs 1 <= b < |X| and a non-empty opposite side")
    best = np.full(n, np.inf)
    arg_in = np.zeros(n, dtype=np.int64)
    arg_out = np.zeros(n, dtype=np.int64)
    chunk = max(1, CHUNK_FLOATS // (rest.size * n))
    for start in range(0, sel.size, chunk):
        rows = sel[start : start + chunk]
        d = B[rows, None, :] - B[None, rest, :]  # [c, r, n]
        d.sort(axis=-1)
        vals = np.cumsum(d, axis=-1) + (a[rows, None] - a[None, rest])[..., None]  # [c, r, n]
        flat = vals.reshape(-1, n)
        k = flat.argmin(axis=0)  # first minimum: lowest (i, i') in row-major order
        v = flat[k, np.arange(n)]
        better = v < best
        best[better] = v[better]
        arg_in[better] = rows[k[better] // rest.size]
        arg_out[better] = rest[k[better] % rest.size]
    return Kappa(kappa=best, pair_in=arg_in, pair_out=arg_out, selected=sel)


def witness(B: np.ndarray, i: int, i_out: int, q: int) -> np.ndarray:
    """V: the opposite positions of the q smallest d_{i i', j} (ascending indices)."""
    B = np.asarray(B, dtype=np.float64)
    d = B[i] - B[i_out]
    return np.sort(np.argsort(d, kind="stable")[:q]).astype(np.int64)


def conditional(a: np.ndarray, B: np.ndarray, V: np.ndarray) -> np.ndarray:
    """s(V) = a + sum_{j in V} B[:, j]."""
    return np.asarray(a, dtype=np.float64) + np.asarray(B, dtype=np.float64)[:, np.asarray(V, dtype=np.int64)].sum(
        axis=1
    )


def is_optimal(a: np.ndarray, B: np.ndarray, selected: np.ndarray, V: np.ndarray) -> bool:
    """Whether ``selected`` is an optimal size-b set for s(V): its minimum is >= the rest's maximum."""
    s = conditional(a, B, V)
    mask = np.zeros(s.shape[0], dtype=bool)
    mask[np.asarray(selected, dtype=np.int64)] = True
    return bool(s[mask].min() >= s[~mask].max())


def brute_force(a: np.ndarray, B: np.ndarray, selected: np.ndarray, q: int) -> tuple[bool, np.ndarray | None]:
    """Check every size-q subset V: (optimal for all, a V where it is not or None). Exponential: tests only."""
    n = np.asarray(B).shape[1]
    for V in itertools.combinations(range(n), q):
        if not is_optimal(a, B, selected, np.array(V, dtype=np.int64)):
            return False, np.array(V, dtype=np.int64)
    return True, None


def side_problem(side: str, a: np.ndarray, c: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a_i, B) of Theorem 1 for BRIDGE's ``prompt`` or ``response`` side, from the stored scores
    (A is [n_resp, m_prompt])."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    beta = np.asarray(A, dtype=np.float64) * a[:, None]  # [n, m]
    if side == "prompt":
        return np.zeros(beta.shape[1]), beta.T.copy()
    if side == "response":
        return a * c, beta
    raise ValueError(f"unknown side {side!r}")


# ------------------------------------------------------------------------------------ the report


def _abs(positions: np.ndarray, idx) -> list[int]:
    return positions[np.asarray(idx, dtype=np.int64)].tolist()


def example_side(side: str, ex: Example, rho_side: float, rho_opp: float, full: bool) -> dict:
    """Theorem 1 on one side of one scored example at budgets b = ceil(rho * size): the full-state
    selection, kappa_q for every q, its first negative q, and the improving swaps that witness it
    (positions are the example's token positions). ``full``: every q's swap, not only two."""
    sc = ex.scores
    assert sc is not None  # a stream at stage "scores" (steps/analyze.py checks)
    a_x, B = side_problem(side, sc.a.numpy(), sc.c.numpy(), sc.A.numpy())
    N, n = B.shape
    own = ex.tokens.prompt_positions() if side == "prompt" else ex.tokens.response_positions()
    opp = ex.tokens.response_positions() if side == "prompt" else ex.tokens.prompt_positions()
    b, b_opp = budget(rho_side, N), budget(rho_opp, n)
    out: dict = {"size": N, "opposite": n, "b": b, "b_opposite": b_opp}
    if not 1 <= b < N or n == 0:
        out["undefined"] = "needs 1 <= b < |X| and a non-empty opposite side"
        return out
    sel = full_state_selection(a_x, B, b)
    k = kappa(a_x, B, sel)

    def swap(q: int) -> dict:
        i, i2 = int(k.pair_in[q - 1]), int(k.pair_out[q - 1])
        V = witness(B, i, i2, q)
        s = conditional(a_x, B, V)
        return {
            "q": q,
            "kappa": float(k.kappa[q - 1]),
            "out": int(own[i]),
            "in": int(own[i2]),
            "V": _abs(opp, V),
            "gain": float(s[i2] - s[i]),
        }

    first_neg = k.first_negative()
    out.update(
        {
            "selected": _abs(own, sel),
            "kappa": [float(x) for x in k.kappa],
            "pairs": [[int(own[i]), int(own[j])] for i, j in zip(k.pair_in, k.pair_out)],
            "first_negative_q": first_neg,
            "robust_from_q": k.robust_from(),
            "kappa_at_b_opposite": float(k.kappa[b_opp - 1]) if b_opp >= 1 else None,
            "robust_at_b_opposite": bool(k.kappa[b_opp - 1] >= 0) if b_opp >= 1 else None,
            "swap_at_first_negative": swap(first_neg) if first_neg is not None else None,
            "swap_at_b_opposite": swap(b_opp) if b_opp >= 1 and k.kappa[b_opp - 1] < 0 else None,
        }
    )
    if full:
        out["swaps"] = [swap(q) for q in range(1, n + 1) if k.kappa[q - 1] < 0]
    return out


def _mean_or_none(values: list) -> float | None:
    """The mean of the values that are not None; None when none is."""
    known = [v for v in values if v is not None]
    return float(np.mean(known)) if known else None


def table(examples: list[dict]) -> list[dict]:
    """One row per side over the examples' :func:`example_side` results (``{"prompt": ...,
    "response": ...}`` each): how many are defined, mean budgets, the share robust at the opposite
    budget and at every q, and where kappa first turns negative (as a fraction of the opposite side).
    "Robust at the opposite budget" is over the examples whose opposite side keeps a token: an
    opposite budget of 0 (``--rho-p 0`` / ``--rho-r 0``) is q = 0, outside Theorem 1's q = 1..n, and
    gives None when every example has it."""
    rows: list[dict[str, Any]] = []
    for side in ("prompt", "response"):
        defined = [e[side] for e in examples if "kappa" in e[side]]
        if not defined:
            rows.append({"side": side, "examples": 0})
            continue
        frac_first = [(d["first_negative_q"] / d["opposite"]) if d["first_negative_q"] else None for d in defined]
        rows.append(
            {
                "side": side,
                "examples": len(defined),
                "undefined": len(examples) - len(defined),
                "mean_b": float(np.mean([d["b"] for d in defined])),
                "mean_b_opposite": float(np.mean([d["b_opposite"] for d in defined])),
                "robust_at_b_opposite": _mean_or_none([d["robust_at_b_opposite"] for d in defined]),
                "robust_at_every_q": float(np.mean([d["first_negative_q"] is None for d in defined])),
                "first_negative_fraction": summary([x for x in frac_first if x is not None]),
                "robust_from_fraction": summary([(d["robust_from_q"] - 1) / d["opposite"] for d in defined]),
            }
        )
    return rows
