"""``close --fill``: the budget the knapsack leaves is spent on the best remaining units, then tokens."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.core.closure import fill_cuts, project_cuts
from bridgecli.format.reader import open_reader


def _reference_fill(cuts, scores, b_r, alpha, chosen):
    """fill_cuts written out plainly: units by q descending (earlier first on ties) that still fit,
    then the highest-scored single tokens of the units left."""
    k = len(cuts) - 1
    units = [list(range(cuts[u], cuts[u + 1])) for u in range(k)]
    q = [float(np.sum(np.asarray(scores, dtype=np.float64)[u])) * len(u) ** (-alpha) for u in units]
    left = min(b_r, cuts[-1]) - sum(len(units[u]) for u in chosen)
    more = []
    for u in sorted(set(range(k)) - set(chosen), key=lambda u: (-q[u], u)):
        if left > 0 and len(units[u]) <= left:
            more.append(u)
            left -= len(units[u])
    tokens = []
    if left > 0:
        rest = [j for u in range(k) if u not in set(chosen) | set(more) for j in units[u]]
        rest.sort(key=lambda j: (-scores[j], j))
        tokens = sorted(rest[:left])
    return sorted(more), tokens


@st.composite
def instances(draw):
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=7))
    cuts = [0]
    for s in sizes:
        cuts.append(cuts[-1] + s)
    n = cuts[-1]
    scores = np.array(draw(st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, 3.0]), min_size=n, max_size=n)))
    b_r = draw(st.integers(0, n + 3))
    alpha = draw(st.sampled_from([0.0, 0.5, 1.0]))
    return cuts, scores, b_r, alpha


@given(instances())
@settings(max_examples=400, deadline=None)
def test_fill_spends_the_budget_exactly_as_the_plain_rule_says(inst):
    cuts, scores, b_r, alpha = inst
    chosen, _ = project_cuts(cuts, scores, min(b_r, cuts[-1]), alpha)
    units, tokens = fill_cuts(cuts, scores, b_r, alpha, chosen)
    assert (units, tokens) == _reference_fill(cuts, scores, b_r, alpha, chosen)
    all_units = set(chosen) | set(units)
    assert not set(chosen) & set(units)
    supervised = [j for u in sorted(all_units) for j in range(cuts[u], cuts[u + 1])] + tokens
    assert len(supervised) == len(set(supervised)) == min(b_r, cuts[-1])
    assert not any(cuts[u] <= j < cuts[u + 1] for u in all_units for j in tokens)


def test_fill_takes_nonpositive_units_and_splits_only_what_does_not_fit():
    cuts = [0, 3, 5, 6]  # units of 3, 2 and 1 tokens
    scores = np.array([1.0, 1.0, 1.0, -1.0, -3.0, -0.5])
    chosen, _ = project_cuts(cuts, scores, 5, 0.0)
    assert chosen == [0]  # the knapsack leaves 2 of 5 unspent: the other units have q <= 0
    # q(unit 1) = -4, q(unit 2) = -0.5: unit 2 first (it fits), then unit 1 (2 tokens) no longer fits in the
    # one token left, so its better token (position 3, score -1) fills it
    assert fill_cuts(cuts, scores, 5, 0.0, chosen) == ([2], [3])
    assert fill_cuts(cuts, scores, 4, 0.0, chosen) == ([2], [])
    assert fill_cuts(cuts, scores, 6, 0.0, chosen) == ([1, 2], [])


def _closed(tmp_path, tokenizer, extra):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    src = write_stream(tmp_path / "scores.bridge", exs, "scores")
    run = CliRunner()
    sel = tmp_path / f"sel{len(extra)}.bridge"
    r = run.invoke(app, ["select", str(src), "-o", str(sel), "--rho-p", "0.5", "--rho-r", "0.5", *extra])
    assert r.exit_code == 0, r.output
    out = {}
    for fill in ("--no-fill", "--fill"):
        dst = tmp_path / f"closed{fill}{len(extra)}.bridge"
        r = run.invoke(app, ["close", str(sel), "-o", str(dst), "--segmenter", "math", fill])
        assert r.exit_code == 0, r.output
        with open_reader(str(dst)) as reader:
            out[fill] = list(reader)
            if fill == "--fill":
                assert reader.header.steps[-1].params["fill"] is True
    return out


@pytest.mark.parametrize("budget", [[], ["--budget", "global"]])
def test_close_fill_reaches_b_r_per_example_and_under_a_global_budget(tmp_path, tokenizer, budget):
    out = _closed(tmp_path, tokenizer, budget)
    unspent = 0
    for plain, filled in zip(out["--no-fill"], out["--fill"]):
        n = len(plain.tokens.response_positions())
        b_r = filled.selection.b_r
        assert len(filled.closure.supervise) == min(b_r, n)
        assert set(plain.closure.supervise) <= set(filled.closure.supervise)
        assert set(plain.closure.chosen) <= set(filled.closure.chosen)
        unspent += min(b_r, n) - len(plain.closure.supervise)
    assert unspent > 0  # the synthetic scores leave budget to fill: the test exercises it


def test_close_refuses_a_weighted_selection(tmp_path, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    src = write_stream(tmp_path / "scores.bridge", exs, "scores")
    run = CliRunner()
    sel = tmp_path / "imp.bridge"
    r = run.invoke(app, ["select", str(src), "-o", str(sel), "--method", "importance"])
    assert r.exit_code == 0, r.output
    r = run.invoke(app, ["close", str(sel), "-o", str(tmp_path / "c.bridge")])
    assert r.exit_code == 2 and "loss weights" in r.output
    assert not (tmp_path / "c.bridge").exists()
