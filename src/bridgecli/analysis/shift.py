"""Finding 2 of the paper: token rankings shift with the opposite side's retention.

For opposite-side retention rho in LEVELS, the opposite side keeps ``budget(rho, size)`` tokens
(the top of its full-state score, or a random subset); each side's conditional ranking under that
state is compared with its full-retention ranking: shift = 1 - Spearman.

Surrogate rankings come from (a, c, A); exact rankings from the perturbation matrix
beta_exact[j, i] = a_j(P) - a_j(P without i) (prompt side) and a_j recomputed under each reduced
prompt (response side, computed by the caller: see :func:`prompt_states`).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.budgets import budget
from ..core.topk import top_b
from .metrics import spearman, summary

LEVELS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
SUBSETS = ("top", "random")


def opposite_states(full_scores: np.ndarray, levels, subset: str, rng: np.random.Generator | None) -> list[np.ndarray]:
    """The opposite side's retained indices at each retention level."""
    full_scores = np.asarray(full_scores, dtype=np.float64)
    size = full_scores.shape[0]
    out = []
    for rho in levels:
        b = budget(rho, size)
        if subset == "top":
            out.append(top_b(full_scores, b))
        elif subset == "random":
            if rng is None:
                raise ValueError("a random subset needs a generator")
            out.append(np.sort(rng.choice(size, size=b, replace=False)).astype(np.int64))
        else:
            raise ValueError(f"unknown subset rule {subset!r}; choose one of {', '.join(SUBSETS)}")
    return out


def surrogate_full(a, c, A) -> tuple[np.ndarray, np.ndarray]:
    """Full-state surrogate scores: Delta_p(. | all R) [m] and Delta_r(. | all P) [n]."""
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    return (A * a[:, None]).sum(axis=0), a * (c + A.sum(axis=1))


def states(a, c, A, levels, subset: str, rng=None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(S_r at each level, S_p at each level): the states the prompt side and the response side are
    valued under. ``top`` keeps the opposite side's full-state surrogate top-b (what an independent
    selection at that retention keeps)."""
    dp_full, dr_full = surrogate_full(a, c, A)
    return (opposite_states(dr_full, levels, subset, rng), opposite_states(dp_full, levels, subset, rng))


def shifts(full: np.ndarray, conditional: list[np.ndarray]) -> list[float]:
    """1 - Spearman(conditional ranking, full-retention ranking) per level (NaN when undefined)."""
    return [1.0 - spearman(cond, full) for cond in conditional]


def surrogate_shifts(a, c, A, s_r_levels, s_p_levels) -> dict[str, list[float]]:
    a = np.asarray(a, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    beta = A * a[:, None]
    dp_full, dr_full = surrogate_full(a, c, A)
    prompt = [beta[s].sum(axis=0) for s in s_r_levels]
    response = [a * (c + A[:, s].sum(axis=1)) for s in s_p_levels]
    return {"prompt": shifts(dp_full, prompt), "response": shifts(dr_full, response)}


def exact_shifts(beta_exact, a_full, s_r_levels, a_reduced_levels) -> dict[str, list[float]]:
    """``a_reduced_levels[k]`` is a_j recomputed with the prompt reduced to the k-th level's S_p."""
    beta_exact = np.asarray(beta_exact, dtype=np.float64)
    full = beta_exact.sum(axis=0)
    prompt = [beta_exact[s].sum(axis=0) for s in s_r_levels]
    return {
        "prompt": shifts(full, prompt),
        "response": shifts(np.asarray(a_full, dtype=np.float64), [np.asarray(x) for x in a_reduced_levels]),
    }


def aggregate(per_example: list[dict[str, dict[str, list[float]]]], levels) -> dict:
    """{scores: {side: [summary per level]}} over examples; ``per_example[k][scores][side]`` is a
    list over levels."""
    out: dict = {}
    for ex in per_example:
        for scores, sides in ex.items():
            for side, vals in sides.items():
                out.setdefault(scores, {}).setdefault(side, [[] for _ in levels])
                for k, v in enumerate(vals):
                    out[scores][side][k].append(v)
    return {
        scores: {
            side: [summary([None if (v is None or math.isnan(v)) else v for v in vals]) for vals in per_level]
            for side, per_level in sides.items()
        }
        for scores, sides in out.items()
    }
