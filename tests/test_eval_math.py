"""bridge eval --task math: \\boxed{} extraction and equivalence through math-verify, loading, the task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridgecli.errors import InputError, UsageError
from bridgecli.evaluation import math_task
from bridgecli.evaluation.math_verify_grader import (extracted_text, is_correct, last_boxed, parse_prediction,
                                                     reference_answer, verify)
from bridgecli.evaluation.tasks import EvalOptions

MATH500 = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "data" / "math" / "math500_test.jsonl",
                            Path("/work/shared/data/math/math500_test.jsonl")) if p.exists()),
               Path("/work/shared/data/math/math500_test.jsonl"))


@pytest.mark.parametrize("text, expected", [
    ("so \\boxed{5}.", "5"),
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last one
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # nested braces
    ("\\fbox{7}", "7"),
    ("$\\boxed 9$", "9"),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}"),
    ("\\boxed{unclosed {", None),
    ("no box", None),
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_extracted_answer():
    assert extracted_text(parse_prediction("work... \\boxed{ 12 }")) == "12"
    two = "\\boxed{1} and then \\boxed{2}"  # several boxes are one answer: all of them, as a set
    assert extracted_text(parse_prediction(two)) == "1,2"
    assert is_correct(two, "1,2") and not is_correct(two, "2")
    assert extracted_text(parse_prediction(
        "Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.")) == "\\frac{3}{4}"
    assert extracted_text(parse_prediction("The final answer is: $7$")) == "7"
    assert extracted_text(parse_prediction("The final answer is:\n")) is None
    assert extracted_text(parse_prediction("I think it is 42")) is None  # no anchor, no answer


def test_reference_answer():
    assert reference_answer("... $\\boxed{2}$ vertical asymptotes.") == "2"
    assert reference_answer("\\boxed{1}", answer=" 3 ") == "3"  # MATH-500's answer field wins
    assert reference_answer("no box") is None


@pytest.mark.parametrize("prediction, reference, equal", [
    ("\\frac12", "\\frac{1}{2}", True),
    ("0.5", "\\frac{1}{2}", True),
    ("-0.5", "-\\frac{1}{2}", True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("\\frac{2}{4}", "\\frac{1}{2}", True),  # equal values (the PRM800K grader required reduced fractions)
    ("14.0", "14", True),
    ("1,000", "1000", True),
    ("1{,}000", "1000", True),
    ("10\\%", "10", True),
    ("30^\\circ", "30", True),
    ("\\$18.90", "18.90", True),
    ("x=5", "5", True),
    ("5\\text{ inches}", "5", True),
    ("\\text{(C)}", "\\text{(C)}", True),
    ("(C)", "\\text{(C)}", True),
    ("\\frac{\\sqrt{3}}{3}", "\\frac{1}{\\sqrt{3}}", True),
    ("3\\sqrt{2}", "\\sqrt{18}", True),
    ("2(x+1)", "2x+2", True),
    ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("\\{1,2\\}", "1, 2", True),  # a set of solutions
    ("2,1", "1,2", True),  # solutions in another order
    ("[2, 5)", "[2,5)", True),
    ("[3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", False),  # an interval is not a point
    ("(1,2,3)", "(1,2)", False),
    ("0.333", "\\frac{1}{3}", False),
    ("3.14", "\\pi", False),
    ("2\\pi", "\\pi \\cdot 2", True),
    ("5", "4", False),
    ("", "1", False),
])
def test_is_correct(prediction, reference, equal):
    assert is_correct(f"so the answer is $\\boxed{{{prediction}}}$.", reference) is equal


def test_is_correct_without_an_answer():
    assert is_correct("I do not know.", "1") is False
    assert verify([], parse_prediction("\\boxed{1}")) is False  # a reference that does not parse


@pytest.mark.skipif(not MATH500.exists(), reason="MATH-500 not available")
def test_math500_answer_fields_match_boxed_solutions():
    lines = MATH500.read_text(encoding="utf-8").splitlines()[:60]
    for line in lines:
        record = json.loads(line)
        assert is_correct(record["solution"], record["answer"]), record["unique_id"]


# -- loading and the task ---------------------------------------------------------------------

ROWS = [
    {"problem": "What is $1+1$?", "solution": "It is $\\boxed{2}$.", "level": "Level 1", "type": "Algebra"},
    {"problem": "Half of 1?", "solution": "$\\boxed{\\frac{1}{2}}$", "answer": "\\frac12", "subject": "Prealgebra",
     "level": 2, "unique_id": "test/x/1.json"},
    {"problem": "Point?", "solution": "$\\boxed{(1,2)}$", "level": "Level 5", "type": "Geometry"},
]


def _write(path: Path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_load(tmp_path):
    items = math_task.load(_write(tmp_path / "m.jsonl", ROWS))
    assert [i.reference for i in items] == ["2", "\\frac12", "(1,2)"]
    assert [i.subject for i in items] == ["Algebra", "Prealgebra", "Geometry"]
    assert items[1].unique_id == "test/x/1.json" and items[1].level == "2"


@pytest.mark.parametrize("row, field, message", [
    ({"solution": "\\boxed{1}"}, "problem", "missing"),
    ({"problem": "p"}, "solution", "missing"),
    ({"problem": 3, "solution": "\\boxed{1}"}, "problem", "expected str"),
    ({"problem": "p", "solution": "no box"}, "solution", "no 'answer' field"),
])
def test_load_errors_name_file_line_field(tmp_path, row, field, message):
    path = _write(tmp_path / "m.jsonl", [ROWS[0], row])
    with pytest.raises(InputError) as info:
        math_task.load(path)
    text = str(info.value)
    assert "m.jsonl" in text and "line 2" in text and f"field '{field}'" in text and message in text
    assert "\n" not in text
    with pytest.raises(InputError, match="line 1.*JSON"):
        math_task.load(_write(tmp_path / "bad.jsonl", ["{oops"]))


def test_prompts():
    shot = math_task.Item(0, 1, "1+1?", "It is \\boxed{2}.", "2", None, None, None)
    chat = math_task.build_prompt("2+2?", [shot], chat=True)
    assert [m["role"] for m in chat] == ["user", "assistant", "user"]
    assert chat[-1]["content"] == "2+2?\n\n" + math_task.INSTRUCTION
    assert chat[1]["content"] == "It is \\boxed{2}."
    plain = math_task.build_prompt("2+2?", [shot], chat=False)
    assert plain == "Problem:\n1+1?\n\nSolution:\nIt is \\boxed{2}.\n\nProblem:\n2+2?\n\nSolution:"


def test_task_grades_with_fake_generation(tmp_path, monkeypatch):
    seen = {}

    def fake_generate(model, tokenizer, prompts, **kwargs):
        seen.update(kwargs, prompts=prompts)
        return ["so \\boxed{2}", "The final answer is $0.5$. I hope it is correct.", "\\boxed{[1,2]}"][:len(prompts)]

    monkeypatch.setattr("bridgecli.evaluation.generate.generate", fake_generate)

    class Tok:
        chat_template = None

    run = math_task.math_task(object(), Tok(), EvalOptions(data=_write(tmp_path / "m.jsonl", ROWS), progress=False))
    s = run["summary"]
    assert [i["correct"] for i in run["items"]] == [True, True, False]
    assert [i["extracted"] for i in run["items"]] == ["2", "\\frac{1}{2}", "[1,2]"]  # as math-verify reads them
    assert s["task"] == "math" and s["n"] == 3 and s["correct"] == 2 and s["accuracy"] == pytest.approx(2 / 3)
    assert s["by_level"]["Level 1"] == {"n": 1, "accuracy": 1.0, "correct": 1}
    assert s["by_subject"]["Geometry"]["correct"] == 0
    assert s["settings"]["stop"] == list(math_task.PLAIN_STOP) and seen["stop"] == math_task.PLAIN_STOP
    assert seen["max_new_tokens"] == math_task.MAX_NEW_TOKENS
    assert seen["prompts"][0] == "Problem:\nWhat is $1+1$?\n\nSolution:"
    json.dumps(run)

    with pytest.raises(UsageError, match="--few-shot 5"):
        math_task.math_task(object(), Tok(), EvalOptions(data=str(tmp_path / "m.jsonl"), few_shot=5, limit=1,
                                                         progress=False))
