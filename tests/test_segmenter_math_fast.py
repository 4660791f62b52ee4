"""The math segmenter's expression scan skips runs that cannot hold an expression (segmenting/math_spans.py,
``_expression_spans``); here against the scan it replaced, which trimmed every run."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.segmenting.math_spans import (
    _MATH_SCAN, _MATH_TOKEN, _OPERANDS, _expression_spans, _is_expression, _trim_run,
)


def old_expression_spans(text: str, start: int, end: int):
    spans, run = [], []

    def close() -> None:
        trimmed = _trim_run(run)
        if trimmed and _is_expression(trimmed):
            spans.append((trimmed[0][2], trimmed[-1][3]))
        run.clear()

    for m in _MATH_TOKEN.finditer(text, start, end):
        kind = m.lastgroup or "other"
        token = ("operator" if kind == "times" else kind, m.group(), m.start(), m.end())
        if token[0] == "other":
            close()
            continue
        if token[0] in _OPERANDS and len(run) >= 2 and run[-1][0] == "space" and run[-2][0] in _OPERANDS:
            run.pop()
            close()
        run.append(token)
    close()
    return spans


MATHY = st.text(alphabet="abxX×12 3.,0$<>=+-−*/()%^\t\nAzé_ ;:!?'\"\r", max_size=60)
WORDS = st.lists(st.sampled_from(["a", "x", "ab", "3", "4.5", "1,000", " ", "  ", "+", "-", "=", "(", ")", "%", "x",
                                  "<<2*3=6>>6", "$<<1+1=2>>2", "$5", "he", "-(", "5x3", "2 x 4", "y_1", "≤", ".", "\n", "cost", "is", ", ", "? ",
                                  "'s", "x:", "\r\n", "Xy", "ab1", "he's", "!=", "!", "is!="]),
                  max_size=25).map("".join)


@settings(max_examples=600, deadline=None)
@given(text=st.one_of(MATHY, WORDS), data=st.data())
def test_same_spans_as_the_scan_it_replaced(text, data):
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    assert _expression_spans(text, start, end) == old_expression_spans(text, start, end)


def test_same_spans_on_gsm8k_answers():
    path = next((p / "gsm8k" / "train.jsonl" for p in (Path(__file__).resolve().parents[2] / "shared" / "data",
                                                       Path("/work/shared/data")) if (p / "gsm8k").is_dir()), None)
    if path is None:  # the real answers where this checkout has them; the generated sample otherwise
        from tiny import sample_module

        answers = [r["answer"] for r in sample_module().generate(300, seed=0)]
    else:
        import json

        answers = [json.loads(line)["answer"] for line in path.read_text().splitlines()[:1500]]
    for text in answers:
        assert _expression_spans(text, 0, len(text)) == old_expression_spans(text, 0, len(text))


@settings(max_examples=600, deadline=None)
@given(text=st.one_of(MATHY, WORDS))
def test_scan_tokens_are_the_old_tokens_with_prose_joined(text):
    old = [(m.lastgroup, m.start(), m.end()) for m in _MATH_TOKEN.finditer(text)]
    k = 0
    for m in _MATH_SCAN.finditer(text):
        if m.lastgroup != "other":
            assert old[k] == (m.lastgroup, m.start(), m.end())
            k += 1
            continue
        # one "other" token of the old scan, or several with only spaces between them
        assert old[k][0] == "other" and old[k][1] == m.start()
        while old[k][2] < m.end():
            k += 1
            assert old[k][0] in ("other", "space")
        assert old[k][0] == "other" and old[k][2] == m.end()
        k += 1
    assert k == len(old)
