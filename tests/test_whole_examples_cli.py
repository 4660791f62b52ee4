"""The selections that save executed tokens, end to end through the command line on the bundled sample with a
tiny model: warmup -> score -> reference -> select (example-importance, rho-loss) -> close -> compact -> train,
and importance's draw compacted with --trim-tail -> train."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bridgecli.core.whole_examples import kept_count
from bridgecli.format.reader import read_all
from bridgecli.training.rows import IGNORE

from tiny import sample_inputs

pytestmark = pytest.mark.integration  # every test runs `bridge` processes
EXAMPLES = 8


@pytest.fixture(scope="module")
def bridge(bridge_cli):
    """`bridge ARGS` in a process of its own, a forked child of one interpreter that imported the CLI once
    (tests/forked_cli.py); its exit is 0. ``stdin``: a file read as standard input."""
    return bridge_cli


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir, bridge):
    """The scored sample with the base model's reference losses (one reference pass: the warm-up checkpoint's
    losses are the stream's scores.loss)."""
    d = tmp_path_factory.mktemp("whole")
    sample_inputs(d, warm=6, val=3, data=EXAMPLES)
    bridge("warmup", "warm.jsonl", "--val", "val.jsonl", "--model", tiny_model_dir, "--max-steps", "2",
           "--batch-size", "3", "--lr", "1e-3", cwd=d)
    bridge("score", "data.jsonl", "-o", "scores.bridge", cwd=d)
    bridge("reference", "scores.bridge", "-o", "refs.bridge", "--no-attention", cwd=d)  # --as base, the base model
    return d


def _train(bridge, d, rows: str, out: str) -> dict:
    bridge("train", rows, "-o", out, "--max-steps", "1", "--batch-size", "2", "--grad-accum", "1", cwd=d)
    return json.loads((d / out / "bridge_train.json").read_text())


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_example_importance_end_to_end(workdir, bridge):
    d = workdir
    bridge("select", "scores.bridge", "--method", "example-importance", "--rho-p", "1", "--rho-r", "0.5",
           "-o", "ei.bridge", cwd=d)
    bridge("close", "ei.bridge", "--segmenter", "math", "-o", "ei-closed.bridge", cwd=d)
    out = bridge("compact", "ei-closed.bridge", "-o", "ei.jsonl", cwd=d).stderr.decode()
    header, exs = read_all(d / "ei-closed.bridge")
    step = header.steps[-2]
    assert step.step == "select" and step.params["method"] == "example-importance"
    budgets = step.params["budgets"]
    kept = [ex for ex in exs if ex.selection.response_keep]
    assert len(kept) == budgets["kept"] == kept_count(0.5, EXAMPLES) == 4
    assert budgets["by"] == "loss" and budgets["executed_tokens"] == sum(len(ex.tokens.input_ids) for ex in kept)
    rows = _rows(d / "ei.jsonl")
    assert [r["id"] for r in rows] == [ex.id for ex in kept] and "4 of 8 examples left out" in out
    for row, ex in zip(rows, kept):  # whole examples, every supervised token (the EOS too) at the example's weight
        assert row["input_ids"] == list(ex.tokens.input_ids)
        w = {wt for y, wt in zip(row["labels"], row["loss_weights"]) if y != IGNORE}
        assert w == {float(f"{ex.selection.response_weights.numpy()[0]:.6g}")}
    meta = json.loads((d / "ei.jsonl.bridge.json").read_text())
    assert meta["tokens_read"] > meta["tokens_executed"] == budgets["executed_tokens"]
    summary = _train(bridge, d, "ei.jsonl", "ei-model")
    assert summary["rows"] == 4 and summary["executed_tokens"] == meta["tokens_executed"] and summary["steps"] == 1
    info = json.loads(bridge("inspect", "--json", "ei-closed.bridge", cwd=d).stdout)
    assert info["rows"]["rows"] == 4 and info["rows"]["executed_tokens"] == meta["tokens_executed"]


def test_rho_loss_end_to_end_through_a_pipe(workdir, bridge):
    d = workdir
    # from stdin: the first pass reads a spooled copy of it
    bridge("select", "--method", "rho-loss", "--rho-p", "1", "--rho-r", "0.5", "-o", "rho.bridge", cwd=d,
           stdin=d / "refs.bridge")
    bridge("close", "rho.bridge", "-o", "rho-closed.bridge", cwd=d)
    bridge("compact", "rho-closed.bridge", "-o", "rho.jsonl", cwd=d)
    header, exs = read_all(d / "rho-closed.bridge")
    budgets = header.steps[-2].params["budgets"]
    # the reducible loss: base model minus warm-up checkpoint (scores.loss), mean over each response
    reducible = np.array([ex.references["base"].response_loss.numpy("float64").mean()
                          - ex.scores.loss.numpy("float64").mean() for ex in exs])
    top = sorted(sorted(range(EXAMPLES), key=lambda i: (-reducible[i], exs[i].index))[:4])
    kept = [i for i, ex in enumerate(exs) if ex.selection.response_keep]
    assert kept == top and budgets["ref_losses_from"] == {"scores.loss": EXAMPLES}
    assert budgets["threshold"] == pytest.approx(reducible[kept].min())
    rows = _rows(d / "rho.jsonl")
    assert [r["id"] for r in rows] == [exs[i].id for i in kept] and all("loss_weights" not in r for r in rows)
    summary = _train(bridge, d, "rho.jsonl", "rho-model")
    assert summary["rows"] == 4 and summary["executed_tokens"] == sum(len(exs[i].tokens.input_ids) for i in kept)


def test_trim_tail_end_to_end(workdir, bridge):
    d = workdir
    bridge("select", "scores.bridge", "--method", "importance", "--rho-p", "1", "--rho-r", "0.5", "--option",
           "by=loss", "-o", "imp.bridge", cwd=d)
    bridge("compact", "imp.bridge", "-o", "imp.jsonl", cwd=d)
    out = bridge("compact", "imp.bridge", "-o", "imp-trim.jsonl", "--trim-tail", cwd=d).stderr.decode()
    full, trimmed = _rows(d / "imp.jsonl"), _rows(d / "imp-trim.jsonl")
    saved = sum(len(a["input_ids"]) - len(b["input_ids"]) for a, b in zip(full, trimmed))
    cut = sum(len(a["input_ids"]) > len(b["input_ids"]) for a, b in zip(full, trimmed))
    assert saved > 0 and f"--trim-tail cut {saved} executed tokens from {cut} rows" in out
    for a, b in zip(full, trimmed):
        n = len(b["input_ids"])
        assert a["input_ids"][:n] == b["input_ids"] and a["labels"][:n] == b["labels"]
        assert a["loss_weights"][:n] == b["loss_weights"] and b["labels"][-1] != IGNORE
    meta = json.loads((d / "imp-trim.jsonl.bridge.json").read_text())
    assert meta["tokens_trimmed"] == saved and meta["trim_tail"] is True
    summary = _train(bridge, d, "imp-trim.jsonl", "trim-model")
    assert summary["executed_tokens"] == meta["tokens_executed"] == sum(len(b["input_ids"]) for b in trimmed)
