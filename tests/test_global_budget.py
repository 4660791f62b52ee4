"""select --budget global: order-preserving keys, the spilled radix allocation against brute force on
small streams, and the two-pass select end to end (file and stdin)."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.core.allocate import GainSpill, key_value, order_keys
from bridgecli.core.budgets import budget
from bridgecli.core.select import Surrogate, select
from bridgecli.format.reader import open_reader

FAST = settings(max_examples=150, deadline=None)


def brute_allocate(gains, pool, total=None, totals=None) -> list[tuple[int, int]]:
    """Everything in memory: sort a pool's gains by (gain desc, example, side, position), take the first
    ``total``, count per example and side."""
    out = [[0, 0] for _ in gains]
    pools = [((0, 1), total)] if pool == "shared" else [((0,), totals[0]), ((1,), totals[1])]
    for sides, b in pools:
        items = sorted((-float(g), k, s, j) for k, pair in enumerate(gains) for s in sides
                       for j, g in enumerate(np.asarray(pair[s], dtype=np.float64).reshape(-1)))
        for _, k, s, _ in items[:max(int(b), 0)]:
            out[k][s] += 1
    return [(p, r) for p, r in out]


FLOATS = st.floats(allow_nan=False, allow_infinity=True, width=64)


@FAST
@given(values=st.lists(FLOATS, max_size=30))
def test_order_keys_sort_like_the_values(values):
    v = np.array(values, dtype=np.float64)
    keys = order_keys(v)
    for i in range(len(v)):
        for j in range(len(v)):
            assert (keys[i] < keys[j]) == (v[i] < v[j]) and (keys[i] == keys[j]) == (v[i] == v[j])
        assert key_value(int(keys[i])) == v[i]
    with pytest.raises(ValueError):
        order_keys(np.array([1.0, float("nan")]))


@st.composite
def streams(draw):
    """Small streams of gains: integers (many ties), halves, +-inf, zeros and -0.0, empty sides."""
    k = draw(st.integers(0, 6))
    value = st.one_of(st.integers(-3, 3).map(float), st.sampled_from([0.5, -0.0, math.inf, -math.inf, 1e300, -1e-300]))
    gains = []
    for _ in range(k):
        m, n = draw(st.integers(0, 4)), draw(st.integers(0, 4))
        gains.append((np.array(draw(st.lists(value, min_size=m, max_size=m)), dtype=np.float64),
                      np.array(draw(st.lists(value, min_size=n, max_size=n)), dtype=np.float64)))
    return gains


@FAST
@given(gains=streams(), data=st.data(), chunk=st.sampled_from([1, 2, 3, 7, 1 << 20]))
def test_allocation_against_brute_force(gains, data, chunk):
    size_p = sum(len(g[0]) for g in gains)
    size_r = sum(len(g[1]) for g in gains)
    total = data.draw(st.integers(0, size_p + size_r + 1))
    totals = (data.draw(st.integers(0, size_p + 1)), data.draw(st.integers(0, size_r + 1)))
    with GainSpill(chunk=chunk) as spill:
        for gp, gr in gains:
            spill.add(gp, gr)
        shared = spill.allocate("shared", total=total)
        sides = spill.allocate("sides", totals=totals)
        paths = list(spill.paths)
    assert not any(__import__("os").path.exists(p) for p in paths)  # the spill files are gone
    assert shared["budgets"] == brute_allocate(gains, "shared", total=total)
    assert sides["budgets"] == brute_allocate(gains, "sides", totals=totals)
    assert sum(p + r for p, r in shared["budgets"]) == min(total, size_p + size_r)
    assert sum(p for p, _ in sides["budgets"]) == min(totals[0], size_p)
    for (p, r), (gp, gr) in zip(shared["budgets"], gains):
        assert 0 <= p <= len(gp) and 0 <= r <= len(gr)


@FAST
@given(gains=streams(), rho=st.sampled_from([0.25, 0.5, 0.75]))
def test_global_allocation_gains_at_least_the_per_example_one(gains, rho):
    """The per-example budgets are one way to spend the same total: the top-B gains of the stream sum
    to at least as much (the point of a global budget)."""
    finite = [(np.nan_to_num(gp, posinf=9.0, neginf=-9.0), np.nan_to_num(gr, posinf=9.0, neginf=-9.0))
              for gp, gr in gains]
    nominal = [(budget(rho, len(gp)), budget(rho, len(gr))) for gp, gr in finite]
    total = sum(p + r for p, r in nominal)
    with GainSpill(chunk=3) as spill:
        for gp, gr in finite:
            spill.add(gp, gr)
        plan = spill.allocate("shared", total=total)["budgets"]

    def spent(budgets):
        return sum(np.sort(gp)[::-1][:p].sum() + np.sort(gr)[::-1][:r].sum()
                   for (p, r), (gp, gr) in zip(budgets, finite))

    assert spent(plan) >= spent(nominal) - 1e-9


# --- select --budget global, end to end --------------------------------------------------------


def _stream(tmp_path, tokenizer):
    from test_show import synthetic, write_stream

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in synthetic(tokenizer, closure=False)]
    return exs, write_stream(tmp_path / "scores.bridge", exs, "scores")


def _expected(exs, rho_p, rho_r, pool):
    """Gains computed in memory with the core functions, allocated by brute force."""
    gains, nominal = [], []
    for ex in exs:
        s = ex.scores
        sur = Surrogate.from_scores(s.a.numpy(), s.c.numpy(), s.A.numpy())
        b_p, b_r = budget(rho_p, sur.m), budget(rho_r, sur.n)
        res = select(sur, b_p, b_r, "bridge", 4)
        gains.append((sur.delta_p(res.response), sur.delta_r(res.prompt)))
        nominal.append((b_p, b_r))
    tp, tr = sum(p for p, _ in nominal), sum(r for _, r in nominal)
    return brute_allocate(gains, pool, total=tp + tr, totals=(tp, tr)), tp + tr


@pytest.mark.parametrize("mode,pool", [("global", "shared"), ("global-sides", "sides")])
def test_select_global_budget(tmp_path, tokenizer, mode, pool):
    exs, src = _stream(tmp_path, tokenizer)
    want, total = _expected(exs, 0.5, 0.5, pool)
    run = CliRunner()
    out = tmp_path / f"{mode}.bridge"
    r = run.invoke(app, ["select", str(src), "-o", str(out), "--rho-p", "0.5", "--rho-r", "0.5", "--budget", mode])
    assert r.exit_code == 0, r.output
    with open_reader(str(out)) as reader:
        params = reader.header.steps[-1].params["global_budget"]
        got = list(reader)
    assert [(e.selection.b_p, e.selection.b_r) for e in got] == want
    assert sum(p + r for p, r in want) == total == params["total"]
    for e in got:  # each example selects exactly its stream-wide budget
        assert len(e.selection.prompt_keep) == e.selection.b_p and len(e.selection.response_keep) == e.selection.b_r
    # from stdin: copied to a temporary file, read twice, the same result
    piped = run.invoke(app, ["select", "-", "-o", str(tmp_path / "piped.bridge"), "--rho-p", "0.5", "--rho-r", "0.5",
                             "--budget", mode], input=src.read_bytes())
    assert piped.exit_code == 0, piped.output
    with open_reader(str(tmp_path / "piped.bridge")) as reader:
        assert [(e.selection.b_p, e.selection.b_r) for e in reader] == want


def test_global_budget_errors_and_protection(tmp_path, tokenizer):
    exs, src = _stream(tmp_path, tokenizer)
    run = CliRunner()
    bad = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--budget", "global",
                           "--method", "random"])
    assert bad.exit_code == 2 and "--budget global needs" in bad.output
    bad = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--budget", "nope"])
    assert bad.exit_code == 2 and "--budget must be one of" in bad.output
    from test_show import write_stream

    again = msgspec.structs.replace(exs[1], index=exs[0].index)  # another example under the first one's index
    twice = write_stream(tmp_path / "twice.bridge", [exs[0], again], "scores")
    bad = run.invoke(app, ["select", str(twice), "-o", str(tmp_path / "x.bridge"), "--budget", "global"])
    assert bad.exit_code == 3 and "two examples with index" in bad.output and "Traceback" not in bad.output
    ok = run.invoke(app, ["select", str(src), "-o", str(tmp_path / "p.bridge"), "--budget", "global",
                          "--rho-p", "0.3", "--rho-r", "0.3", "--protect-response", "answer"])
    assert ok.exit_code == 0, ok.output
    with open_reader(str(tmp_path / "p.bridge")) as reader:
        for e in reader:  # protected tokens gain +inf: each example's budget covers them, and they are in
            assert len(e.selection.protected_response) <= e.selection.b_r
            assert set(e.selection.protected_response) <= set(e.selection.response_keep)


@st.composite
def score_streams(draw):
    """Streams of 0-5 examples with random eligible sizes and random a, c, A (as stored: float32/16)."""
    from bridgecli.format.records import Array, Example, Scores, Tokens
    from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE

    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    exs = []
    for k in range(draw(st.integers(0, 5))):
        m, n = draw(st.integers(0, 5)), draw(st.integers(1, 5))  # a stream example has a response
        kinds = [TEMPLATE] + [PROMPT] * m + [TEMPLATE] + [RESPONSE] * n + [EOS]
        text = "<" + "p" * m + "|" + "r" * n + ">"
        offsets = [v for t in range(len(kinds)) for v in (t, t + 1)]
        a = np.round(rng.normal(size=n) * 2) / 2 if draw(st.booleans()) else rng.normal(size=n)  # ties or not
        A = rng.uniform(0, 1 / max(m, 1), size=(n, m))
        scores = Scores(scorer="bridge", a=Array.of(a), c=Array.of(rng.uniform(0, 0.2, size=n)),
                        A=Array.of(A, "float16"))
        exs.append(Example(id=f"e{k}", index=k, text=text, tokens=Tokens(
            input_ids=list(range(len(kinds))), kinds=bytes(kinds), offsets=offsets), scores=scores))
    return exs


@settings(max_examples=40, deadline=None)
@given(exs=score_streams(), rho_p=st.sampled_from([0.0, 0.3, 0.75, 1.0]), rho_r=st.sampled_from([0.25, 0.5, 1.0]),
       mode=st.sampled_from(["global", "global-sides"]), schedule=st.sampled_from(["bridge", "independent"]))
def test_select_global_budget_random_streams(tmp_path_factory, exs, rho_p, rho_r, mode, schedule):
    """Random small streams through the real two-pass step: the per-example budgets equal the brute-force
    allocation of the in-memory gains, they add up to the per-example total, and each selection fills its
    budget."""
    from test_show import write_stream

    from bridgecli.steps.select import SelectOptions, run_select

    d = tmp_path_factory.mktemp("g")
    src = write_stream(d / "s.bridge", exs, "scores")
    run_select(SelectOptions(inp=str(src), out=str(d / "o.bridge"), method=schedule, rho_p=rho_p, rho_r=rho_r,
                             rounds=2, budget=mode))
    gains, nominal = [], []
    for ex in exs:
        s = ex.scores
        sur = Surrogate.from_scores(s.a.numpy(), s.c.numpy(), s.A.numpy())
        b_p, b_r = budget(rho_p, sur.m), budget(rho_r, sur.n)
        res = select(sur, b_p, b_r, schedule, 2)
        gains.append((sur.delta_p(res.response), sur.delta_r(res.prompt)))
        nominal.append((b_p, b_r))
    tp, tr = sum(p for p, _ in nominal), sum(r for _, r in nominal)
    want = brute_allocate(gains, "shared" if mode == "global" else "sides", total=tp + tr, totals=(tp, tr))
    with open_reader(str(d / "o.bridge")) as reader:
        got = list(reader)
    assert [(e.selection.b_p, e.selection.b_r) for e in got] == want
    assert sum(p + r for p, r in want) == tp + tr
    for e in got:
        assert len(e.selection.prompt_keep) == e.selection.b_p and len(e.selection.response_keep) == e.selection.b_r
        u = e.selection.u_sur
        assert all(x <= y + 1e-9 * max(1.0, abs(y)) for x, y in zip(u, u[1:]))  # monotone U_sur
