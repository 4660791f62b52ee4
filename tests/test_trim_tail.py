"""``bridge compact --trim-tail``: each row cut after its last supervised response token (training/trim.py),
against a brute-force construction of the row on small cases, and through compact in every format."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from bridgecli.cli.app import app
from bridgecli.format.reader import read_all
from bridgecli.format.records import Tokens
from bridgecli.format.spec import EOS, PROMPT, RESPONSE
from bridgecli.steps.compact import CompactOptions, run_compact, supervision_of
from bridgecli.training.layouts import LAYOUTS
from bridgecli.training.rows import IGNORE, compact_row, weighted_row
from bridgecli.training.trim import tail_cut, trim_row


def brute_row(ids, kinds, keep, supervise, weights, trim):
    """The row spelled out token by token: (id, label, weight) of every executed token."""
    t = min(len(ids), len(kinds))
    response = [p for p in range(t) if kinds[p] == RESPONSE]
    supervised = [p for p in supervise if 0 <= p < t and kinds[p] == RESPONSE]
    # cut after the last supervised response token, unless it is the last response token (then the EOS stays)
    end = max(supervised) if trim and supervised and max(supervised) != response[-1] else t - 1
    out = []
    for p in range(end + 1):
        if kinds[p] == PROMPT and p not in keep:
            continue  # a prompt token the selection drops
        label = ids[p] if (kinds[p] == RESPONSE and p in supervise) or kinds[p] == EOS else IGNORE
        out.append((ids[p], label, weights.get(p, 1.0)))
    return out


@st.composite
def layouts(draw):
    kinds = draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=24))
    t = len(kinds) + draw(st.integers(-2, 2))  # now and then more or fewer ids than kinds
    ids = draw(st.lists(st.integers(3, 999), min_size=max(t, 0), max_size=max(t, 0)))
    positions = st.integers(-2, len(kinds) + 2)
    keep = sorted(set(draw(st.lists(positions, max_size=12))))
    supervise = sorted(set(draw(st.lists(positions, max_size=12))))
    weights = {p: draw(st.floats(0.1, 4.0)) for p in draw(st.lists(positions, max_size=6))}
    return ids, kinds, keep, supervise, weights


@given(layouts(), st.booleans(), st.booleans())
@settings(max_examples=500, deadline=None)
def test_the_trimmed_row_is_the_brute_force_row(layout, weighted, trim):
    ids, kinds, keep, supervise, weights = layout
    tokens = Tokens(input_ids=ids, kinds=bytes(kinds), offsets=[0, 0] * len(kinds))
    row = compact_row("r", tokens, keep, supervise)
    if weighted:
        row = weighted_row(row, tokens, keep, weights)
    end = tail_cut(tokens, supervise) if trim else None
    if end is not None:
        row = trim_row(row, tokens, keep, end)
    want = brute_row(ids, kinds, keep, supervise, weights if weighted else {}, trim)
    assert list(zip(row.input_ids, row.labels)) == [(i, y) for i, y, _ in want]
    assert (row.weights is None) == (not weighted)
    if weighted:
        assert row.weights == [w for _, _, w in want]
    if end is not None:  # a cut row ends at its last supervised response token, and holds no EOS after it
        assert row.labels[-1] == ids[end] and kinds[end] == RESPONSE


# --- through compact --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def selection(tmp_path_factory, tokenizer):
    """The synthetic BRIDGE selections of test_show with the last 1, 3 and 6 response tokens of its three examples
    unsupervised, and a fourth example whose last response token is supervised."""
    from test_show import synthetic, write_stream

    def supervising(ex, keep):
        n = len(ex.tokens.response_positions())
        sel = msgspec.structs.replace(ex.selection, response_keep=keep, b_r=len(keep), achieved_rho_r=len(keep) / n)
        return msgspec.structs.replace(ex, selection=sel)

    exs = synthetic(tokenizer, closure=False)
    out = []
    for ex, unsupervised in zip(exs, (1, 3, 6)):
        tail = set(ex.tokens.response_positions()[-unsupervised:].tolist())
        out.append(supervising(ex, [p for p in ex.selection.response_keep if p not in tail]))
    last = int(exs[0].tokens.response_positions()[-1])
    whole = supervising(exs[0], sorted(set(exs[0].selection.response_keep) | {last}))
    out.append(msgspec.structs.replace(whole, id="ex-whole", index=99))
    return write_stream(tmp_path_factory.mktemp("trim") / "selected.bridge", out, "selection")


def _expected(path) -> tuple[list[tuple[list[int], list[int]]], int]:
    """The rows of the stream under --trim-tail by brute force, and the tokens the cut saves."""
    _, exs = read_all(path)
    rows, saved = [], 0
    for ex in exs:
        sup = supervision_of(ex)
        args = (list(ex.tokens.input_ids), list(ex.tokens.kinds), ex.selection.prompt_keep, sup, {})
        full, cut = brute_row(*args, trim=False), brute_row(*args, trim=True)
        rows.append(([i for i, _, _ in cut], [y for _, y, _ in cut]))
        saved += len(full) - len(cut)
    return rows, saved


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
@pytest.mark.parametrize("columns", list(LAYOUTS))
def test_compact_trims_every_format_and_layout(tmp_path, selection, fmt, columns):
    from test_compact_formats import load

    want, saved = _expected(selection)
    assert saved > 0
    out = tmp_path / {"jsonl": "rows.jsonl", "parquet": "rows.parquet", "hf": "rows"}[fmt]
    stats = run_compact(CompactOptions(inp=str(selection), out=str(out), format=fmt, columns=columns, trim_tail=True))
    assert stats.trimmed == saved and stats.trimmed_rows == 3  # the fourth row keeps its EOS
    ds = load(out, fmt)
    assert [LAYOUTS[columns].read(r) for r in ds] == want
    meta = json.loads((tmp_path / (out.name + ".bridge.json")).read_text())
    assert meta["trim_tail"] is True and meta["tokens_trimmed"] == saved
    assert meta["tokens_executed"] == sum(len(ids) for ids, _ in want)


def test_compact_reports_the_tokens_saved_and_the_text_view_stops_at_the_cut(tmp_path, selection):
    want, saved = _expected(selection)
    run = CliRunner()
    r = run.invoke(app, ["compact", str(selection), "-o", str(tmp_path / "rows.jsonl"), "--trim-tail"])
    assert r.exit_code == 0, r.output
    assert f"--trim-tail cut {saved} executed tokens from 3 rows" in r.output
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [(row["input_ids"], row["labels"]) for row in rows] == want
    assert rows[-1]["labels"][-1] != IGNORE and rows[-1]["input_ids"] == want[-1][0]  # ends with its EOS
    plain = run.invoke(app, ["compact", str(selection), "-o", str(tmp_path / "plain.jsonl")])
    assert "--trim-tail" not in plain.output
    assert json.loads((tmp_path / "plain.jsonl.bridge.json").read_text())["tokens_trimmed"] == 0
    text = run.invoke(app, ["compact", str(selection), "--format", "text", "--trim-tail"]).stdout
    heads = [line for line in text.splitlines() if line.startswith("### ")]
    assert [int(h.split("executed ")[1].split("/")[0]) for h in heads] == [len(ids) for ids, _ in want]
    assert text.count("[tail cut: ") == 3


def test_bridge_train_reads_trimmed_rows(tmp_path, selection):
    from bridgecli.steps.train import read_rows

    run_compact(CompactOptions(inp=str(selection), out=str(tmp_path / "rows.jsonl"), trim_tail=True))
    rows = read_rows(tmp_path / "rows.jsonl", vocab_size=49152)
    want, _ = _expected(selection)
    assert [(r.input_ids, r.labels) for r in rows] == want
    assert all(r.supervised == sum(y != IGNORE for y in labels[1:]) for r, (_, labels) in zip(rows, want))
    assert np.all([r.labels[-1] != IGNORE for r in rows])
