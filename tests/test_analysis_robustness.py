"""Theorem 1 (kappa_q) against brute force over every size-q opposite subset."""

from __future__ import annotations

import numpy as np
import pytest

from bridgecli.analysis import robustness as rob
from bridgecli.core.select import Surrogate


def instances(seed: int, count: int):
    """Small random instances, half with integer coefficients (exact ties), half zero-base (prompt-like)."""
    rng = np.random.default_rng(seed)
    for k in range(count):
        N, n = int(rng.integers(2, 7)), int(rng.integers(1, 7))
        if k % 2:
            B = rng.integers(-3, 4, size=(N, n)).astype(float)
            a = rng.integers(-4, 5, size=N).astype(float)
        else:
            B = rng.normal(size=(N, n))
            a = rng.normal(size=N)
        if k % 3 == 0:
            a = np.zeros(N)
        b = int(rng.integers(1, N))
        yield a, B, b


def test_kappa_sign_matches_brute_force_and_the_witness_improves():
    checked = 0
    for a, B, b in instances(0, 250):
        sel = rob.full_state_selection(a, B, b)
        k = rob.kappa(a, B, sel)
        assert k.n == B.shape[1]
        for q in range(1, B.shape[1] + 1):
            robust, counter = rob.brute_force(a, B, sel, q)
            assert robust == (k.kappa[q - 1] >= -1e-12), (a, B, b, q, k.kappa)
            i, i2 = int(k.pair_in[q - 1]), int(k.pair_out[q - 1])
            assert i in sel and i2 not in sel
            V = rob.witness(B, i, i2, q)
            s = rob.conditional(a, B, V)
            # the witness attains kappa_q exactly: s_i(V) - s_i'(V) = kappa_q
            assert s[i] - s[i2] == pytest.approx(k.kappa[q - 1], abs=1e-9)
            if k.kappa[q - 1] < -1e-12:
                assert len(V) == q and not rob.is_optimal(a, B, sel, V)
                swapped = np.sort(np.r_[sel[sel != i], i2])
                assert s[swapped].sum() > s[sel].sum()  # a strictly improving swap
            checked += 1
        # the full opposite side is the state S^F was chosen for
        assert k.kappa[-1] >= -1e-9
    assert checked > 500


def test_kappa_is_the_minimum_over_pairs_of_sorted_prefix_sums():
    rng = np.random.default_rng(1)
    a, B = rng.normal(size=8), rng.normal(size=(8, 5))
    sel = np.array([1, 4, 6])
    k = rob.kappa(a, B, sel)
    rest = [x for x in range(8) if x not in sel]
    ref = np.full(5, np.inf)
    for i in sel:
        for j in rest:
            ref = np.minimum(ref, a[i] - a[j] + np.cumsum(np.sort(B[i] - B[j])))
    np.testing.assert_allclose(k.kappa, ref)
    # chunking over S^F changes nothing
    old = rob.CHUNK_FLOATS
    try:
        rob.CHUNK_FLOATS = 1
        np.testing.assert_allclose(rob.kappa(a, B, sel).kappa, ref)
    finally:
        rob.CHUNK_FLOATS = old


def test_prompt_side_normalised_margin_is_nondecreasing():
    """For a_i = 0, kappa_q / q is nondecreasing in q (the paper's remark after Theorem 1)."""
    rng = np.random.default_rng(2)
    for _ in range(50):
        N, n = int(rng.integers(3, 9)), int(rng.integers(2, 9))
        B = rng.normal(size=(N, n))
        a = np.zeros(N)
        k = rob.kappa(a, B, rob.full_state_selection(a, B, int(rng.integers(1, N))))
        norm = k.kappa / np.arange(1, n + 1)
        assert np.all(np.diff(norm) >= -1e-12)
        first = k.first_negative()
        # hence the sign flips at most once, from negative to non-negative
        assert k.robust_from() == (1 if first is None else int(np.flatnonzero(k.kappa < 0)[-1]) + 2)


def test_bridge_sides_use_the_selection_surrogate():
    rng = np.random.default_rng(3)
    n, m = 6, 4
    a = rng.normal(size=n)
    A = rng.dirichlet(np.ones(m + 1), size=n)[:, :m]
    c = rng.uniform(0, 0.3, size=n)
    sur = Surrogate.from_scores(a, c, A)
    ap, Bp = rob.side_problem("prompt", a, c, A)
    ar, Br = rob.side_problem("response", a, c, A)
    assert Bp.shape == (m, n) and Br.shape == (n, m) and not ap.any()
    # s_i(V) is the conditional score of the paper for every V
    V_r, V_p = np.array([0, 3, 5]), np.array([1, 2])
    np.testing.assert_allclose(rob.conditional(ap, Bp, V_r), sur.delta_p(V_r))
    np.testing.assert_allclose(rob.conditional(ar, Br, V_p), sur.delta_r(V_p))


def test_undefined_budgets_are_refused():
    B = np.ones((3, 2))
    with pytest.raises(ValueError):
        rob.kappa(np.zeros(3), B, np.arange(3))
    with pytest.raises(ValueError):
        rob.kappa(np.zeros(3), B, np.array([], dtype=np.int64))


@pytest.mark.parametrize("flags", [["--rho-p", "0"], ["--rho-r", "0"], ["--rho-p", "0", "--rho-r", "0"]])
def test_a_zero_retention_reports_no_robustness_at_q_0(tmp_path, flags):
    """--rho-p 0 and --rho-r 0 lie in the documented range: an opposite budget of 0 is q = 0, outside Theorem 1's
    q = 1..n, so "robust at b_opp" is left out (None, a dash in the table) instead of failing."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from bridgecli.cli.app import app

    golden = Path(__file__).resolve().parent / "golden" / "v1.2-scores.bridge"
    out = tmp_path / "rob.json"
    result = CliRunner().invoke(app, ["analyze", "robustness", str(golden), *flags, "-o", str(out)],
                                env={"BRIDGE_NO_PROGRESS": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    for row in report["table"]:
        if row["examples"]:
            assert row["robust_at_b_opposite"] is None and row["mean_b_opposite"] == 0.0
    for ex in report["examples"]:
        for side in ("prompt", "response"):
            assert ex[side].get("robust_at_b_opposite") is None


def test_the_table_averages_robustness_over_examples_with_an_opposite_budget():
    def side(robust):
        return {"b": 1, "b_opposite": 0 if robust is None else 1, "opposite": 2, "kappa": [0.0, 0.0],
                "first_negative_q": None, "robust_from_q": 1, "robust_at_b_opposite": robust}

    rows = rob.table([{"prompt": side(None), "response": side(True)}, {"prompt": side(True), "response": side(False)}])
    assert rows[0]["robust_at_b_opposite"] == 1.0 and rows[1]["robust_at_b_opposite"] == 0.5
    assert rob.table([{"prompt": side(None), "response": side(None)}])[0]["robust_at_b_opposite"] is None
