"""``bridge analyze decompose``: what a_j is made of, by token class (pure numpy; no model).

a_j = v . grad l_j with v = (1 - lambda) g_target / |g_target| + lambda g_anchor / |g_anchor|
(docs/method.md), so a_j = t_j + n_j with the **target part** t_j = (1 - lambda) g_target . grad l_j
/ |g_target| and the **anchor part** n_j = lambda g_anchor . grad l_j / |g_anchor|. The anchor
*decides the sign* of a token where sign(a_j) != sign(t_j). With lambda = 0, a_j would be t_j / (1 -
lambda): the share of t_j > 0 is the share of positive scores without the anchor.

The debiased score a_j - beta u_j (``debias=common``) removes the common direction from the target
part (u_j is a projection on D_val's mean residual, the common part of g_target): its target part is
t_j - beta u_j and its anchor part n_j. How much of a score is the token's id: the share of its
variance, and of its sign's, that the means per token id explain (eta squared over the ids occurring
at least ``min_count`` times), and the share of tokens carrying their id's majority sign.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..core.fit import pearson, slope

__all__ = ["pearson", "slope"]  # re-exported: the decompose report's statistics


def r_squared(y, groups) -> float | None:
    """Share of the variance of ``y`` explained by its group means (one-way ANOVA's eta squared);
    None when ``y`` is constant or empty."""
    y = np.asarray(y, dtype=np.float64)
    if len(y) == 0:
        return None
    total = float(((y - y.mean()) ** 2).sum())
    if total == 0.0:
        return None
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    means = np.bincount(inv, weights=y) / np.bincount(inv)
    return float(1.0 - ((y - means[inv]) ** 2).sum() / total)


def majority_sign_share(a, groups) -> float | None:
    """Share of the tokens whose sign (a > 0 or not) is their group's majority one."""
    a = np.asarray(a, dtype=np.float64)
    if len(a) == 0:
        return None
    _, inv = np.unique(np.asarray(groups), return_inverse=True)
    pos = np.bincount(inv, weights=(a > 0).astype(np.float64))
    count = np.bincount(inv)
    return float(np.maximum(pos, count - pos).sum() / len(a))


def split(target, anchor) -> dict:
    """What the two parts of a = target + anchor do over a set of tokens: the share of a > 0, of
    target > 0 (the scores without the anchor), the share of signs the anchor decides, the median of
    |anchor| / |target| (over tokens with target != 0), and the parts' RMS. None where undefined."""
    t, n = np.asarray(target, dtype=np.float64), np.asarray(anchor, dtype=np.float64)
    a = t + n
    k = len(a)
    nonzero = t != 0
    return {
        "tokens": k,
        "share_positive": float((a > 0).mean()) if k else None,
        "share_target_positive": float((t > 0).mean()) if k else None,
        "share_sign_set_by_anchor": float((np.sign(a) != np.sign(t)).mean()) if k else None,
        "median_anchor_over_target": float(np.median(np.abs(n[nonzero]) / np.abs(t[nonzero])))
        if nonzero.any()
        else None,
        "rms_target": float(np.sqrt((t * t).mean())) if k else None,
        "rms_anchor": float(np.sqrt((n * n).mean())) if k else None,
        "mean": float(a.mean()) if k else None,
    }


def by_class(target, anchor, classes: Sequence[str], order: Sequence[str]) -> dict:
    """:func:`split` over all tokens (``all``) and per class, in ``order`` (classes with no token left
    out)."""
    cls = np.asarray(classes)
    t, n = np.asarray(target, dtype=np.float64), np.asarray(anchor, dtype=np.float64)
    out = {"all": split(t, n)}
    for c in order:
        m = cls == c
        if m.any():
            out[c] = split(t[m], n[m])
    return out


def id_dependence(a, ids, min_count: int) -> dict:
    """How much of ``a`` its token id explains, over the ids occurring at least ``min_count`` times:
    eta squared of a and of sign(a) on the id, the share of tokens carrying their id's majority sign,
    and how many ids and what share of the tokens that covers."""
    a, ids = np.asarray(a, dtype=np.float64), np.asarray(ids, dtype=np.int64)
    uniq, counts = np.unique(ids, return_counts=True)
    m = np.isin(ids, uniq[counts >= min_count])
    return {
        "min_count": min_count,
        "ids": int((counts >= min_count).sum()),
        "share_of_tokens": float(m.mean()) if len(m) else None,
        "r2_on_id": r_squared(a[m], ids[m]) if m.any() else None,
        "r2_sign_on_id": r_squared((a[m] > 0).astype(np.float64), ids[m]) if m.any() else None,
        "majority_sign_share": majority_sign_share(a[m], ids[m]) if m.any() else None,
    }


def report(
    target,
    anchor,
    classes: Sequence[str],
    ids,
    order: Sequence[str],
    *,
    min_count: int = 20,
    u=None,
    beta: float | None = None,
) -> dict:
    """The decomposition of a = target + anchor per class and its token-id dependence; with ``u``
    and ``beta`` (the stored common direction) the same for a - beta u (target part target - beta u),
    the Pearson of each with u, and the slope these tokens themselves would give."""
    t, n = np.asarray(target, dtype=np.float64), np.asarray(anchor, dtype=np.float64)
    a = t + n
    out: dict = {
        "tokens": int(len(a)),
        "a": {"classes": by_class(t, n, classes, order), "ids": id_dependence(a, ids, min_count)},
    }
    if u is not None and beta is not None:
        u = np.asarray(u, dtype=np.float64)
        td = t - beta * u
        own_beta, own_alpha = slope(a, u)
        out["debiased"] = {
            "beta": beta,
            "pearson_a_u": pearson(a, u),
            "pearson_debiased_u": pearson(td + n, u),
            "pearson_a_debiased": pearson(a, td + n),
            "beta_of_these_tokens": own_beta,
            "intercept_of_these_tokens": own_alpha,
            "classes": by_class(td, n, classes, order),
            "ids": id_dependence(td + n, ids, min_count),
        }
    return out
