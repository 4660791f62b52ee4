"""``select --method stratified``: per-class response budgets, against brute force on small cases."""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.analysis.tokenclass import response_strata
from bridgecli.cli.app import app
from bridgecli.core.select import Surrogate, alternate
from bridgecli.core.stratify import allocate, strata_of, top_b_stratified
from bridgecli.format.reader import open_reader


@given(st.lists(st.integers(0, 9), max_size=6), st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_allocate_is_proportional_capped_and_sums_to_the_budget(sizes, b):
    shares = allocate(sizes, b)
    n = sum(sizes)
    assert sum(shares) == min(b, n)
    assert all(0 <= s <= size for s, size in zip(shares, sizes))
    if n:  # each share within one of its exact quota
        assert all(abs(s - b * size / n) < 1 + 1e-9 or s == size for s, size in zip(shares, sizes))


def test_allocate_gives_the_remainders_to_the_largest_fractions():
    assert allocate([5, 3, 2], 5) == [3, 1, 1]  # quotas 2.5, 1.5, 1.0: the tie of .5 goes to the earlier
    assert allocate([1, 1, 8], 3) == [0, 0, 3]  # quotas .3, .3, 2.4: the largest fraction (.4) wins
    assert allocate([4, 0], 7) == [4, 0]


@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]), min_size=1, max_size=8), st.data())
@settings(max_examples=300, deadline=None)
def test_top_b_stratified_is_the_best_set_with_the_strata_sizes(scores, data):
    n = len(scores)
    strata = np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    strata = np.unique(strata, return_inverse=True)[1]  # 0..S-1, every stratum present
    b = data.draw(st.integers(0, n + 1))
    got = top_b_stratified(np.array(scores), strata, b)
    want_sizes = allocate([int((strata == s).sum()) for s in range(strata.max() + 1)], b)
    assert [int((strata[got] == s).sum()) for s in range(strata.max() + 1)] == want_sizes
    best = max(
        sum(scores[j] for j in sub)
        for sub in combinations(range(n), sum(want_sizes))
        if [sum(strata[j] == s for j in sub) for s in range(strata.max() + 1)] == want_sizes
    )
    assert sum(scores[j] for j in got) == pytest.approx(best)


@given(st.integers(1, 5), st.integers(1, 6), st.data())
@settings(max_examples=150, deadline=None)
def test_stratified_schedule_never_lowers_u_sur_and_keeps_the_shares(m, n, data):
    floats = st.floats(-2, 2, allow_nan=False)
    a = np.array(data.draw(st.lists(floats, min_size=n, max_size=n)))
    c = np.array(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    A = np.array(data.draw(st.lists(st.lists(st.floats(0, 1), min_size=m, max_size=m), min_size=n, max_size=n)))
    strata = np.unique(np.array(data.draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))), return_inverse=True)[1]
    b_p, b_r = data.draw(st.integers(0, m)), data.draw(st.integers(0, n))
    sur = Surrogate.from_scores(a, c, A)
    res = alternate(sur, b_p, b_r, 3, strata=strata)
    assert all(later >= earlier - 1e-9 for earlier, later in zip(res.u_sur, res.u_sur[1:]))
    shares = allocate([int((strata == s).sum()) for s in range(strata.max() + 1)], b_r)
    assert [int((strata[res.response] == s).sum()) for s in range(strata.max() + 1)] == shares
    # the last response update is the best stratified set for the final prompt set: brute force
    delta = sur.delta_r(res.prompt)
    best = max(
        sum(delta[j] for j in sub)
        for sub in combinations(range(n), sum(shares))
        if [sum(strata[j] == s for j in sub) for s in range(strata.max() + 1)] == shares
    )
    assert delta[res.response].sum() == pytest.approx(best, abs=1e-9)


def test_strata_of_numbers_the_labels_in_order():
    names, idx = strata_of(["words", "digits", "words", "newline"])
    assert names == ["words", "digits", "newline"] and idx.tolist() == [0, 1, 0, 2]


def test_response_strata_split_newlines_from_other_punctuation():
    text = "He has 3 apples.\nSo 3 + 4 = 7.\n#### 7"
    pieces = ["He", " has", " 3", " apples", ".\n", "So", " 3", " +", " 4", " =", " 7", ".\n", "####", " 7"]
    spans, at = [], 0
    for p in pieces:
        spans.append((at, at + len(p)))
        at += len(p)
    got = response_strata(text, np.array(spans))
    assert got[4] == "newline" and got[0] == "words" and got[2] == "digits" and got[-1] == "answer"
    assert got[7] == "math"


def test_select_stratified_through_the_cli(tmp_path, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    src = write_stream(tmp_path / "scores.bridge", exs, "scores")
    out = tmp_path / "strat.bridge"
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(out), "--method", "stratified", "--rho-p", "0.5",
                                 "--rho-r", "0.5"])
    assert r.exit_code == 0, r.output
    with open_reader(str(out)) as reader:
        for ex in reader:
            resp = ex.tokens.response_positions()
            labels = response_strata(ex.text, ex.tokens.spans()[resp])
            names, idx = strata_of(labels)
            kept = np.searchsorted(resp, ex.selection.response_keep)
            shares = allocate([int((idx == s).sum()) for s in range(len(names))], ex.selection.b_r)
            assert Counter(idx[kept].tolist()) == Counter({s: k for s, k in enumerate(shares) if k})
            assert all(x <= y for x, y in zip(ex.selection.u_sur, ex.selection.u_sur[1:]))

