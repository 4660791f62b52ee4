"""bridge eval --task answer-loss: the answer span (GSM8K '#### N', MATH's last \\boxed{}), the loss of
exactly its tokens against a direct unbatched computation, items without an answer counted, and the
CLI. A tiny random Llama with the real tokenizer does the scoring."""

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
from bridgecli.evaluation.answer_loss import answer_loss_task, answer_row, answer_span
from bridgecli.evaluation.tasks import EvalOptions
from bridgecli.format.spec import RESPONSE

from test_eval_heldout import batched_and_one_at_a_time
from tiny import RECORDS

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

MATH = [
    {"problem": "What is $\\frac{1}{2}+\\frac{1}{3}$?",
     "solution": "Add: $\\frac{3}{6}+\\frac{2}{6}=\\boxed{\\frac{5}{6}}$."},
    {"problem": "Solve $x^2=4$ for $x>0$.", "solution": "First $\\boxed{-2}$ is negative, so $x = \\boxed{2}$."},
]
NO_ANSWER = {"prompt": "Say hi.", "completion": "Hi there!"}
ROWS = [*RECORDS, *MATH, NO_ANSWER]


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return str(path)


# -- the span ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "answer"), [
    ("Tom has 7.\n#### 7", "7"),
    ("So 1,000.\n####   1,000  \n", "1,000"),
    ("#### 3\nthen #### 42", "42"),  # the last ####
    ("x #### $18.50 dollars\nmore", "$18.50 dollars"),  # to the end of the line
    ("so $\\boxed{\\frac{1}{2}}$.", "\\frac{1}{2}"),
    ("a \\boxed{1} then \\boxed{ \\{1,2\\} }", "\\{1,2\\}"),  # the last box, balanced, stripped
    ("\\fbox{x+1}", "x+1"),
    ("\\boxed 5 is it", "5"),
])
def test_answer_span(text, answer):
    span = answer_span(text)
    assert span is not None and text[span[0]:span[1]] == answer


@pytest.mark.parametrize("text", ["no answer here", "#### \n", "\\boxed{unclosed", "\\boxed{ }", "####"])
def test_no_answer_span(text):
    assert answer_span(text) is None


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_characters="#\\"), max_size=40),
       st.integers(0, 10**9), st.sampled_from(["", " ", "  "]))
def test_gsm8k_span_is_the_number(reasoning, number, space):
    text = f"{reasoning}\n####{space}{number:,}"
    a, b = answer_span(text)
    assert text[a:b] == f"{number:,}"


def _balanced(draw_leaf):
    return st.recursive(draw_leaf, lambda inner: st.lists(inner, max_size=3).map(lambda xs: "{" + "".join(xs) + "}"),
                        max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(st.text(st.characters(blacklist_characters="{}\\"), max_size=20),
       st.lists(_balanced(st.text(st.characters(blacklist_characters="{}\\ \n\t"), min_size=1, max_size=4)),
                min_size=1, max_size=3).map("".join))
def test_boxed_span_is_the_balanced_content(prefix, content):
    text = f"{prefix} \\boxed{{{content}}} tail }}"
    span = answer_span(text)
    if not content.strip():  # whitespace alone (\r, \x0b, ...) is no answer
        assert span is None
        return
    a, b = span
    assert text[a:b] == content.strip()  # the answer's own edge whitespace is not scored


# -- the loss --------------------------------------------------------------------------------------

def direct(model, tokenizer, path, chat_template=True):
    """Per record with an answer: one unbatched forward over the whole (uncut) sequence, and the
    negative log-likelihood of the response tokens whose characters overlap the answer."""
    out = []
    for _, _, pair in iter_pairs(path, DataOptions()):
        tok = tokenize_pair(tokenizer, pair, chat_template=chat_template)
        t = tok.tokens
        response = [i for i, k in enumerate(t.kinds) if k == RESPONSE]
        start = tok.text.index(pair.response)  # these templates keep the response as written
        span = answer_span(pair.response)
        if span is None:
            out.append(None)
            continue
        a, b = start + span[0], start + span[1]
        picked = [i for i in response if t.offsets[2 * i] < b and t.offsets[2 * i + 1] > a]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([t.input_ids])).logits[0].double(), dim=-1)
        nll = [-float(logp[p - 1, t.input_ids[p]]) for p in picked]
        # the picked tokens spell the answer, and no fewer would
        text = tokenizer.decode([t.input_ids[p] for p in picked])
        assert pair.response[span[0]:span[1]] in text
        if len(picked) > 1:
            assert pair.response[span[0]:span[1]] not in tokenizer.decode([t.input_ids[p] for p in picked[1:]])
            assert pair.response[span[0]:span[1]] not in tokenizer.decode([t.input_ids[p] for p in picked[:-1]])
        out.append((sum(nll), len(nll)))
    return out


@pytest.mark.parametrize("chat_template", [None, False])
def test_loss_equals_a_direct_computation(tiny, data_file, chat_template):
    model, tok = tiny
    run, _ = batched_and_one_at_a_time(answer_loss_task, tiny, data_file, chat_template, batch_size=3)
    expected = direct(model, tok, data_file, chat_template=chat_template is not False)
    found = [e for e in expected if e is not None]
    s = run["summary"]
    assert s["task"] == "answer-loss" and s["metric"] == "loss" and s["average"] == "items"
    assert s["n"] == len(found) == len(ROWS) - 1 and s["no_answer"] == 1 and s["no_answer_ids"] == ["5"]
    assert [i["answer"] for i in run["items"]] == ["7", "60", "70", "\\frac{5}{6}", "2"]
    for item, (total, n) in zip(run["items"], found):
        assert item["tokens"] == n and item["loss_sum"] == pytest.approx(total, rel=1e-5)
        assert item["loss"] == pytest.approx(total / n, rel=1e-5)
    means = [t / n for t, n in found]
    assert s["loss"] == pytest.approx(np.mean(means), rel=1e-5)  # over items, each its token mean
    assert s["loss_token_mean"] == pytest.approx(sum(t for t, _ in found) / sum(n for _, n in found), rel=1e-5)
    assert s["nll_sum_mean"] == pytest.approx(np.mean([t for t, _ in found]), rel=1e-5)
    assert s["ci_low"] <= s["loss"] <= s["ci_high"] and s["bootstrap"]["over"] == "items"


def test_row_is_cut_after_the_answer(tiny, data_file):
    _, tok = tiny
    pair = next(p for _, _, p in iter_pairs(data_file, DataOptions()))
    full = tokenize_pair(tok, pair)
    row, answer = answer_row(pair.id, full)
    assert answer == "7" and row.input_ids == full.tokens.input_ids[:len(row.input_ids)]
    assert row.labels[-1] != -100 and len(row.input_ids) < len(full.tokens.input_ids)  # the EOS is not scored


def test_bad_input_and_options(tiny, tmp_path):
    model, tok = tiny
    none = tmp_path / "none.jsonl"
    none.write_text(json.dumps(NO_ANSWER) + "\n")
    with pytest.raises(InputError, match="none.jsonl.*no record's response holds a final answer"):
        answer_loss_task(model, tok, EvalOptions(data=str(none), progress=False))
    with pytest.raises(UsageError, match="few-shot"):
        answer_loss_task(model, tok, EvalOptions(data=str(none), few_shot=1, progress=False))


def test_cli_writes_and_compares_paired(tiny_model_dir, data_file, tmp_path):
    args = ["eval", str(tiny_model_dir), "--task", "answer-loss", "--data", data_file, "--device", "cpu"]
    for name in ("a", "b"):
        result = CliRunner().invoke(app, args + ["-o", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    s = json.loads((tmp_path / "a" / "eval-answer-loss.json").read_text())["summary"]
    assert f"{s['loss']:.4f} [{s['ci_low']:.4f}, {s['ci_high']:.4f}]" in result.stdout
    table = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--paired"])
    assert table.exit_code == 0, table.output
    assert "paired differences from a" in table.stdout and "+0.0000 [+0.0000, +0.0000]" in table.stdout
