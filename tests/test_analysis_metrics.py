"""The numpy side of ``bridge analyze``: ranking metrics, fidelity proxies, ranking shift, stats."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bridgecli.analysis import fidelity as fid
from bridgecli.analysis import shift as sh
from bridgecli.analysis.metrics import agreement, bottom_b, normalised_regret, rankdata, spearman, summary
from bridgecli.core.select import Surrogate
from bridgecli.core.topk import top_b


def test_rankdata_averages_ties():
    np.testing.assert_array_equal(rankdata(np.array([3.0, 1.0, 3.0, 2.0, 3.0])), [4.0, 1.0, 4.0, 2.0, 4.0])
    np.testing.assert_array_equal(rankdata(np.array([0.5])), [1.0])


def test_spearman_against_the_textbook_formula():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(3, 30))
        x, y = rng.normal(size=n), rng.normal(size=n)  # no ties
        d = rankdata(x) - rankdata(y)
        assert spearman(x, y) == pytest.approx(1 - 6 * (d ** 2).sum() / (n * (n * n - 1)), abs=1e-12)
    x = np.arange(6.0)
    assert spearman(x, x ** 3) == pytest.approx(1.0)
    assert spearman(x, -x) == pytest.approx(-1.0)
    assert math.isnan(spearman(x, np.ones(6)))
    assert math.isnan(spearman(np.array([1.0]), np.array([2.0])))


def test_agreement_by_hand():
    exact = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    proxy = np.array([5.0, 1.0, 4.0, 3.0, 2.0])  # proxy top-2 = {0, 2}; exact top-2 = {0, 1}
    ag = agreement(proxy, exact, 2)
    assert ag.overlap == 0.5 and ag.jaccard == pytest.approx(1 / 3)
    # exact top-2 utility 9, proxy's 8, bottom-2 3: (9 - 8) / (9 - 3)
    assert ag.regret == pytest.approx(1 / 6)
    assert agreement(exact, exact, 2).regret == 0.0 and agreement(-exact, exact, 2).regret == 1.0
    assert math.isnan(normalised_regret(exact, np.arange(5), 5))  # b = size: nothing to choose
    assert math.isnan(normalised_regret(np.ones(4), np.arange(2), 2))  # all equal
    np.testing.assert_array_equal(bottom_b(exact, 2), [3, 4])


def test_regret_lies_in_unit_interval():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(2, 12))
        b = int(rng.integers(1, n))
        exact = rng.integers(-3, 4, size=n).astype(float)
        proxy = rng.normal(size=n)
        r = normalised_regret(exact, top_b(proxy, b), b)
        assert math.isnan(r) or -1e-12 <= r <= 1 + 1e-12


def test_summary_skips_undefined():
    s = summary([1.0, None, 3.0, float("nan")])
    assert s["mean"] == 2.0 and s["std"] == 1.0 and s["count"] == 2 and s["undefined"] == 2
    assert summary([])["mean"] is None


def _scores(rng, n=7, m=5):
    a = rng.normal(size=n)
    A = rng.dirichlet(np.ones(m + 1), size=n)[:, :m] * 0.8
    c = rng.uniform(0, 0.2, size=n)
    return a, c, A


def test_bridge_proxy_is_the_selection_surrogate():
    rng = np.random.default_rng(2)
    a, c, A = _scores(rng)
    sur = Surrogate.from_scores(a, c, A)
    s_r, s_p = np.array([0, 2, 3, 6]), np.array([1, 4])
    np.testing.assert_allclose(fid.prompt_proxies(a, A, s_r)[fid.BRIDGE], sur.delta_p(s_r))
    np.testing.assert_allclose(fid.response_proxies(a, c, A, s_p)[fid.BRIDGE], sur.delta_r(s_p))
    np.testing.assert_allclose(fid.prompt_proxies(a, A, s_r)[fid.ATTENTION], A[s_r].sum(0))
    np.testing.assert_allclose(fid.response_proxies(a, c, A, s_p)[fid.ATTENTION], c + A[:, s_p].sum(1))
    # an exact matrix equal to the surrogate's beta gives the surrogate's prompt scores
    np.testing.assert_allclose(fid.exact_prompt(A * a[:, None], s_r), sur.delta_p(s_r))


def test_aggregate_table_carries_the_paper_numbers():
    rng = np.random.default_rng(3)
    results = []
    for k in range(3):
        a, c, A = _scores(rng)
        s_r, s_p = top_b(rng.normal(size=7), 5), top_b(rng.normal(size=5), 4)
        ex = fid.ExampleFidelity(id=str(k), index=k, m=5, n=7, b_p=4, b_r=5)
        ex.sides["prompt"] = fid.evaluate(fid.prompt_proxies(a, A, s_r), fid.exact_prompt(A * a[:, None], s_r), 4)
        ex.sides["response"] = fid.evaluate(fid.response_proxies(a, c, A, s_p), rng.normal(size=7), 5)
        results.append(ex)
    rows = fid.aggregate(results)
    assert [(r["side"], r["proxy"]) for r in rows] == [("prompt", fid.ATTENTION), ("prompt", fid.BRIDGE),
                                                       ("response", fid.ATTENTION), ("response", fid.BRIDGE)]
    bridge_prompt = rows[1]
    assert bridge_prompt["spearman"]["mean"] == pytest.approx(1.0) and bridge_prompt["regret"]["mean"] == 0.0
    assert bridge_prompt["paper"]["spearman"] == {"mean": 0.9123, "std": 0.1922}
    assert fid.fmt(bridge_prompt["overlap"]) == "1.0000 ± 0.0000"
    assert results[0].as_dict()["sides"]["prompt"][fid.BRIDGE]["b"] == 4


def test_shift_is_zero_at_full_retention_and_grows_from_there():
    rng = np.random.default_rng(4)
    a, c, A = _scores(rng, n=12, m=9)
    levels = [1.0, 0.5, 0.3]
    s_r, s_p = sh.states(a, c, A, levels, "top")
    assert [len(s) for s in s_r] == [12, 6, 4] and [len(s) for s in s_p] == [9, 5, 3]
    out = sh.surrogate_shifts(a, c, A, s_r, s_p)
    assert out["prompt"][0] == pytest.approx(0.0) and out["response"][0] == pytest.approx(0.0)
    assert all(0 <= v <= 2 for side in out.values() for v in side)
    # exact shifts computed from an exact matrix equal to the surrogate's reproduce the prompt side
    beta = A * a[:, None]
    _, dr_full = sh.surrogate_full(a, c, A)
    a_red = [a * (c + A[:, s].sum(1)) for s in s_p]
    ex = sh.exact_shifts(beta, dr_full, s_r, a_red)
    np.testing.assert_allclose(ex["prompt"], out["prompt"])
    np.testing.assert_allclose(ex["response"], out["response"])
    r1 = sh.states(a, c, A, levels, "random", np.random.default_rng(0))
    r2 = sh.states(a, c, A, levels, "random", np.random.default_rng(0))
    assert all(np.array_equal(x, y) for x, y in zip(r1[0] + r1[1], r2[0] + r2[1]))
    agg = sh.aggregate([{"surrogate": out}, {"surrogate": out}], levels)
    assert agg["surrogate"]["prompt"][1]["mean"] == pytest.approx(out["prompt"][1])
    assert agg["surrogate"]["prompt"][1]["count"] == 2
