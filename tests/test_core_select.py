"""Budgets, deterministic Top-b and BRIDGE's alternating selection, against brute force.

Two kinds of random examples are used:

- ``float`` examples: arbitrary a (negative included), c in [0, 1], nonnegative attention rows
  with c_j + sum_i A[j, i] <= 1. Floating-point sums are compared with a small tolerance.
- ``dyadic`` examples: integer a and c, A in multiples of 1/8. Every product and sum the code
  forms is then exact in float64, so ties are real ties and the tie rule can be checked exactly
  (against brute force done in exact rational arithmetic).
"""

from __future__ import annotations

from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.budgets import budget
from bridgecli.core.select import SCHEDULES, Surrogate, alternate, independent, select
from bridgecli.core.topk import top_b

FAST = settings(max_examples=150, deadline=None)
SLOW = settings(max_examples=80, deadline=None)
TOL = 1e-9


# --- helpers: the paper's formulas, naively ------------------------------------------------------


def brute_top(scores, b: int) -> list[int]:
    """Sort by (score desc, index asc), keep b, return ascending."""
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:max(b, 0)])


def naive_beta(a, A, i, j):
    """beta~_{i,j} = A_{j,i} a_j (paper eq. interaction_surrogate)."""
    return A[j][i] * a[j]


def naive_gamma(a, c, j):
    return a[j] * c[j]


def naive_delta_p(a, A, m, s_r):
    out = []
    for i in range(m):
        tot = 0
        for j in s_r:
            tot += naive_beta(a, A, i, j)
        out.append(tot)
    return out


def naive_delta_r(a, c, A, n, s_p):
    out = []
    for j in range(n):
        tot = naive_gamma(a, c, j)
        for i in s_p:
            tot += naive_beta(a, A, i, j)
        out.append(tot)
    return out


def naive_u(a, c, A, s_p, s_r):
    tot = 0
    for j in s_r:
        tot += naive_gamma(a, c, j)
        for i in s_p:
            tot += naive_beta(a, A, i, j)
    return tot


def exact(a, c, A):
    """The example's inputs as exact rationals (Fraction(float) is exact)."""
    return ([Fraction(x) for x in a], [Fraction(x) for x in c], [[Fraction(x) for x in row] for row in A])


def argmax_subsets(size_of_side: int, b: int, value):
    """All size-min(b, size) subsets in lexicographic order; return (max value, list of maximisers
    in lexicographic order, all values)."""
    k = min(max(b, 0), size_of_side)
    vals = [(comb, value(comb)) for comb in combinations(range(size_of_side), k)]
    best = max(v for _, v in vals)
    return best, [comb for comb, v in vals if v == best], vals


def as_list(x) -> list[int]:
    return [int(v) for v in np.asarray(x).tolist()]


# --- strategies --------------------------------------------------------------------------------


@st.composite
def float_examples(draw, max_n: int = 5, max_m: int = 5):
    """Random floats from a drawn seed (fast to generate); ``coarse`` rounds a to create ties and
    signed zeros, ``sparse`` zeroes some attention."""
    n = draw(st.integers(0, max_n))
    m = draw(st.integers(0, max_m))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    scale = draw(st.sampled_from([1.0, 1e-3, 1e3]))
    a = rng.normal(size=n) * scale
    if draw(st.booleans()):  # coarse: ties, zeros and -0.0
        a = np.round(a / scale * 2) / 2 * scale
        a[rng.uniform(size=n) < 0.2] = -0.0
    raw = rng.uniform(size=(n, m + 2))  # c, A row, slack
    if draw(st.booleans()):  # sparse attention
        raw[rng.uniform(size=raw.shape) < 0.5] = 0.0
    tot = raw.sum(axis=1, keepdims=True)
    raw = np.where(tot > 1, raw / np.where(tot > 0, tot, 1), raw)
    for j in range(n):  # rounding: keep c_j + sum_i A[j, i] <= 1
        while raw[j, 0] + raw[j, 1:m + 1].sum() > 1.0:
            k = int(np.argmax(raw[j, :m + 1]))
            raw[j, k] = np.nextafter(raw[j, k], 0.0)
    c = raw[:, 0].copy()
    A = raw[:, 1:m + 1].copy().reshape(n, m)
    assert (c >= 0).all() and (c <= 1).all() and (A >= 0).all() and (c + A.sum(axis=1) <= 1).all()
    return a, c, A


@st.composite
def dyadic_examples(draw, max_n: int = 5, max_m: int = 5):
    n = draw(st.integers(0, max_n))
    m = draw(st.integers(0, max_m))
    a = [draw(st.integers(-3, 3)) for _ in range(n)]
    c, A = [], []
    for _ in range(n):
        ks, rem = [], 8
        for _ in range(m + 1):
            k = draw(st.integers(0, min(rem, 3)))
            ks.append(k)
            rem -= k
        ks = draw(st.permutations(ks))
        c.append(ks[0] / 8)
        A.append([k / 8 for k in ks[1:]])
    return np.array(a, dtype=np.float64), np.array(c, dtype=np.float64), np.array(A, dtype=np.float64).reshape(n, m)


@st.composite
def with_budgets(draw, examples):
    a, c, A = draw(examples)
    n, m = A.shape
    b_p = draw(st.integers(0, m + 1))
    b_r = draw(st.integers(0, n + 1))
    return a, c, A, b_p, b_r


# --- budgets -----------------------------------------------------------------------------------


@pytest.mark.parametrize("rho,eligible,expected", [
    (0.7, 10, 7),      # 0.7 * 10 == 7.000000000000001 in floats
    (0.75, 4, 3),
    (0.1, 3, 1),       # 0.1 * 3 == 0.30000000000000004
    (0.07, 100, 7),    # 0.07 * 100 == 7.000000000000001
    (0.3, 10, 3),
    (0.6, 5, 3),
    (0.35, 20, 7),
    (0.5, 3, 2),       # a true fraction rounds up
    (0.01, 1, 1),
    (0.0, 10, 0),
    (1.0, 10, 10),
    (0, 7, 0),
    (1, 7, 7),
    (0.5, 0, 0),
    (1.0, 0, 0),
])
def test_budget_ceil_on_the_decimal(rho, eligible, expected):
    b = budget(rho, eligible)
    assert b == expected
    assert isinstance(b, int)


@FAST
@given(digits=st.integers(1, 4), data=st.data(), eligible=st.integers(0, 5000))
def test_budget_matches_integer_ceil(digits, data, eligible):
    scale = 10 ** digits
    k = data.draw(st.integers(0, scale))
    rho = float(f"{k / scale:.{digits}f}")  # the decimal k/10^d, as the user would type it
    expected = -(-k * eligible // scale)  # exact integer ceil
    assert budget(rho, eligible) == expected
    assert 0 <= budget(rho, eligible) <= eligible


@pytest.mark.parametrize("rho", [-0.01, -1.0, 1.0000001, 2.0, float("nan"), float("inf"), float("-inf")])
def test_budget_rho_out_of_range_raises(rho):
    with pytest.raises(ValueError):
        budget(rho, 10)


def test_budget_negative_eligible_raises():
    with pytest.raises(ValueError):
        budget(0.5, -1)


# --- top_b -------------------------------------------------------------------------------------

score_values = st.one_of(
    st.floats(allow_nan=False, allow_infinity=True, width=64),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 1e-300, -1e-300]),
)


@FAST
@given(scores=st.lists(score_values, max_size=12), data=st.data())
def test_top_b_equals_brute_force_sort(scores, data):
    b = data.draw(st.integers(-1, len(scores) + 2))
    got = top_b(np.array(scores, dtype=np.float64), b)
    assert got.dtype == np.int64
    assert as_list(got) == brute_top(scores, b)
    # also accepts a plain list and is deterministic
    assert as_list(top_b(scores, b)) == as_list(got)


@FAST
@given(scores=st.lists(st.sampled_from([0.0, -0.0, 1.0, -1.0, 3.0]), min_size=1, max_size=8), data=st.data())
def test_top_b_set_is_the_lex_first_maximiser(scores, data):
    """Larger first, ties by lower index == the lexicographically first size-b subset of maximal sum."""
    b = data.draw(st.integers(0, len(scores)))
    best, maximisers, _ = argmax_subsets(len(scores), b, lambda comb: sum(scores[i] for i in comb))
    assert tuple(as_list(top_b(scores, b))) == maximisers[0]


def test_top_b_ties_and_signed_zero():
    assert as_list(top_b([1.0, 1.0, 1.0], 2)) == [0, 1]
    assert as_list(top_b([0.0, 2.0, 2.0, 2.0], 2)) == [1, 2]
    assert as_list(top_b([-0.0, 0.0], 1)) == [0]  # -0.0 == 0.0: a tie, lower index wins
    assert as_list(top_b([0.0, -0.0], 1)) == [0]
    assert as_list(top_b([-1.0, -0.0, -2.0], 1)) == [1]
    assert as_list(top_b([-3.0, -1.0, -2.0], 2)) == [1, 2]
    assert as_list(top_b([float("-inf"), -1e308], 1)) == [1]
    assert as_list(top_b([5.0, float("inf"), 5.0], 2)) == [0, 1]


def test_top_b_edges():
    assert as_list(top_b([3.0, 1.0, 2.0], 0)) == []
    assert as_list(top_b([3.0, 1.0, 2.0], -2)) == []
    assert as_list(top_b([3.0, 1.0, 2.0], 3)) == [0, 1, 2]
    assert as_list(top_b([3.0, 1.0, 2.0], 10)) == [0, 1, 2]
    assert as_list(top_b(np.zeros(0), 3)) == []
    assert as_list(top_b(np.zeros(0), 0)) == []
    assert top_b(np.zeros(0), 3).dtype == np.int64


# --- Surrogate ---------------------------------------------------------------------------------


@FAST
@given(ex=float_examples(), data=st.data())
def test_surrogate_matches_paper_formulas(ex, data):
    a, c, A = ex
    n, m = A.shape
    sur = Surrogate.from_scores(a, c, A)
    assert (sur.n, sur.m) == (n, m)
    s_r = sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else []
    s_p = sorted(data.draw(st.sets(st.integers(0, max(m - 1, 0)), max_size=m))) if m else []
    for i in range(m):
        for j in range(n):
            assert sur.beta[j, i] == naive_beta(a, A, i, j)
    for j in range(n):
        assert sur.gamma[j] == naive_gamma(a, c, j)
    dp = sur.delta_p(np.array(s_r, dtype=np.int64))
    dr = sur.delta_r(np.array(s_p, dtype=np.int64))
    assert dp.shape == (m,) and dr.shape == (n,)
    np.testing.assert_allclose(dp, naive_delta_p(a, A, m, s_r), rtol=0, atol=TOL)
    np.testing.assert_allclose(dr, naive_delta_r(a, c, A, n, s_p), rtol=0, atol=TOL)
    u = sur.u_sur(np.array(s_p, dtype=np.int64), np.array(s_r, dtype=np.int64))
    assert isinstance(u, float)
    assert u == pytest.approx(naive_u(a, c, A, s_p, s_r), abs=TOL)
    # the paper's equivalent form: Delta_r(j | S_p) = a_j (c_j + sum_{i in S_p} A[j, i])
    for j in range(n):
        assert dr[j] == pytest.approx(a[j] * (c[j] + sum(A[j][i] for i in s_p)), abs=TOL)
    # U_sur is additive on either side: sum of the conditional scores
    assert u == pytest.approx(sum(dr[j] for j in s_r), abs=TOL)
    assert u == pytest.approx(sum(naive_gamma(a, c, j) for j in s_r) + sum(dp[i] for i in s_p), abs=TOL)


def test_surrogate_shape_checks():
    with pytest.raises(ValueError):
        Surrogate.from_scores(np.ones(3), np.ones(2), np.ones((3, 2)))
    with pytest.raises(ValueError):
        Surrogate.from_scores(np.ones(3), np.ones(3), np.ones((2, 3)))  # A has the wrong rows


@pytest.mark.parametrize("n,m", [(0, 0), (0, 4), (4, 0), (1, 1)])
def test_surrogate_empty_sides(n, m):
    sur = Surrogate.from_scores(np.ones(n), np.full(n, 0.25), np.full((n, m), 0.1))
    assert (sur.n, sur.m) == (n, m)
    assert sur.delta_p(np.zeros(0, dtype=np.int64)).shape == (m,)
    assert sur.delta_r(np.zeros(0, dtype=np.int64)).shape == (n,)
    assert sur.u_sur(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)) == 0.0


# --- alternate: each update is an exact one-side maximiser -------------------------------------


def states(sur: Surrogate, b_p: int, b_r: int, rounds: int):
    """[(S_p(t), S_r(t)) for t = 1..rounds] read off alternate(rounds=t); and the rounds-run result."""
    out = []
    for t in range(1, rounds + 1):
        r = alternate(sur, b_p, b_r, t)
        out.append((as_list(r.prompt), as_list(r.response)))
    return out, r


@SLOW
@given(case=with_budgets(dyadic_examples()), rounds=st.integers(1, 4))
def test_alternate_is_exact_coordinate_ascent_with_tie_rule(case, rounds):
    """Exact arithmetic: every update returns the lexicographically first maximiser over all
    size-b subsets of its side (the tie rule: larger first, ties by lower index), and the whole
    trajectory equals a brute-force re-implementation of Algorithm 1."""
    a, c, A, b_p, b_r = case
    n, m = A.shape
    ea, ec, eA = exact(a, c, A)
    sur = Surrogate.from_scores(a, c, A)
    got, last = states(sur, b_p, b_r, rounds)

    # brute-force re-implementation in exact arithmetic
    _, init, _ = argmax_subsets(n, b_r, lambda comb: sum(naive_gamma(ea, ec, j) for j in comb))
    s_r = list(init[0])
    history = []
    for t in range(rounds):
        _, best_p, _ = argmax_subsets(m, b_p, lambda comb: naive_u(ea, ec, eA, comb, s_r))
        s_p = list(best_p[0])
        history.append(naive_u(ea, ec, eA, s_p, s_r))
        _, best_r, _ = argmax_subsets(n, b_r, lambda comb: naive_u(ea, ec, eA, s_p, comb))
        s_r = list(best_r[0])
        history.append(naive_u(ea, ec, eA, s_p, s_r))
        assert got[t] == (s_p, s_r), f"round {t + 1}"
    # float64 is exact on these inputs: the recorded history is the exact one
    assert last.u_sur == [float(h) for h in history]
    assert all(later >= earlier for earlier, later in zip(last.u_sur, last.u_sur[1:]))
    np.testing.assert_array_equal(last.response_scores,
                                  [float(x) for x in naive_delta_r(ea, ec, eA, n, last.prompt.tolist())])


@SLOW
@given(case=with_budgets(float_examples()), rounds=st.integers(1, 4))
def test_alternate_updates_attain_the_brute_force_max(case, rounds):
    """Float examples: each update (given the other side as the code left it) attains the maximum
    of U_sur over all size-b subsets of its side; where that maximum is unique (by a margin),
    the update is that subset."""
    a, c, A, b_p, b_r = case
    n, m = A.shape
    sur = Surrogate.from_scores(a, c, A)
    got, last = states(sur, b_p, b_r, rounds)
    s_r = brute_top([naive_gamma(a, c, j) for j in range(n)], b_r)  # S_r(0) = Top_{b_r}(gamma)
    assert len(last.u_sur) == 2 * rounds
    for t, (s_p_t, s_r_t) in enumerate(got):
        for side, chosen, value, size, b in (
            ("prompt", s_p_t, lambda comb: naive_u(a, c, A, comb, s_r), m, b_p),
            ("response", s_r_t, lambda comb: naive_u(a, c, A, s_p_t, comb), n, b_r),
        ):
            best, _, vals = argmax_subsets(size, b, value)
            got_val = value(tuple(chosen))
            assert got_val >= best - TOL, (t, side)
            near = [comb for comb, v in vals if v >= best - TOL]
            if len(near) == 1:
                assert tuple(chosen) == near[0], (t, side)
        # the recorded history: U_sur after the prompt update, then after the response update
        assert last.u_sur[2 * t] == pytest.approx(naive_u(a, c, A, s_p_t, s_r), abs=TOL)
        assert last.u_sur[2 * t + 1] == pytest.approx(naive_u(a, c, A, s_p_t, s_r_t), abs=TOL)
        s_r = s_r_t


@FAST
@given(case=with_budgets(float_examples(max_n=8, max_m=8)), rounds=st.integers(1, 6))
def test_u_sur_history_never_decreases(case, rounds):
    a, c, A, b_p, b_r = case
    sur = Surrogate.from_scores(a, c, A)
    res = alternate(sur, b_p, b_r, rounds)
    h = res.u_sur
    assert len(h) == 2 * rounds
    assert all(isinstance(x, float) for x in h)
    for earlier, later in zip(h, h[1:]):
        assert later >= earlier - TOL * (1 + abs(earlier))
    # first value: U_sur(S_p(1), S_r(0)) with S_r(0) = Top(gamma), S_p(1) = Top(Delta_p(. | S_r(0)))
    s_r0 = top_b(sur.gamma, b_r)
    s_p1 = top_b(sur.delta_p(s_r0), b_p)
    assert h[0] == pytest.approx(sur.u_sur(s_p1, s_r0), abs=TOL)
    # last value: U_sur of the returned state
    assert h[-1] == pytest.approx(sur.u_sur(res.prompt, res.response), abs=TOL)
    np.testing.assert_allclose(res.response_scores, sur.delta_r(res.prompt), rtol=0, atol=TOL)


@FAST
@given(case=with_budgets(float_examples(max_n=8, max_m=8)), rounds=st.integers(1, 5),
       schedule=st.sampled_from(SCHEDULES))
def test_budgets_respected_and_deterministic(case, rounds, schedule):
    a, c, A, b_p, b_r = case
    n, m = A.shape
    sur = Surrogate.from_scores(a, c, A)
    res = select(sur, b_p, b_r, schedule, rounds)
    for idx, b, size in ((res.prompt, b_p, m), (res.response, b_r, n)):
        lst = as_list(idx)
        assert len(lst) == min(b, size)
        assert lst == sorted(set(lst))
        assert all(0 <= i < size for i in lst)
        assert np.issubdtype(np.asarray(idx).dtype, np.integer)
    assert res.response_scores.shape == (n,)
    again = select(Surrogate.from_scores(a.copy(), c.copy(), A.copy()), b_p, b_r, schedule, rounds)
    np.testing.assert_array_equal(res.prompt, again.prompt)
    np.testing.assert_array_equal(res.response, again.response)
    np.testing.assert_array_equal(res.response_scores, again.response_scores)
    assert res.u_sur == again.u_sur


# --- schedules ---------------------------------------------------------------------------------


def same(r1, r2):
    np.testing.assert_array_equal(r1.prompt, r2.prompt)
    np.testing.assert_array_equal(r1.response, r2.response)
    np.testing.assert_array_equal(r1.response_scores, r2.response_scores)
    assert r1.u_sur == r2.u_sur


@FAST
@given(case=with_budgets(float_examples(max_n=8, max_m=8)), rounds=st.integers(1, 6))
def test_one_pass_is_bridge_with_one_round(case, rounds):
    a, c, A, b_p, b_r = case
    sur = Surrogate.from_scores(a, c, A)
    one = select(sur, b_p, b_r, "one-pass", rounds)  # rounds is ignored by one-pass
    same(one, select(sur, b_p, b_r, "bridge", 1))
    same(one, alternate(sur, b_p, b_r, 1))
    assert len(one.u_sur) == 2
    same(select(sur, b_p, b_r, "bridge", rounds), alternate(sur, b_p, b_r, rounds))


@FAST
@given(case=with_budgets(float_examples(max_n=8, max_m=8)), rounds=st.integers(1, 5))
def test_more_rounds_extend_the_same_trajectory(case, rounds):
    """T+1 rounds repeat the first T exactly (same start, deterministic updates), so the final
    U_sur after T+1 rounds is never below the final U_sur after T rounds."""
    a, c, A, b_p, b_r = case
    sur = Surrogate.from_scores(a, c, A)
    short = alternate(sur, b_p, b_r, rounds)
    long = alternate(sur, b_p, b_r, rounds + 1)
    assert long.u_sur[:2 * rounds] == short.u_sur
    assert long.u_sur[-1] >= short.u_sur[-1] - TOL * (1 + abs(short.u_sur[-1]))


@SLOW
@given(case=with_budgets(dyadic_examples(max_n=6, max_m=6)), rounds=st.integers(1, 5))
def test_more_rounds_never_lower_exact(case, rounds):
    a, c, A, b_p, b_r = case
    sur = Surrogate.from_scores(a, c, A)
    assert alternate(sur, b_p, b_r, rounds + 1).u_sur[-1] >= alternate(sur, b_p, b_r, rounds).u_sur[-1]


@FAST
@given(case=with_budgets(dyadic_examples(max_n=6, max_m=6)))
def test_independent_is_full_state_top_b(case):
    a, c, A, b_p, b_r = case
    n, m = A.shape
    ea, ec, eA = exact(a, c, A)
    sur = Surrogate.from_scores(a, c, A)
    res = select(sur, b_p, b_r, "independent", 99)
    full_p = naive_delta_p(ea, eA, m, range(n))      # Delta_p(. | all R)
    full_r = naive_delta_r(ea, ec, eA, n, range(m))  # Delta_r(. | all P)
    assert as_list(res.prompt) == brute_top(full_p, b_p)
    assert as_list(res.response) == brute_top(full_r, b_r)
    np.testing.assert_array_equal(res.response_scores, [float(x) for x in full_r])
    assert res.u_sur == [float(naive_u(ea, ec, eA, as_list(res.prompt), as_list(res.response)))]
    same(res, independent(sur, b_p, b_r))


@FAST
@given(case=with_budgets(float_examples()))
def test_independent_float(case):
    a, c, A, b_p, b_r = case
    n, m = A.shape
    sur = Surrogate.from_scores(a, c, A)
    res = independent(sur, b_p, b_r)
    full_p = naive_delta_p(a, A, m, range(n))
    full_r = naive_delta_r(a, c, A, n, range(m))
    np.testing.assert_allclose(res.response_scores, full_r, rtol=0, atol=TOL)
    for chosen, scores, b in ((res.prompt, full_p, b_p), (res.response, full_r, b_r)):
        k = min(b, len(scores))
        assert sum(scores[i] for i in as_list(chosen)) >= sum(sorted(scores, reverse=True)[:k]) - TOL
    assert len(res.u_sur) == 1


def test_schedule_errors():
    sur = Surrogate.from_scores(np.ones(2), np.zeros(2), np.full((2, 2), 0.5))
    with pytest.raises(ValueError):
        select(sur, 1, 1, "greedy")
    with pytest.raises(ValueError):
        alternate(sur, 1, 1, 0)
    with pytest.raises(ValueError):
        select(sur, 1, 1, "bridge", 0)
    assert set(SCHEDULES) == {"bridge", "one-pass", "independent"}


# --- edge cases --------------------------------------------------------------------------------


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_no_eligible_prompt_tokens(schedule):
    a = np.array([1.0, -2.0, 3.0, 0.5])
    c = np.array([0.5, 0.25, 0.1, 0.9])
    sur = Surrogate.from_scores(a, c, np.zeros((4, 0)))
    res = select(sur, 3, 2, schedule, 3)
    assert as_list(res.prompt) == []
    gamma = a * c  # [0.5, -0.5, 0.3, 0.45]
    assert as_list(res.response) == [0, 3]
    np.testing.assert_array_equal(res.response_scores, gamma)
    assert all(u == pytest.approx(0.95) for u in res.u_sur)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_no_eligible_response_tokens(schedule):
    sur = Surrogate.from_scores(np.zeros(0), np.zeros(0), np.zeros((0, 5)))
    res = select(sur, 2, 3, schedule, 2)
    assert as_list(res.response) == []
    assert as_list(res.prompt) == [0, 1]  # every prompt score is 0: ties go to the lower index
    assert res.response_scores.shape == (0,)
    assert all(u == 0.0 for u in res.u_sur)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_both_sides_empty(schedule):
    sur = Surrogate.from_scores(np.zeros(0), np.zeros(0), np.zeros((0, 0)))
    res = select(sur, 1, 1, schedule, 2)
    assert as_list(res.prompt) == [] and as_list(res.response) == []
    assert all(u == 0.0 for u in res.u_sur)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_zero_budgets(schedule):
    rng = np.random.default_rng(0)
    a = rng.normal(size=5)
    A = rng.uniform(size=(5, 4)) / 8
    c = rng.uniform(size=5) / 2
    sur = Surrogate.from_scores(a, c, A)
    res = select(sur, 0, 0, schedule, 3)
    assert as_list(res.prompt) == [] and as_list(res.response) == []
    assert all(u == 0.0 for u in res.u_sur)
    # b_p = 0: the alternating schedules rank the response on gamma alone (independent ranks it
    # on the full-prompt score regardless of b_p)
    res = select(sur, 0, 2, schedule, 3)
    assert as_list(res.prompt) == []
    full = sur.delta_r(np.arange(4)) if schedule == "independent" else a * c
    assert as_list(res.response) == brute_top(list(full), 2)
    # b_r = 0: nothing routes to the prompt; all Delta_p are 0 in bridge (lowest indices kept)
    res = select(sur, 2, 0, schedule, 3)
    assert as_list(res.response) == []
    if schedule != "independent":
        assert as_list(res.prompt) == [0, 1]


def test_worked_example_coupling_changes_the_prompt():
    """A hand-checked example where alternating differs from independent selection.

    Response token 0 has large utility but only reads prompt 0; token 1 has negative utility and
    reads prompt 1 heavily. Independent ranks prompts on all of R, alternating on the chosen R."""
    a = np.array([2.0, -4.0, 1.0])
    c = np.array([0.0, 0.0, 0.5])
    A = np.array([[0.5, 0.0], [0.0, 0.5], [0.25, 0.25]])
    sur = Surrogate.from_scores(a, c, A)
    # gamma = [0, 0, 0.5] -> S_r(0) = Top_1 = [2]; Delta_p(.|{2}) = [0.25, 0.25] -> S_p(1) = [0]
    # Delta_r(.|{0}) = [1.0, 0.0, 0.75] -> S_r(1) = [0]; Delta_p(.|{0}) = [1, 0] -> stays.
    res = alternate(sur, 1, 1, 3)
    assert as_list(res.prompt) == [0] and as_list(res.response) == [0]
    assert res.u_sur == [0.75, 1.0, 1.0, 1.0, 1.0, 1.0]
    ind = independent(sur, 1, 1)
    # Delta_p(.|all R) = [1 + 0.25, -2 + 0.25] -> [0]; Delta_r(.|all P) = [1, -2, 1.0] -> [0] (tie: lower index)
    assert as_list(ind.prompt) == [0] and as_list(ind.response) == [0]
    np.testing.assert_array_equal(ind.response_scores, [1.0, -2.0, 1.0])
