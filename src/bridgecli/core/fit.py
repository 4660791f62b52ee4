"""Least-squares fits of one array on another (pure numpy): Pearson's r and a line's slope. The warm-up's
common-direction fit (``debias=common``) and ``bridge analyze decompose`` both use them."""

from __future__ import annotations

import numpy as np


def pearson(x, y) -> float | None:
    """Pearson's r of two equal-length arrays; None when either is constant or shorter than 2."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2:
        return None
    xc, yc = x - x.mean(), y - y.mean()
    den = float(np.sqrt((xc * xc).sum() * (yc * yc).sum()))
    return float((xc * yc).sum() / den) if den > 0 else None


def slope(a, u) -> tuple[float, float]:
    """(beta, alpha): the least-squares line a ~ alpha + beta u. Where u does not vary (or fewer than
    two points) beta is 0 and alpha the mean of a (0 for no points)."""
    a, u = np.asarray(a, dtype=np.float64), np.asarray(u, dtype=np.float64)
    if len(a) == 0:
        return 0.0, 0.0
    uc = u - u.mean()
    var = float((uc * uc).sum())
    if len(a) < 2 or var == 0.0:
        return 0.0, float(a.mean())
    beta = float((uc * (a - a.mean())).sum() / var)
    return beta, float(a.mean() - beta * u.mean())
