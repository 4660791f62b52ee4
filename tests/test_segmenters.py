"""The built-in segmenters: the span contract on arbitrary text, and the units they are meant to make."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.builtin import segmenters
from bridgecli.builtin.segmenters import SEGMENTERS, validate_spans

GSM8K = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
    "#### 72"
)


def units(name: str, text: str) -> list[str]:
    """The units the built-in segmenter registered as ``name`` cuts ``text`` into, checked against the contract."""
    spans = SEGMENTERS[name](text)
    validate_spans(text, spans)
    return [text[a:b] for a, b in spans]


# --- the contract, on any text ------------------------------------------------------------------

# Pieces that reach the interesting branches: fences, python, LaTeX, annotations, list markers.
FRAGMENTS = [
    "```", "```python\n", "```js\n", "~~~\n", "\n```\n", "def f(x):\n", "    ", "\t", "return x\n",
    "for i in range(3):\n", "@dec\n", '"""doc"""\n', "if a: b = 1\n", "else:\n", "foo(1,\n", "# c\n",
    "<<48/2=24>>24", "<<", ">>", "$", "$$", "\\(", "\\)", "\\[", "\\]", "\\boxed{", "{", "}", "#### 72",
    "1. ", "- ", "* ", "(a) ", "Step 1: ", "2 * 3 = 6", "x", " = ", "(", ")", "-", "3.5", "e.g. ",
    "Mr. ", ". ", "! ", "? ", "\n", "\n\n", "\r\n", "\r", " ", "word", "é", "×", "≤", "\u2028", "\x0c",
]
ANY_TEXT = st.text(max_size=200)
SYMBOL_TEXT = st.text(alphabet="0123456789+-*/=^%()<>xa .!?\n\t `$#{}\\:@'\"", max_size=200)
FRAGMENT_TEXT = st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
TEXTS = st.one_of(ANY_TEXT, SYMBOL_TEXT, FRAGMENT_TEXT)


@pytest.mark.parametrize("name", sorted(SEGMENTERS))
@settings(max_examples=300, deadline=None)
@given(text=TEXTS)
def test_spans_meet_the_contract(name, text):
    fn = SEGMENTERS[name]
    spans = fn(text)
    assert isinstance(spans, list)
    assert all(isinstance(s, tuple) and len(s) == 2 and all(type(v) is int for v in s) for s in spans)
    validate_spans(text, spans)  # sorted, non-overlapping, in range, non-empty, not whitespace-only
    for a, b in spans:
        assert not text[a].isspace() and not text[b - 1].isspace()
    assert fn(text) == spans  # deterministic


ODD_INPUTS = [
    "", " ", "\n\n\n", "\r\n\r\n", "\ud800", "'\ud800'\n", "a\0b", "(" * 500, "-" * 5000 + "1",
    "```", "```python", "```python\n", "```python\n" + "-" * 5000 + "1", "\x0c\x0b", "if 1:\n\tx\n        y",
    "```python\n'''unterminated", "```py\n  x = 1\n y = 2", "\\boxed{{{", "$$$", "<<<<>>>>", "#### ",
]


@pytest.mark.parametrize("name", sorted(SEGMENTERS))
@pytest.mark.parametrize("text", ODD_INPUTS)
def test_odd_inputs_do_not_raise(name, text):
    validate_spans(text, SEGMENTERS[name](text))


def test_validate_spans_rejects_bad_spans():
    for bad in ([(0, 0)], [(0, 9)], [(2, 4), (0, 1)], [(0, 3), (2, 4)], [(2, 3)]):
        with pytest.raises(ValueError):
            validate_spans("ab cd", bad)
    validate_spans("ab cd", [(0, 2), (3, 5)])


# --- registration -------------------------------------------------------------------------------


def test_hook_registers_every_builtin():
    registered = {}

    def register(name, fn, description=""):
        assert name not in registered
        registered[name] = (fn, description)

    segmenters.register_segmenters(register=register)
    assert set(registered) == {"sentence", "math", "step", "list", "code"}
    assert {name: fn for name, (fn, _) in registered.items()} == SEGMENTERS
    assert all(description for _, description in registered.values())


# --- sentence -----------------------------------------------------------------------------------


def test_sentence_gsm8k_keeps_annotations_inside():
    assert units("sentence", GSM8K) == [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.",
        "#### 72",
    ]


def test_sentence_does_not_split_decimals_or_abbreviations():
    text = "It costs 3.5 dollars, e.g. for Mr. Smith. Really? Yes!\n1. First step. Then <<3. 5=1>> x.\n\nNew"
    assert units("sentence", text) == [
        "It costs 3.5 dollars, e.g. for Mr. Smith.",
        "Really?",
        "Yes!",
        "1. First step.",
        "Then <<3. 5=1>> x.",
        "New",
    ]


def test_sentence_keeps_closing_quote():
    assert units("sentence", 'He said "stop." Then left') == ['He said "stop."', "Then left"]


# --- math ---------------------------------------------------------------------------------------


def test_math_paper_example_is_one_unit():
    text = "so 2 * 3 = 6 apples"
    assert SEGMENTERS["math"](text) == [(3, 12)]
    assert units("math", "2 * 3 = 6") == ["2 * 3 = 6"]


def test_math_gsm8k_equations_and_answer():
    assert units("math", GSM8K) == ["48/2 = <<48/2=24>>24", "48+24 = <<48+24=72>>72", "#### 72"]


def test_math_annotation_with_result_alone_and_currency():
    assert units("math", "She got <<48/2=24>>24 clips") == ["<<48/2=24>>24"]
    text = "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute. She paid $5 and $10 for it."
    assert units("math", text) == ["12/60 = $<<12/60=0.2>>0.2", "$5", "$10"]


def test_math_latex():
    text = r"Let $x^2 + 1$ be y, $$\int_0^1 f$$ and \(a+b\) or \[c = d\] so \boxed{\frac{1}{2}}."
    assert units("math", text) == [
        "$x^2 + 1$", r"$$\int_0^1 f$$", r"\(a+b\)", r"\[c = d\]", r"\boxed{\frac{1}{2}}",
    ]


def test_math_expressions_exclude_prose_and_dangling_operators():
    text = "Then -3 + (4 - x) = 2x, 50% of 3 a day.\n- 7 apples\n(so 1 + 1 = 2)\n7 × 8 ≤ 60"
    assert units("math", text) == ["-3 + (4 - x) = 2x", "50%", "3", "7", "1 + 1 = 2", "7 × 8 ≤ 60"]
    assert units("math", "I think a word like and/or is prose") == []


# --- step ---------------------------------------------------------------------------------------


def test_step_one_unit_per_line():
    assert units("step", GSM8K + "\n\n") == [
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.",
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.",
        "#### 72",
    ]


def test_step_single_line_falls_back_to_sentences():
    assert units("step", "  First we add. Then we divide!  ") == ["First we add.", "Then we divide!"]


# --- list ---------------------------------------------------------------------------------------


def test_list_items_with_continuations_and_paragraphs():
    text = (
        "Here are the steps:\n"
        "1. Buy milk\n"
        "   with a note\n"
        "2) Pay\n"
        "\n"
        "- bullet a\n"
        "  continued\n"
        "* bullet b\n"
        "(a) sub\n"
        "b. sub2\n"
        "**Step 3:** done\n"
        "\n"
        "# Heading\n"
        "Some paragraph\n"
        "spanning two lines.\n"
        "\n"
        "#### 72"
    )
    assert units("list", text) == [
        "Here are the steps:",
        "1. Buy milk\n   with a note",
        "2) Pay",
        "- bullet a\n  continued",
        "* bullet b",
        "(a) sub",
        "b. sub2",
        "**Step 3:** done",
        "# Heading",
        "Some paragraph\nspanning two lines.",
        "#### 72",
    ]


def test_list_does_not_take_numbers_or_bold_for_items():
    assert units("list", "3.5 kg of flour\n**Bold** text") == ["3.5 kg of flour\n**Bold** text"]


# --- code ---------------------------------------------------------------------------------------

PYTHON_ANSWER = '''Here is the code.

```python
import math

@decorator(1)
def total(xs):
    """Sum xs."""
    t = 0  # start
    for i in range(3):
        if i: t += xs[i]; t -= 1
        elif i > 2:
            pass
        else:
            t = (1 +
                 2)
    try:
        x = 1
    except ValueError as e:
        raise
    finally:
        y = 2
    return t
```
It returns the total. Done.'''


def test_code_python_fence_by_statement():
    assert units("code", PYTHON_ANSWER) == [
        "Here is the code.",
        "```python",
        "import math",
        "@decorator(1)",
        "def total(xs):",
        '"""Sum xs."""',
        "t = 0",
        "# start",
        "for i in range(3):",
        "if i:",
        "t += xs[i]",
        "t -= 1",
        "elif i > 2:",
        "pass",
        "else:",
        "t = (1 +\n                 2)",
        "try:",
        "x = 1",
        "except ValueError as e:",
        "raise",
        "finally:",
        "y = 2",
        "return t",
        "```",
        "It returns the total.",
        "Done.",
    ]


def test_code_match_statement_headers_are_separate():
    text = "match t:\n    case 1:\n        y = 1\n    case _:\n        y = 2\n"
    assert units("code", text) == ["match t:", "case 1:", "y = 1", "case _:", "y = 2"]


def test_code_unfenced_python_that_parses():
    text = "def f(x):\n    return x\n\nprint(f(1))\n"
    assert units("code", text) == ["def f(x):", "return x", "print(f(1))"]


def test_code_truncated_python_falls_back_to_logical_lines():
    text = "```python\ndef f(x):\n    for i in range(3):\n        total = foo(i,\n                    x"
    assert units("code", text) == [
        "```python",
        "def f(x):",
        "for i in range(3):",
        "total = foo(i,\n                    x",
    ]


def test_code_bad_indentation_falls_back_to_physical_lines():
    assert units("code", "```py\ndef f(x):\n  return 1\n x = 2\ny = 3\n") == [
        "```py", "def f(x):", "return 1", "x = 2", "y = 3",
    ]


def test_code_other_language_by_line():
    text = "Try this:\n```js\nfunction f(x) {\n  return x + 1;\n}\n```\nDone."
    assert units("code", text) == [
        "Try this:", "```js", "function f(x) {", "return x + 1;", "}", "```", "Done.",
    ]


def test_code_indented_fence_in_a_list_item():
    text = "- item:\n  ```python\n  x = 1\n  if x:\n      y = 2\n  ```\n"
    assert units("code", text) == ["- item:", "```python", "x = 1", "if x:", "y = 2", "```"]


def test_code_offsets_survive_non_ascii():
    text = "x = 'é'; y = \"ü\" + 'ab'  # ç\n"
    assert units("code", text) == ["x = 'é'", "y = \"ü\" + 'ab'", "# ç"]


def test_code_prose_without_fences_is_split_into_sentences():
    assert units("code", "The loop runs 3 times. It stops.") == ["The loop runs 3 times.", "It stops."]
