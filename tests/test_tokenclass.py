"""Token classes for ``bridge inspect --stats``: answer spans, LaTeX, digits, words, the rest."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.analysis.tokenclass import CLASSES, Retention, classify_tokens, region
from bridgecli.core.protect import answer_spans, boxed_spans


def pieces(text: str, cuts: list[str]) -> tuple[str, np.ndarray]:
    assert "".join(cuts) == text
    spans, pos = [], 0
    for c in cuts:
        spans.append((pos, pos + len(c)))
        pos += len(c)
    return text, np.array(spans)


def test_gsm8k_response_classes():
    cuts = ["She", " pays", " $", "5", " x", " 3", " =", " $", "<<", "5", "*", "3", "=", "15", ">>", "15", ".",
            "\n", "####", " ", "15"]
    text, spans = pieces("".join(cuts), cuts)
    got = dict(zip(cuts, classify_tokens(text, spans)))
    assert classify_tokens(text, spans) == [
        "words", "words", "space/punct", "digits", "words", "digits", "math", "space/punct", "math", "digits",
        "math", "digits", "math", "digits", "math", "digits", "space/punct", "space/punct", "answer", "answer",
        "answer"]
    assert got["She"] == "words"


def test_math_boxed_and_latex():
    cuts = ["The", " area", " is", " $", "\\pi", " r", "^", "2", "$", ",", " so", " $", "\\boxed", "{", "\\frac",
            "{", "1", "}{", "2", "}}", "$", "."]
    text, spans = pieces("".join(cuts), cuts)
    cls = classify_tokens(text, spans)
    assert cls[:3] == ["words"] * 3
    assert cls[3:9] == ["math", "math", "math", "math", "digits", "math"]  # inside $...$: math, a digit: digits
    boxed = text.index("\\boxed")
    assert answer_spans(text) == [(boxed, text.index("}}$") + 2)]
    assert cls[12:20] == ["answer"] * 8 and cls[-1] == "space/punct"


def test_answer_spans_last_of_each_kind():
    text = "#### 3 is wrong\nok \\boxed{1} then \\boxed{2{3}}\n  #### 42  \nend"
    spans = answer_spans(text)
    assert [text[s:e] for s, e in spans] == ["\\boxed{2{3}}", "#### 42"]
    assert boxed_spans("\\boxed{unclosed") == [] and answer_spans("no answer here") == []
    # currency is not LaTeX math: "$5 and $10" stays digits / words
    text, spans = pieces("$5 and $10", ["$", "5", " and", " $", "10"])
    assert classify_tokens(text, spans) == ["space/punct", "digits", "words", "space/punct", "digits"]


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet=st.sampled_from(list("ab 12$\\{}=#\n<>.")), max_size=40), data=st.data())
def test_every_token_gets_one_class(text, data):
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(text)), max_size=10))) | {0, len(text)})
    spans = np.array([(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)], dtype=np.int64).reshape(-1, 2)
    cls = classify_tokens(text, spans)
    assert len(cls) == len(spans) and set(cls) <= set(CLASSES)
    for (s, e), c in zip(spans.tolist(), cls):
        piece = text[s:e]
        if c != "answer" and any(ch.isdigit() for ch in piece):
            assert c == "digits", (piece, c)
        if c == "space/punct":
            assert not any(ch.isalnum() or ch in "=\\{}<>" for ch in piece)


def test_retention_counts_and_region():
    text = "xx Tom has 3 apples."
    spans = np.array([[3, 6], [6, 10], [10, 12], [12, 19], [19, 20]])
    sub, shifted = region(text, spans)
    assert sub == "Tom has 3 apples." and shifted[0].tolist() == [0, 3]
    r = Retention()
    r.add(text, spans, np.array([True, False, False, True, True]))
    t = r.table()
    assert t["words"] == {"tokens": 3, "kept": 2, "fraction": 2 / 3}
    assert t["digits"] == {"tokens": 1, "kept": 0, "fraction": 0.0}
    assert t["answer"]["fraction"] is None
