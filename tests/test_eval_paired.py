"""Paired differences between two eval results: the paired bootstrap against its definition
(hypothesis, one resample at a time), paired_difference against a direct computation on small
results (accuracy, a per-item loss, a token-mean loss), the checks that refuse unpairable results,
and `bridge compare --paired`."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import compare as cmp
from bridgecli.evaluation.bootstrap import paired_bootstrap, ratio_bootstrap


def loop_paired(a, ca, b, cb, resamples, level, seed):
    """The definition: resample examples jointly, one resample at a time."""
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(resamples):
        idx = rng.integers(0, len(a), size=len(a))
        stats.append(sum(a[i] for i in idx) / sum(ca[i] for i in idx) - sum(b[i] for i in idx) / sum(cb[i] for i in idx))
    tail = (1 - level) / 2
    return np.quantile(stats, [tail, 1 - tail])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 30), st.floats(0, 20), st.integers(1, 30)),
                min_size=1, max_size=12),
       st.integers(1, 200), st.sampled_from([0.5, 0.9, 0.95]), st.integers(0, 2**32 - 1))
def test_paired_bootstrap_matches_the_definition(rows, resamples, level, seed):
    a, ca, b, cb = (list(x) for x in zip(*rows))
    ci = paired_bootstrap(a, ca, b, cb, resamples=resamples, level=level, seed=seed)
    low, high = loop_paired(a, ca, b, cb, resamples, level, seed)
    assert ci.low == pytest.approx(low, rel=1e-9, abs=1e-9) and ci.high == pytest.approx(high, rel=1e-9, abs=1e-9)
    assert ci.mean == pytest.approx(sum(a) / sum(ca) - sum(b) / sum(cb))
    # the same draws as the unpaired bootstrap: against a run of zeros it is that run's interval
    alone = ratio_bootstrap(a, ca, resamples=resamples, level=level, seed=seed)
    zero = paired_bootstrap(a, ca, [0.0] * len(a), [1] * len(a), resamples=resamples, level=level, seed=seed)
    assert zero.low == pytest.approx(alone.low) and zero.high == pytest.approx(alone.high)


def test_paired_bootstrap_edge_cases():
    same = paired_bootstrap([1, 0, 1], [1, 1, 1], [1, 0, 1], [1, 1, 1])
    assert same.mean == same.low == same.high == 0.0
    shifted = paired_bootstrap([2.0, 3.0, 5.0], [1, 1, 1], [1.0, 2.0, 4.0], [1, 1, 1])
    for value in (shifted.mean, shifted.low, shifted.high):  # every item moves by 1: no noise
        assert value == pytest.approx(1.0)
    for bad in (([], [], [], []), ([1.0], [1], [1.0, 2.0], [1, 1]), ([1.0], [0], [1.0], [1])):
        with pytest.raises(ValueError):
            paired_bootstrap(*bad)


def accuracy_result(task, correct, questions=None, start=0):
    items = [{"index": start + k, "question": (questions or {}).get(start + k, f"q{start + k}"), "correct": c}
             for k, c in enumerate(correct)]
    n = len(correct)
    return {"task": task, "summary": {"task": task, "n": n, "accuracy": sum(correct) / n, "correct": sum(correct)},
            "items": items}


def loss_result(task, sums, tokens, average):
    items = [{"index": k, "id": str(k), "loss_sum": s, "tokens": t, "loss": s / t}
             for k, (s, t) in enumerate(zip(sums, tokens))]
    return {"task": task, "summary": {"task": task, "metric": "loss", "average": average, "loss": 1.0,
                                      "ci_low": 0.9, "ci_high": 1.1, "n": len(items), "data": "/x/test.jsonl"},
            "items": items}


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=30))
def test_accuracy_difference_is_the_direct_one(pairs):
    a = accuracy_result("gsm8k", [x for x, _ in pairs])
    b = accuracy_result("gsm8k", [y for _, y in pairs])
    d = cmp.paired_difference(a, b)
    n = len(pairs)
    assert d.n == n and d.only_a == d.only_b == 0 and d.metric == "accuracy" and d.label == "gsm8k"
    assert d.a == pytest.approx(sum(x for x, _ in pairs) / n) and d.b == pytest.approx(sum(y for _, y in pairs) / n)
    assert d.difference == pytest.approx(d.b - d.a)
    low, high = loop_paired([float(y) for _, y in pairs], [1] * n, [float(x) for x, _ in pairs], [1] * n,
                            1000, 0.95, 0)
    assert d.low == pytest.approx(low, abs=1e-12) and d.high == pytest.approx(high, abs=1e-12)
    assert d.low <= d.difference <= d.high or d.low == d.high


def test_loss_differences_use_the_task_average():
    sums_a, tokens_a = [4.0, 1.0, 9.0], [2, 1, 3]
    sums_b, tokens_b = [2.0, 1.0, 3.0], [1, 2, 3]
    per_item = cmp.paired_difference(loss_result("answer-loss", sums_a, tokens_a, "items"),
                                     loss_result("answer-loss", sums_b, tokens_b, "items"))
    assert per_item.metric == "loss" and per_item.label == "answer-loss test.jsonl"
    assert per_item.a == pytest.approx(np.mean([2.0, 1.0, 3.0]))
    assert per_item.b == pytest.approx(np.mean([2.0, 0.5, 1.0]))
    token_mean = cmp.paired_difference(loss_result("heldout-loss", sums_a, tokens_a, "tokens"),
                                       loss_result("heldout-loss", sums_b, tokens_b, "tokens"))
    assert token_mean.a == pytest.approx(14 / 6) and token_mean.b == pytest.approx(6 / 6)
    low, high = loop_paired(sums_b, tokens_b, sums_a, tokens_a, 1000, 0.95, 0)
    assert token_mean.low == pytest.approx(low) and token_mean.high == pytest.approx(high)


def test_unpaired_items_and_refusals():
    a = accuracy_result("gsm8k", [True, False, True, True])
    b = accuracy_result("gsm8k", [False, False, True], start=2)  # items 2-4
    d = cmp.paired_difference(a, b)
    assert (d.n, d.only_a, d.only_b) == (2, 2, 1)
    assert d.a == 1.0 and d.b == 0.0 and d.difference == -1.0  # items 2 and 3
    other = accuracy_result("gsm8k", [True, True], questions={0: "something else"})
    with pytest.raises(InputError, match="item 0 has another 'question'.*not the same data"):
        cmp.paired_difference(a, other, files=("a.json", "b.json"))
    with pytest.raises(UsageError, match="different tasks"):
        cmp.paired_difference(a, accuracy_result("math", [True]))
    with pytest.raises(UsageError, match="share no item"):
        cmp.paired_difference(a, accuracy_result("gsm8k", [True], start=10))
    empty = {**a, "items": []}
    with pytest.raises(InputError, match="no per-item records"):
        cmp.paired_difference(empty, a, files=("old.json", "a.json"))
    with pytest.raises(UsageError, match="different files"):
        other_file = loss_result("heldout-loss", [1.0], [1], "tokens")
        other_file["summary"]["data"] = "/x/other.jsonl"
        cmp.paired_difference(loss_result("heldout-loss", [1.0], [1], "tokens"), other_file)


def test_compare_paired_cli(tmp_path):
    runs = {"base": [True, False, False, True, False, False], "better": [True, True, True, True, False, True]}
    for name, correct in runs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "eval-gsm8k.json").write_text(json.dumps(accuracy_result("gsm8k", correct)))
        (tmp_path / name / "eval-answer-loss.json").write_text(json.dumps(
            loss_result("answer-loss", [2.0 if c else 4.0 for c in correct], [2] * 6, "items")))
    out = CliRunner().invoke(app, ["compare", str(tmp_path / "base"), str(tmp_path / "better"), "--paired"])
    assert out.exit_code == 0, out.output
    d = cmp.paired_difference(accuracy_result("gsm8k", runs["base"]), accuracy_result("gsm8k", runs["better"]))
    assert "paired differences from base" in out.stdout and cmp.difference_text(d) in out.stdout
    assert d.difference == pytest.approx(3 / 6) and "-0.5000" in out.stdout  # the answer loss fell by 1 on 3 of 6
    alias = CliRunner().invoke(app, ["eval", "--compare", str(tmp_path / "base"), str(tmp_path / "better"), "--paired"])
    assert alias.exit_code == 0 and cmp.difference_text(d) in alias.stdout, alias.output
    alone = CliRunner().invoke(app, ["compare", str(tmp_path / "base"), "--paired"])
    assert alone.exit_code != 0 and "at least two runs" in alone.output
