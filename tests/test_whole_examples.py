"""Selections of whole examples (``select --method example-importance`` and ``--method rho-loss``): the draw
and the top share against brute force on small cases, the selectors on synthetic streams, and the steps after
them (close passes them through, compact writes no row for an example left out, inspect counts the rows)."""

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

from bridgecli.builtin.whole_examples import DRAW_TAG, ExampleImportance, RhoLoss
from bridgecli.cli.app import app
from bridgecli.core.sampling import inclusion_probabilities, ipw_weights
from bridgecli.core.whole_examples import draw_examples, kept_count, top_share
from bridgecli.errors import FormatError, UsageError
from bridgecli.format.reader import read_all
from bridgecli.format.records import Array, Example, Reference, Scores, Tokens
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE
from bridgecli.steps.select import select_example
from bridgecli.training.rows import IGNORE

from test_show import write_stream  # as the other tests of the steps write their streams

FAST = settings(max_examples=300, deadline=None)
tilt = st.floats(0.0, 20.0, allow_nan=False, allow_infinity=False)


# --- the count ----------------------------------------------------------------------------------------------

def test_the_kept_count_is_the_ceiling_on_the_decimal_share():
    assert kept_count(0.5, 6773) == 3387 and kept_count(0.7, 10) == 7 and kept_count(0.75, 4) == 3
    assert kept_count(0.0, 9) == 0 and kept_count(1.0, 9) == 9 and kept_count(0.5, 0) == 0
    for rho in (0.1, 0.25, 0.3, 0.5, 0.7, 0.9):
        for n in range(0, 40):
            want = -((-Fraction(str(rho)) * n).__floor__())  # ceil(rho n) in exact arithmetic
            assert kept_count(rho, n) == want


# --- the draw -------------------------------------------------------------------------------------------------

@given(st.lists(tilt, min_size=1, max_size=9), st.integers(0, 10), st.floats(0.0, 1.0), st.data())
@FAST
def test_the_draw_keeps_exactly_k_examples_with_exactly_pi_and_unbiased_weights(t, k, floor, data):
    t = np.array(t)
    n = len(t)
    k = min(k, n)
    keys = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(0, 1), min_size=n, max_size=n)))
    sizes = np.arange(1, n + 1) * 3 + (t > 1)  # each example's supervised tokens (response and EOS)
    pi, kept = draw_examples(t, k, floor, keys, 0.5)
    assert np.allclose(pi, inclusion_probabilities(t, k, floor)) and pi.sum() == pytest.approx(k, abs=1e-9)
    assert len(kept) == k and (np.diff(kept) > 0).all() and (len(kept) == 0 or 0 <= kept[0] <= kept[-1] < n)
    if k == 0:
        return
    # integrated exactly over the start: each example is kept with probability pi (the keys fixed) ...
    freq, weighted = np.zeros(n), 0.0
    order = np.lexsort((np.arange(n), keys))
    cum = np.cumsum(pi[order])
    cum *= k / cum[-1]
    cuts = np.unique(np.concatenate([[0.0, 1.0], np.mod(cum, 1.0)]))
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if hi - lo < 1e-15:
            continue
        _, drawn = draw_examples(t, k, floor, keys, (lo + hi) / 2)
        assert len(drawn) == k
        freq[drawn] += hi - lo
        # ... and the weights (k / N) / pi make the expected weighted count of supervised tokens (k / N) times
        # the full count: N / k times it is full SFT's count, whatever the tilt
        weighted += (hi - lo) * float((ipw_weights(pi, drawn, k) * sizes[drawn]).sum())
    assert np.allclose(freq, pi, atol=1e-9)
    # (an example of probability 0, a zero tilt at floor 0, is in no draw: only those of pi > 0 are estimated;
    # a probability of 1e-15 carries a weight of 1e15 that the integration over u cannot resolve)
    if ((pi == 0) | (pi > 1e-6)).all():
        assert weighted * n / k == pytest.approx(float(sizes[pi > 0].sum()), rel=1e-6)


def test_with_equal_probabilities_the_draw_is_a_simple_random_sample():
    """Systematic sampling in stream order at rho 0.5 could only keep every other example (2 of the 6 pairs of
    4); over random sort keys every pair is as likely (1/6 each)."""
    pairs: dict[tuple[int, ...], int] = {}
    rng = np.random.default_rng(0)
    for _ in range(3000):
        _, kept = draw_examples(np.zeros(4), 2, 1.0, rng.random(4), float(rng.random()))
        pairs[tuple(kept.tolist())] = pairs.get(tuple(kept.tolist()), 0) + 1
    assert set(pairs) == set(combinations(range(4), 2))
    assert all(abs(c / 3000 - 1 / 6) < 0.03 for c in pairs.values())


def test_the_draw_refuses_bad_arguments():
    with pytest.raises(ValueError, match="keys"):
        draw_examples(np.ones(3), 1, 0.5, np.ones(2), 0.0)
    with pytest.raises(ValueError):
        draw_examples(np.array([1.0, -1.0]), 1, 0.5, np.ones(2), 0.0)
    with pytest.raises(ValueError):
        draw_examples(np.ones(2), -1, 0.5, np.ones(2), 0.0)


# --- the top share --------------------------------------------------------------------------------------------

@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0]) | tilt, min_size=0, max_size=8), st.integers(0, 10),
       st.randoms(use_true_random=False))
@FAST
def test_top_share_keeps_the_k_largest_ties_to_the_smaller_index(scores, k, random):
    n = len(scores)
    index = list(range(100, 100 + n))
    random.shuffle(index)  # the examples' indices, not in stream order
    s, idx = np.array(scores, dtype=np.float64), np.array(index)
    kept = top_share(s, idx, k)
    assert (np.diff(kept) > 0).all() and len(kept) == min(k, n)
    # brute force: of all sets of that size, those of the largest sum (in exact arithmetic), and of those the one
    # whose indices, sorted, come first (it holds the smallest indices of the tied scores)
    exact = [Fraction(x) for x in scores]
    best = min(combinations(range(n), min(k, n)), key=lambda c: (-sum(exact[i] for i in c), sorted(idx[list(c)])))
    assert kept.tolist() == sorted(best)


def test_top_share_refuses_nan():
    with pytest.raises(ValueError, match="finite"):
        top_share(np.array([1.0, np.nan]), np.arange(2), 1)


# --- the selectors on synthetic streams -----------------------------------------------------------------------

def synthetic(index: int, m: int, n: int, loss: float | None = 1.0, base: float | None = None,
              warm: float | None = None, seed: int = 0) -> Example:
    """An example laid out as template, m prompt tokens, template, n response tokens, EOS; ``loss``, ``base``,
    ``warm``: the mean of its scores.loss and of the base and warmup references' response losses (None: absent)."""
    kinds = [TEMPLATE] + [PROMPT] * m + [TEMPLATE] + [RESPONSE] * n + [EOS]
    rng = np.random.default_rng([seed, index])

    def around(mean: float) -> np.ndarray:
        if n == 0:
            return np.zeros(0)
        noise = rng.uniform(-0.5, 0.5, n) * min(mean, 1.0)
        return mean + noise - noise.mean()

    scores = Scores(scorer="bridge", a=Array.of(rng.normal(size=n)), c=Array.of(rng.random(n) * 0.1),
                    A=Array.of(rng.random((n, m)) / max(m, 1), "float16"),
                    loss=None if loss is None else Array.of(around(loss)))
    refs = {}
    if base is not None:
        refs["base"] = Reference(model="base", prompt_loss=Array.of(rng.random(m)), response_loss=Array.of(around(base)))
    if warm is not None:
        refs["warmup"] = Reference(model="warm", response_loss=Array.of(around(warm)))
    return Example(id=f"ex{index}", index=index, text="", tokens=Tokens(
        input_ids=list(range(10, 10 + len(kinds))), kinds=bytes(kinds), offsets=[0, 0] * len(kinds)),
        scores=scores, references=refs)


def run(selector, examples: list[Example], rho_r: float, rho_p: float = 1.0, **options):
    """The per-example path of `bridge select` after the selector's first pass: (plan, selected examples)."""
    opts = selector.parse({k: str(v) for k, v in options.items()})
    plan = selector.prepare(iter(examples), rho_p, rho_r, opts)
    return plan, [select_example(ex, selector, selector.name, rho_p, rho_r, opts, plan=plan) for ex in examples]


def kept_of(selected: list[Example]) -> list[int]:
    return [ex.index for ex in selected if ex.selection.response_keep]


STREAM = [synthetic(i, m, n, loss) for i, (m, n, loss) in enumerate(
    [(4, 6, 0.2), (3, 0, 1.0), (5, 9, 2.5), (2, 3, 0.9), (6, 5, 0.05), (4, 7, 1.7), (3, 4, 0.0), (5, 8, 3.1)])]


@pytest.mark.parametrize("rho", [0.25, 0.5, 0.75, 1.0])
def test_example_importance_keeps_whole_examples_drawn_leaning_on_the_loss(rho):
    plan, got = run(ExampleImportance(), STREAM, rho)
    with_response = [ex for ex in STREAM if len(ex.tokens.response_positions())]
    k = kept_count(rho, len(with_response))
    kept = kept_of(got)
    assert len(kept) == k and 1 not in kept  # the example without a response is never kept
    tilt = np.array([ex.scores.loss.numpy("float64").mean() for ex in with_response])
    pi = inclusion_probabilities(np.maximum(tilt, 0), k, 0.5)
    by_index = {ex.index: p for ex, p in zip(with_response, pi)}
    for ex, new in zip(STREAM, got):
        s = new.selection
        if ex.index in kept:
            assert s.prompt_keep == ex.tokens.prompt_positions().tolist()
            assert s.response_keep == ex.tokens.response_positions().tolist()
            assert (s.b_p, s.b_r) == (len(s.prompt_keep), len(s.response_keep))
            w = s.response_weights
            if rho < 1.0:
                assert np.allclose(w.numpy("float64"), (k / len(with_response)) / by_index[ex.index], rtol=1e-6)
            else:  # every example kept: pi = 1, no weights to write
                assert w is None
            assert np.array_equal(s.response_scores.numpy(), np.ones(len(s.response_keep)))
        else:
            assert (s.b_p, s.b_r, s.prompt_keep, s.response_keep, s.response_weights) == (0, 0, [], [], None)
    summary = plan.summary
    assert summary["kept"] == k and summary["examples"] == 8 and summary["with_response"] == 7
    sizes = {ex.index: ex for ex in STREAM}
    assert summary["executed_tokens"] == sum(len(sizes[i].tokens.input_ids) for i in kept)
    assert summary["supervised_tokens"] == sum(len(sizes[i].tokens.response_positions()) + 1 for i in kept)
    assert summary["tokens"] == sum(len(ex.tokens.input_ids) for ex in STREAM)


def test_example_importance_follows_its_seed_and_its_options():
    runs = {seed: kept_of(run(ExampleImportance(), STREAM, 0.5, seed=seed)[1]) for seed in range(12)}
    assert runs[3] == kept_of(run(ExampleImportance(), STREAM, 0.5, seed=3)[1])  # deterministic
    assert len({tuple(v) for v in runs.values()}) > 2  # and the seed matters
    # the draw depends on the examples, not their order in the stream
    assert kept_of(run(ExampleImportance(), STREAM[::-1], 0.5, seed=3)[1]) == sorted(runs[3], reverse=True)
    _, none = run(ExampleImportance(), STREAM, 0.5, weights="none")
    _, uniform = run(ExampleImportance(), STREAM, 0.5, by="uniform")
    assert all(ex.selection.response_weights is None for ex in none + uniform)
    plan, _ = run(ExampleImportance(), STREAM, 0.5, by="uniform", floor=0.2)
    assert plan.summary["floor"] == 1.0 and plan.summary["inclusion_range"] == pytest.approx([4 / 7, 4 / 7])
    # no scores.loss: by=loss is refused naming the record and the field, by=uniform needs none
    bare = [synthetic(0, 3, 4, loss=None)]
    with pytest.raises(FormatError, match="scores.loss.*by=uniform") as info:
        run(ExampleImportance(), bare, 0.5)
    assert info.value.record == 0
    assert kept_of(run(ExampleImportance(), bare, 0.5, by="uniform")[1]) == [0]


def test_the_keys_come_from_the_seed_and_the_index():
    """Example k's sort key is the first draw of (seed, index_k, 3), the tag no other selector uses."""
    sel = ExampleImportance()
    opts = sel.parse({"by": "uniform"})
    idx = np.array([5, 9, 2])
    chosen, _, _ = sel.choose(np.zeros(3), idx, 1, opts)
    keys = [np.random.default_rng([42, int(i), DRAW_TAG]).random() for i in idx]
    u = np.random.default_rng(np.random.SeedSequence(42, spawn_key=(DRAW_TAG,))).random()
    assert chosen.tolist() == draw_examples(np.zeros(3), 1, 1.0, np.array(keys), float(u))[1].tolist()


@pytest.mark.parametrize("rho", [0.3, 0.5, 0.8])
def test_rho_loss_keeps_the_largest_reducible_losses(rho):
    # examples 2 and 5 tie (the same base and warm-up means): the smaller index goes first
    means = [(2.0, 1.0), (1.0, 1.0), (3.0, 1.5), (1.2, 1.4), (2.6, 1.0), (3.0, 1.5), (0.5, 0.4)]
    stream = [synthetic(i, 3, 4 + i, base=b, warm=w) for i, (b, w) in enumerate(means)]
    plan, got = run(RhoLoss(), stream, rho)
    reducible = np.array([ex.references["base"].response_loss.numpy("float64").mean()
                          - ex.references["warmup"].response_loss.numpy("float64").mean() for ex in stream])
    k = kept_count(rho, len(stream))
    kept = kept_of(got)
    assert kept == sorted(sorted(range(len(stream)), key=lambda i: (-reducible[i], i))[:k])
    assert all(ex.selection.response_weights is None for ex in got)
    assert plan.summary["threshold"] == pytest.approx(min(reducible[kept]))
    assert plan.summary["ref_losses_from"] == {"references.warmup": len(stream)}


def test_rho_loss_reads_the_warmup_loss_from_the_scores_and_refuses_missing_losses(tmp_path):
    """Without a reference named warmup, the warm-up checkpoint's losses are scores.loss (bridge score computed
    them with it): one reference pass, the base model's, is enough."""
    stream = [synthetic(i, 3, 5, loss=lo, base=b) for i, (lo, b) in enumerate([(1.0, 3.0), (0.5, 0.9), (2.0, 2.2)])]
    plan, got = run(RhoLoss(), stream, 0.3)
    assert kept_of(got) == [0] and plan.summary["ref_losses_from"] == {"scores.loss": 3}
    with pytest.raises(FormatError, match=r"no response losses named 'base'.*bridge reference STREAM --as base"):
        run(RhoLoss(), [synthetic(0, 3, 5)], 0.5)
    # through the command line: one line, the exit code of a stream that lacks what the step needs (3)
    src = write_stream(tmp_path / "noref.bridge", [synthetic(0, 3, 5), synthetic(1, 2, 4)], "scores")
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), "--method", "rho-loss",
                                 "--rho-p", "1", "--rho-r", "0.5"])
    assert r.exit_code == 3 and "record 0" in r.output and "bridge reference" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "x.bridge").exists()


@pytest.mark.parametrize("args, message", [
    (["--method", "example-importance", "--rho-r", "0.5"], "pass --rho-p 1"),
    (["--method", "rho-loss", "--rho-p", "0.5"], "pass --rho-p 1"),
    (["--method", "example-importance", "--rho-p", "1", "--option", "floor=2"], "floor must lie"),
    (["--method", "example-importance", "--rho-p", "1", "--option", "by=abs"], "choose one of"),
    (["--method", "example-importance", "--rho-p", "1", "--option", "seed=-1"], "seed must lie"),
    (["--method", "rho-loss", "--rho-p", "1", "--option", "floor=0.5"], "no option 'floor'"),
    (["--method", "rho-loss", "--rho-p", "1", "--budget", "global"], "--budget global needs"),
    (["--method", "example-importance", "--rho-p", "1", "--protect-response", "answer"], "cannot keep protected"),
])
def test_bad_settings_are_usage_errors(tmp_path, args, message):
    src = write_stream(tmp_path / "s.bridge", STREAM, "scores")
    r = CliRunner().invoke(app, ["select", str(src), "-o", str(tmp_path / "x.bridge"), *args])
    assert r.exit_code == UsageError.exit_code == 2, r.output
    assert message in r.output and not (tmp_path / "x.bridge").exists()


def test_a_direct_call_without_the_first_pass_is_refused():
    sel = ExampleImportance()
    with pytest.raises(UsageError, match="first pass"):
        select_example(STREAM[0], sel, sel.name, 1.0, 0.5, sel.parse({}))


# --- through the steps after select ---------------------------------------------------------------------------

def test_close_passes_whole_examples_through_and_compact_writes_no_row_for_those_left_out(tmp_path, tokenizer):
    from test_show import synthetic as texts

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in texts(tokenizer, closure=False)]
    src = write_stream(tmp_path / "s.bridge", exs, "scores")
    cli = CliRunner()
    r = cli.invoke(app, ["select", str(src), "-o", str(tmp_path / "sel.bridge"), "--method", "example-importance",
                         "--rho-p", "1", "--rho-r", "0.5", "--option", "seed=1"])
    assert r.exit_code == 0, r.output
    r = cli.invoke(app, ["close", str(tmp_path / "sel.bridge"), "-o", str(tmp_path / "c.bridge"), "--segmenter", "math"])
    assert r.exit_code == 0, r.output
    header, closed = read_all(tmp_path / "c.bridge")
    kept = [ex for ex in closed if ex.selection.response_keep]
    assert len(kept) == kept_count(0.5, len(exs)) == 2 and header.steps[0].params["budgets"]["kept"] == 2
    for ex in closed:  # the closure is the identity: every unit of a kept example, none of one left out
        assert ex.closure.supervise == ex.selection.response_keep
    r = cli.invoke(app, ["compact", str(tmp_path / "c.bridge"), "-o", str(tmp_path / "rows.jsonl")])
    assert r.exit_code == 0, r.output
    assert "left out by the selection" in r.output and "warning" not in r.output
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [ex.id for ex in kept]
    for row, ex in zip(rows, kept):
        assert row["input_ids"] == list(ex.tokens.input_ids)  # the whole example executed
        w = float(f"{ex.selection.response_weights.numpy()[0]:.6g}")
        supervised = [(y, wt) for y, wt in zip(row["labels"], row["loss_weights"]) if y != IGNORE]
        assert len(supervised) == len(ex.tokens.response_positions()) + 1
        assert all(wt == w for _, wt in supervised)  # the EOS too: it is drawn with its response
    meta = json.loads((tmp_path / "rows.jsonl.bridge.json").read_text())
    assert meta["rows"] == 2 and meta["examples_read"] == 3
    assert meta["dropped"] == [ex.id for ex in closed if not ex.selection.response_keep]
    assert meta["tokens_executed"] == sum(len(ex.tokens.input_ids) for ex in kept)
    assert meta["tokens_read"] == sum(len(ex.tokens.input_ids) for ex in exs)
    info = json.loads(cli.invoke(app, ["inspect", "--json", str(tmp_path / "c.bridge")]).stdout)
    assert info["rows"] == {"rows": 2, "executed_tokens": meta["tokens_executed"],
                            "executed_fraction": meta["tokens_executed"] / meta["tokens_read"],
                            "supervised_tokens": sum(len(ex.tokens.response_positions()) + 1 for ex in kept)}


def test_close_still_refuses_a_token_level_weighted_selection(tmp_path, tokenizer):
    from test_show import synthetic as texts

    exs = [msgspec.structs.replace(e, selection=None, closure=None) for e in texts(tokenizer, closure=False)]
    src = write_stream(tmp_path / "s.bridge", exs, "scores")
    cli = CliRunner()
    assert cli.invoke(app, ["select", str(src), "-o", str(tmp_path / "sel.bridge"), "--method", "importance",
                            "--rho-p", "1", "--rho-r", "0.5"]).exit_code == 0
    r = cli.invoke(app, ["close", str(tmp_path / "sel.bridge"), "-o", str(tmp_path / "c.bridge")])
    assert r.exit_code == 2 and "would drop them" in r.output and not (tmp_path / "c.bridge").exists()
