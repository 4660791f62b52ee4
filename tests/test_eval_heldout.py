"""bridge eval --task heldout-loss: the loss equals a direct masked computation, the bootstrap
interval, per-example resume from the journal, --compare and the CLI. A tiny random Llama with the
real tokenizer does the scoring."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.data.examples import DataOptions, iter_pairs
from bridgecli.data.tokenize import tokenize_pair
from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import compare as cmp
from bridgecli.evaluation.bootstrap import ratio_bootstrap
from bridgecli.evaluation.heldout import heldout_loss_task
from bridgecli.evaluation.journal import Journal, recording
from bridgecli.evaluation.tasks import EvalOptions
from bridgecli.format.spec import EOS, RESPONSE

from tiny import RECORDS, interrupting, tiny_llama_config, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# three shapes `bridge score` reads, with responses of different lengths
ROWS = [
    *RECORDS,
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."},
                  {"role": "assistant", "content": "Hi!"}]},
    {"prompt": "Add 2 and 2.", "completion": "2 + 2 = 4, so the answer is 4."},
    {"instruction": "Name a colour.", "input": "", "output": "Blue is a colour; so are red and green."},
]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "heldout.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return str(path)


def direct_losses(model, tokenizer, path, chat_template=True):
    """Per example: one unbatched forward, log-softmax, the negative log-likelihood of every response
    token and the EOS given everything before it."""
    out = []
    for _, where, pair in iter_pairs(path, DataOptions()):
        tok = tokenize_pair(tokenizer, pair, chat_template=chat_template).tokens
        ids = torch.tensor([tok.input_ids])
        kinds = list(tok.kinds)
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
        nll = [-float(logp[p - 1, tok.input_ids[p]]) for p, k in enumerate(kinds) if k in (RESPONSE, EOS)]
        out.append((sum(nll), len(nll)))
    return out


def batched_and_one_at_a_time(task, tiny, data_file, chat_template, batch_size):
    """The ``task``'s run over ``data_file`` in batches of ``batch_size``, and the summary of its run one
    example at a time, checked to have the same loss (batching changes it by float noise at most)."""
    model, tok = tiny
    run, one = (task(model, tok, EvalOptions(data=data_file, batch_size=b, progress=False,
                                             chat_template=chat_template)) for b in (batch_size, 1))
    assert one["summary"]["loss"] == pytest.approx(run["summary"]["loss"], rel=1e-5)
    return run, one["summary"]


@pytest.mark.parametrize("chat_template", [None, False])
def test_loss_equals_a_direct_masked_computation(tiny, data_file, chat_template):
    model, tok = tiny
    run, again = batched_and_one_at_a_time(heldout_loss_task, tiny, data_file, chat_template, batch_size=4)
    direct = direct_losses(model, tok, data_file, chat_template=chat_template is not False)
    s = run["summary"]
    assert s["n"] == len(ROWS) and s["tokens"] == sum(n for _, n in direct)
    assert s["loss"] == pytest.approx(sum(x for x, _ in direct) / s["tokens"], rel=1e-5)
    for item, (total, n) in zip(run["items"], direct):
        assert item["tokens"] == n and item["loss_sum"] == pytest.approx(total, rel=1e-5)
    assert s["ci_low"] <= s["loss"] <= s["ci_high"] and s["ci_low"] < s["ci_high"]
    assert s["ci_level"] == 0.95 and s["bootstrap"] == {"resamples": 1000, "seed": 0, "over": "examples"}
    # the interval of the run one example at a time is the same under the seed
    assert again["ci_low"] == pytest.approx(s["ci_low"], rel=1e-5)
    assert again["ci_high"] == pytest.approx(s["ci_high"], rel=1e-5)


def test_limit_too_long_and_bad_input(tiny, data_file, tmp_path):
    model, tok = tiny
    assert heldout_loss_task(model, tok, EvalOptions(data=data_file, limit=2, progress=False))["summary"]["n"] == 2
    short = tiny_model(tiny_llama_config(len(tok), layers=1, hidden=16))
    short.config.max_position_embeddings = 60  # the chat-template rows of this file are longer than 60 tokens
    lengths = [len(tokenize_pair(tok, p).tokens.input_ids) for _, _, p in iter_pairs(data_file, DataOptions())]
    fits = sum(n <= 60 for n in lengths)
    assert 0 < fits < len(lengths)
    s = heldout_loss_task(short, tok, EvalOptions(data=data_file, progress=False))["summary"]
    assert s["n"] == fits and len(s["skipped_too_long"]) == len(lengths) - fits
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "q?", "answer": ""}) + "\n")
    with pytest.raises(InputError, match="bad.jsonl.*line 1.*answer.*empty"):
        heldout_loss_task(model, tok, EvalOptions(data=str(bad), progress=False))
    with pytest.raises(InputError, match="no such file"):
        heldout_loss_task(model, tok, EvalOptions(data=str(tmp_path / "none.jsonl"), progress=False))
    with pytest.raises(UsageError, match="few-shot"):
        heldout_loss_task(model, tok, EvalOptions(data=data_file, few_shot=1, progress=False))


def test_interrupted_run_resumes_per_example(tiny, data_file, tmp_path, monkeypatch):
    model, tok = tiny
    options = EvalOptions(data=data_file, batch_size=2, progress=False)
    reference = heldout_loss_task(model, tok, options)
    path = tmp_path / "eval-heldout-loss.json.partial.jsonl"
    calls = []
    real = model.forward
    monkeypatch.setattr(model, "forward", interrupting(real, calls, at=2))
    with pytest.raises(KeyboardInterrupt), recording(Journal.open(path, {"r": 1}, resume=False)):
        heldout_loss_task(model, tok, options)
    assert len(path.read_text().splitlines()) == 1 + 2  # the request and the first batch's two examples
    calls.clear()
    monkeypatch.setattr(model, "forward", interrupting(real, calls))
    book = Journal.open(path, {"r": 1}, resume=True)
    with recording(book):
        resumed = heldout_loss_task(model, tok, options)
    assert book.reused == 2 and len(calls) == 2  # the four other examples, two per batch
    assert resumed["summary"]["loss"] == pytest.approx(reference["summary"]["loss"], rel=1e-6)
    assert [i["tokens"] for i in resumed["items"]] == [i["tokens"] for i in reference["items"]]


# -- the bootstrap ----------------------------------------------------------------------------

def loop_bootstrap(sums, counts, resamples, level, seed):
    """The definition, one resample at a time."""
    rng = np.random.default_rng(seed)
    stats = []
    for _ in range(resamples):
        idx = rng.integers(0, len(sums), size=len(sums))
        stats.append(sum(sums[i] for i in idx) / sum(counts[i] for i in idx))
    tail = (1 - level) / 2
    return np.quantile(stats, [tail, 1 - tail])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 20), st.integers(1, 50)), min_size=1, max_size=12),
       st.integers(1, 300), st.sampled_from([0.5, 0.9, 0.95]), st.integers(0, 2**32 - 1))
def test_bootstrap_matches_the_definition(pairs, resamples, level, seed):
    sums = [s for s, _ in pairs]
    counts = [c for _, c in pairs]
    ci = ratio_bootstrap(sums, counts, resamples=resamples, level=level, seed=seed)
    low, high = loop_bootstrap(sums, counts, resamples, level, seed)
    assert ci.low == pytest.approx(low, rel=1e-9, abs=1e-12) and ci.high == pytest.approx(high, rel=1e-9, abs=1e-12)
    assert ci.mean == pytest.approx(sum(sums) / sum(counts))
    per = [s / c for s, c in pairs]
    assert min(per) - 1e-9 <= ci.low <= ci.high <= max(per) + 1e-9  # a resampled ratio is a weighted mean
    assert ratio_bootstrap(sums, counts, resamples=resamples, level=level, seed=seed) == ci  # seeded


def test_bootstrap_edge_cases():
    ci = ratio_bootstrap([2.0, 4.0, 6.0], [2, 4, 6])
    assert ci.mean == ci.low == ci.high == 1.0  # every example has the same mean
    big = ratio_bootstrap(list(np.arange(2000.0)), [1] * 2000, resamples=50)  # several index chunks
    low, high = loop_bootstrap(list(np.arange(2000.0)), [1] * 2000, 50, 0.95, 0)
    assert big.low == pytest.approx(low) and big.high == pytest.approx(high)
    for bad in (([], []), ([1.0], [0]), ([1.0, 2.0], [1])):
        with pytest.raises(ValueError):
            ratio_bootstrap(*bad)


# -- results, --compare and the CLI -----------------------------------------------------------

def test_cli_writes_resumes_and_compares(tiny_model_dir, data_file, tmp_path):
    out = tmp_path / "base"
    args = ["eval", str(tiny_model_dir), "--task", "heldout-loss", "--data", data_file, "-o", str(out),
            "--device", "cpu", "--batch-size", "3"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    result = json.loads((out / "eval-heldout-loss.json").read_text())
    s = result["summary"]
    assert s["metric"] == "loss" and s["n"] == len(ROWS) and s["ci_low"] <= s["loss"] <= s["ci_high"]
    assert f"{s['loss']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]" in first.stdout
    again = CliRunner().invoke(app, args + ["--resume"])
    assert again.exit_code == 0 and "kept" in again.output, again.output

    other = tmp_path / "other"
    other.mkdir()
    moved = {**result, "summary": {**s, "loss": s["loss"] + 1, "ci_low": s["ci_low"] + 1, "ci_high": s["ci_high"] + 1}}
    (other / "eval-heldout-loss.json").write_text(json.dumps(moved))
    (other / "eval-gsm8k.json").write_text(json.dumps(
        {"task": "gsm8k", "summary": {"task": "gsm8k", "n": 2, "accuracy": 0.5, "correct": 1}, "items": []}))
    comparison = cmp.compare([cmp.load_run(out), cmp.load_run(other)])
    label = "heldout-loss heldout.jsonl"
    assert comparison.losses == [label] and comparison.target == "gsm8k"
    assert comparison.rows[0]["losses"][label]["loss"] == s["loss"] and comparison.rows[0]["gsm8k"] is None
    table = CliRunner().invoke(app, ["eval", "--compare", str(out), str(other)])
    assert table.exit_code == 0, table.output
    assert f"{s['loss']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]" in table.stdout
    assert f"{s['loss'] + 1:.4f}" in table.stdout and "loss [95% CI]" in table.stdout
    assert "GSM8K (target)" in table.stdout and "50.00" in table.stdout and "Overall" not in table.stdout
    only_losses = CliRunner().invoke(app, ["eval", "--compare", str(out)])
    assert only_losses.exit_code == 0 and "Overall" not in only_losses.stdout, only_losses.output

    broken = tmp_path / "eval-broken.json"
    broken.write_text(json.dumps({"task": "heldout-loss", "summary": {"task": "heldout-loss", "metric": "loss",
                                                                      "loss": 1.0, "n": 1}}))
    with pytest.raises(InputError, match="ci_low"):
        cmp.load_run(broken)
