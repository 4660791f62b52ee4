"""Protected tokens (select --protect-prompt/--protect-response): forced Top-b, the alternating
selection and the closure knapsack with forced sets against brute force, the pattern finders, and
select + close end to end."""

from __future__ import annotations

import json
from fractions import Fraction
from itertools import combinations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.core.closure import forced_units, project, unit_values
from bridgecli.core.protect import answer_spans, compile_patterns, protected_tokens
from bridgecli.core.select import Surrogate, alternate, independent, select
from bridgecli.core.topk import top_b_forced
from bridgecli.format.reader import open_reader

FAST = settings(max_examples=150, deadline=None)


def as_list(x) -> list[int]:
    return [int(v) for v in np.asarray(x).tolist()]


def brute_top_forced(scores, b, forced) -> list[int]:
    """forced + the best b - |forced| others by (score desc, index asc)."""
    forced = sorted(set(forced))
    rest = sorted((i for i in range(len(scores)) if i not in forced), key=lambda i: (-scores[i], i))
    return sorted(forced + rest[:max(b - len(forced), 0)])


def feasible(size: int, b: int, forced) -> list[tuple[int, ...]]:
    """All sets of size min(max(b, |forced|), size) that contain ``forced``."""
    k = min(max(b, len(set(forced))), size)
    return [c for c in combinations(range(size), k) if set(forced) <= set(c)]


@st.composite
def dyadic(draw, max_n: int = 5, max_m: int = 5):
    """Integer a, c and A in multiples of 1/8: every sum is exact, so ties are real ties."""
    n, m = draw(st.integers(0, max_n)), draw(st.integers(0, max_m))
    a = np.array([draw(st.integers(-3, 3)) for _ in range(n)], dtype=np.float64)
    c = np.array([draw(st.integers(0, 4)) / 8 for _ in range(n)], dtype=np.float64)
    A = np.array([[draw(st.integers(0, 2)) / 8 for _ in range(m)] for _ in range(n)], dtype=np.float64).reshape(n, m)
    b_p, b_r = draw(st.integers(0, m + 1)), draw(st.integers(0, n + 1))
    f_p = sorted(draw(st.sets(st.integers(0, m - 1), max_size=m))) if m else []
    f_r = sorted(draw(st.sets(st.integers(0, n - 1), max_size=n))) if n else []
    return a, c, A, b_p, b_r, f_p, f_r


@FAST
@given(scores=st.lists(st.integers(-3, 3), max_size=7), data=st.data())
def test_top_b_forced_against_brute_force(scores, data):
    n = len(scores)
    b = data.draw(st.integers(0, n + 1))
    forced = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))) if n else []
    got = as_list(top_b_forced(np.array(scores, dtype=np.float64), b, np.array(forced, dtype=np.int64)))
    assert got == brute_top_forced(scores, b, forced)
    assert set(forced) <= set(got) and len(got) == min(max(b, len(forced)), n)
    best = max(sum(scores[i] for i in s) for s in feasible(n, b, forced))
    assert sum(scores[i] for i in got) == best  # the exact maximiser over the sets holding the forced ones


@FAST
@given(case=dyadic(), rounds=st.integers(1, 4))
def test_alternate_with_protected_against_brute_force(case, rounds):
    """Budgets (forced in, sizes max(b, |F|)), each update the exact maximiser of U_sur over the
    feasible sets of its side (checked by enumeration in exact rationals), monotone U_sur, determinism."""
    a, c, A, b_p, b_r, f_p, f_r = case
    n, m = A.shape
    sur = Surrogate.from_scores(a, c, A)
    res = alternate(sur, b_p, b_r, rounds, np.array(f_p, dtype=np.int64), np.array(f_r, dtype=np.int64))
    beta = [[Fraction(float(A[j, i])) * Fraction(float(a[j])) for i in range(m)] for j in range(n)]
    gamma = [Fraction(float(a[j])) * Fraction(float(c[j])) for j in range(n)]

    def u(s_p, s_r):
        return sum(gamma[j] + sum(beta[j][i] for i in s_p) for j in s_r)

    # the same alternation, naively, with the brute-force forced top
    s_r = brute_top_forced(gamma, b_r, f_r)
    history = []
    for _ in range(rounds):
        d_p = [sum(beta[j][i] for j in s_r) for i in range(m)]
        s_p = brute_top_forced(d_p, b_p, f_p)
        assert u(s_p, s_r) == max(u(cand, s_r) for cand in feasible(m, b_p, f_p))
        history.append(u(s_p, s_r))
        d_r = [gamma[j] + sum(beta[j][i] for i in s_p) for j in range(n)]
        s_r = brute_top_forced(d_r, b_r, f_r)
        assert u(s_p, s_r) == max(u(s_p, cand) for cand in feasible(n, b_r, f_r))
        history.append(u(s_p, s_r))
    assert as_list(res.prompt) == s_p and as_list(res.response) == s_r
    assert [Fraction(x) for x in res.u_sur] == history
    assert all(x <= y for x, y in zip(history, history[1:]))  # monotone U_sur
    assert set(f_p) <= set(as_list(res.prompt)) and set(f_r) <= set(as_list(res.response))
    assert len(res.prompt) == min(max(b_p, len(f_p)), m) and len(res.response) == min(max(b_r, len(f_r)), n)
    again = select(sur, b_p, b_r, "bridge", rounds, np.array(f_p, dtype=np.int64), np.array(f_r, dtype=np.int64))
    assert as_list(again.prompt) == as_list(res.prompt) and as_list(again.response) == as_list(res.response)
    # the independent schedule keeps them too
    ind = independent(sur, b_p, b_r, np.array(f_p, dtype=np.int64), np.array(f_r, dtype=np.int64))
    assert set(f_p) <= set(as_list(ind.prompt)) and set(f_r) <= set(as_list(ind.response))


def test_alternate_without_protection_is_unchanged():
    rng = np.random.default_rng(3)
    a, c, A = rng.normal(size=6), rng.uniform(0, 0.3, size=6), rng.uniform(0, 0.1, size=(6, 5))
    sur = Surrogate.from_scores(a, c, A)
    base, empty = alternate(sur, 3, 4, 4), alternate(sur, 3, 4, 4, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert as_list(base.prompt) == as_list(empty.prompt) and base.u_sur == empty.u_sur


@FAST
@given(sizes=st.lists(st.integers(1, 3), min_size=0, max_size=6), data=st.data())
def test_project_with_protected_units_against_brute_force(sizes, data):
    """Units holding a protected token are always chosen and count against b_r; the rest is the best
    knapsack fill of what is left."""
    units, t = [], 0
    for s in sizes:
        units.append(np.arange(t, t + s, dtype=np.int64))
        t += s
    scores = np.array([data.draw(st.integers(-4, 4)) for _ in range(t)], dtype=np.float64)
    protected = np.array(sorted(data.draw(st.sets(st.integers(0, t - 1), max_size=3))) if t else [], dtype=np.int64)
    b_r = data.draw(st.integers(0, t + 1))
    alpha = data.draw(st.sampled_from([0.0, 0.5, 1.0]))
    proj = project(units, scores, b_r, alpha, protected)
    forced = set(as_list(forced_units(units, protected)))
    chosen = set(as_list(proj.chosen))
    assert forced <= chosen and set(protected.tolist()) <= set(as_list(proj.supervise))
    q = unit_values(units, scores, alpha)
    used = sum(len(units[k]) for k in forced)
    assert sum(len(units[k]) for k in chosen - forced) <= max(b_r - used, 0)
    rest = [k for k in range(len(units)) if k not in forced]
    best = 0.0
    for r in range(len(rest) + 1):
        for comb in combinations(rest, r):
            if sum(len(units[k]) for k in comb) <= b_r - used:
                best = max(best, sum(q[k] for k in comb))
    assert abs(sum(q[k] for k in chosen - forced) - best) < 1e-9


def test_pattern_finders():
    text = "She pays $15 in all.\n#### 15"
    spans = np.array([[0, 3], [3, 8], [8, 10], [10, 12], [12, 15], [15, 19], [19, 20], [20, 21], [21, 25],
                      [25, 26], [26, 28]])
    assert [text[s:e] for s, e in answer_spans(text)] == ["#### 15"]
    assert as_list(protected_tokens(text, spans, compile_patterns(["answer"], "--protect-response"))) == [8, 9, 10]
    assert as_list(protected_tokens(text, spans, compile_patterns(["digits"], "--protect-prompt"))) == [3, 10]
    assert as_list(protected_tokens(text, spans, compile_patterns(["####.*$"], "--protect-response"))) == [8, 9, 10]
    assert as_list(protected_tokens(text, spans, compile_patterns(["^She", "x*"], "--protect-prompt"))) == [0]
    with pytest.raises(ValueError, match="--protect-prompt '\\(' is not a valid regular expression"):
        compile_patterns(["("], "--protect-prompt")


# --- select + close end to end -----------------------------------------------------------------


def _scores_stream(tmp_path, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    return write_stream(tmp_path / "scores.bridge", exs, "scores")


def test_select_and_close_keep_protected_tokens(tmp_path, tokenizer):
    src = _scores_stream(tmp_path, tokenizer)
    run = CliRunner()
    r = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "sel.bridge"), "--rho-p", "0.3", "--rho-r", "0.3",
                         "--protect-prompt", "digits", "--protect-response", "answer"])
    assert r.exit_code == 0, r.output
    r = run.invoke(app, ["close", str(tmp_path / "sel.bridge"), "-o", str(tmp_path / "closed.bridge"),
                         "--segmenter", "math"])
    assert r.exit_code == 0, r.output
    with open_reader(str(tmp_path / "closed.bridge")) as reader:
        params = reader.header.steps[-2].params
        exs = list(reader)
    assert params["protect_prompt"] == ["digits"] and params["protect_response"] == ["answer"]
    for ex in exs:
        sel, cl = ex.selection, ex.closure
        spans = ex.tokens.spans()
        digits = [int(p) for p in ex.tokens.prompt_positions() if any(ch.isdigit() for ch in ex.text[slice(*spans[p])])]
        assert sel.protected_prompt == digits and set(digits) <= set(sel.prompt_keep)
        answer = ex.text[spans[sel.protected_response[0], 0]:spans[sel.protected_response[-1], 1]]
        assert answer.startswith("####") and set(sel.protected_response) <= set(sel.response_keep)
        assert set(sel.protected_response) <= set(cl.supervise) and cl.protected_units
        assert len(sel.prompt_keep) == max(sel.b_p, len(sel.protected_prompt))
        units = np.asarray(cl.units).reshape(-1, 2)
        forced_size = int(sum(units[k, 1] - units[k, 0] for k in cl.protected_units))
        assert set(cl.protected_units) <= set(cl.chosen) and len(cl.supervise) <= max(sel.b_r, forced_size)
    info = json.loads(run.invoke(app, ["inspect", "--json", str(tmp_path / "closed.bridge")]).stdout)
    assert info["selection"]["protected_prompt"] == sum(len(e.selection.protected_prompt) for e in exs) > 0
    stats = json.loads(run.invoke(app, ["inspect", "--stats", "--json", str(tmp_path / "closed.bridge")]).stdout)
    tc = stats["token_classes"]
    assert tc["response"]["answer"]["fraction"] == 1.0 and tc["prompt"]["digits"]["fraction"] == 1.0


def test_protect_errors(tmp_path, tokenizer):
    src = _scores_stream(tmp_path, tokenizer)
    run = CliRunner()
    bad = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--protect-prompt", "(["])
    assert bad.exit_code == 2 and "--protect-prompt" in bad.output and not (tmp_path / "x.bridge").exists()
    joint = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "y.bridge"), "--method", "tokenseek-approx",
                             "--protect-response", "answer"])
    assert joint.exit_code == 2 and "cannot keep protected tokens" in joint.output
    ok = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "z.bridge"), "--method", "random",
                          "--protect-response", "answer"])
    assert ok.exit_code == 0, ok.output
    with open_reader(str(tmp_path / "z.bridge")) as reader:
        for ex in reader:
            assert ex.selection.protected_response and set(ex.selection.protected_response) <= set(
                ex.selection.response_keep)
