"""The statistics of ``bridge analyze decompose`` (analysis/decompose.py) against brute force."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.analysis import decompose as dec

finite = st.floats(-100, 100, allow_nan=False, width=32)


def pairs(min_size=0):
    return st.integers(min_size, 40).flatmap(
        lambda n: st.tuples(st.lists(finite, min_size=n, max_size=n), st.lists(finite, min_size=n, max_size=n))
    )


@settings(max_examples=200, deadline=None)
@given(pairs())
def test_slope_is_least_squares(xy):
    a, u = (np.array(x, dtype=np.float64) for x in xy)
    beta, alpha = dec.slope(a, u)
    if len(a) < 2 or np.ptp(u) == 0:
        assert beta == 0.0 and alpha == (float(a.mean()) if len(a) else 0.0)
        return
    # the normal equations of min sum (a - alpha - beta u)^2: residuals orthogonal to 1 and to u, so
    # that a - beta u does not covary with u
    r = a - alpha - beta * u
    scale = max(1.0, float(np.abs(a).max()), float(np.abs(u).max())) ** 2 * len(a)
    assert abs(r.sum()) <= 1e-9 * scale and abs((r * u).sum()) <= 1e-9 * scale * max(1.0, float(np.abs(u).max()))
    assert (beta, alpha) == pytest.approx(tuple(np.polyfit(u, a, 1)), rel=1e-6, abs=1e-6 * scale)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(finite, st.integers(0, 4)), min_size=1, max_size=40))
def test_r_squared_and_majority_sign_by_brute_force(rows):
    y = np.array([r[0] for r in rows], dtype=np.float64)
    g = np.array([r[1] for r in rows])
    total = ((y - y.mean()) ** 2).sum()
    within = sum(((y[g == k] - y[g == k].mean()) ** 2).sum() for k in set(g.tolist()))
    r2 = dec.r_squared(y, g)
    if total == 0:
        assert r2 is None
    else:
        assert r2 == pytest.approx(1 - within / total, abs=1e-9)
    carrying = 0
    for k in set(g.tolist()):
        pos = int((y[g == k] > 0).sum())
        carrying += max(pos, int((g == k).sum()) - pos)
    assert dec.majority_sign_share(y, g) == pytest.approx(carrying / len(y))


@settings(max_examples=200, deadline=None)
@given(pairs(min_size=1))
def test_split_by_brute_force(tn):
    t, n = (np.array(x, dtype=np.float64) for x in tn)
    s = dec.split(t, n)
    a = t + n
    assert s["tokens"] == len(a)
    assert s["share_positive"] == pytest.approx(sum(x > 0 for x in a) / len(a))
    assert s["share_target_positive"] == pytest.approx(sum(x > 0 for x in t) / len(t))
    flips = sum((x > 0) != (y > 0) or (x == 0) != (y == 0) or (x < 0) != (y < 0) for x, y in zip(a, t))
    assert s["share_sign_set_by_anchor"] == pytest.approx(flips / len(a))
    ratios = sorted(abs(y) / abs(x) for x, y in zip(t, n) if x != 0)
    if ratios:
        k = len(ratios)
        med = ratios[k // 2] if k % 2 else (ratios[k // 2 - 1] + ratios[k // 2]) / 2
        assert s["median_anchor_over_target"] == pytest.approx(med)
    else:
        assert s["median_anchor_over_target"] is None


def test_by_class_partitions_and_report_debiases():
    rng = np.random.default_rng(0)
    k = 400
    ids = rng.integers(0, 8, size=k)
    per_id = rng.normal(size=8) * 3
    u = per_id[ids] + 0.1 * rng.normal(size=k)  # u carries the id
    t = 2.0 * u + rng.normal(size=k)  # a_j mostly its common direction
    n = 0.05 * rng.normal(size=k)
    classes = np.array(["words", "digits", "newline"])[ids % 3]
    order = ("answer", "digits", "words", "newline")
    rep = dec.report(t, n, classes, ids, order, min_count=5, u=u, beta=2.0)
    cls = rep["a"]["classes"]
    assert list(cls) == ["all", "digits", "words", "newline"]  # a class with no token is left out
    assert sum(cls[c]["tokens"] for c in order if c in cls) == k == rep["tokens"]
    assert rep["a"]["ids"]["r2_on_id"] > 0.7  # the id explains a_j ...
    deb = rep["debiased"]
    assert deb["ids"]["r2_on_id"] < 0.1  # ... and not a_j - beta u_j
    assert abs(deb["pearson_debiased_u"]) < 0.1 < deb["pearson_a_u"]
    assert deb["beta_of_these_tokens"] == pytest.approx(2.0, abs=0.1)
    assert dec.report(t, n, classes, ids, order).keys() == {"tokens", "a"}  # no common direction: no debiased part
