"""bench/diagnostics/code_failures.py, run as a process on a small HumanEval eval result written here (plain and
zstd-compressed): each kind of failure, decided by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench/diagnostics/code_failures.py"


def _item(completion: str, correct: bool = False, status: str = "failed", error: str | None = None) -> dict:
    return {"index": 0, "task_id": "HumanEval/0", "completion": completion, "program": "", "status": status,
            "error": error, "seconds": 0.1, "correct": correct}


ITEMS = [
    # passed, with a final-answer line (a comment in Python): counted in the line column, not as a failure
    _item("    return a + b\n#### 3", correct=True, status="passed"),
    # a GSM8K reply to a code prompt
    _item("The sum is 2 + 3 = <<2+3=5>>5\n#### 5", error="SyntaxError: invalid syntax"),
    # prose: no line reads as Python ("If n = m" is not an assignment)
    _item("If n = m, return the number.\nWe check each digit in turn.", error="SyntaxError: invalid syntax"),
    # the prompt's docstring echoed
    _item("Return the sum of a and b.\n    >>> add(2, 3)\n    5", error="SyntaxError: invalid syntax"),
    # code that does not compile
    _item("def add(a, b):\nreturn a +", error="IndentationError: expected an indented block"),
    # code that runs and fails a test
    _item("    total = a - b\n    return total", error="AssertionError"),
    # code that raises, and code that times out
    _item("    return numbers[10]", error="IndexError: list index out of range"),
    _item("    while True:\n        pass", status="timeout", error="timed out after 10 s"),
]


@pytest.mark.integration  # runs the script as a process
@pytest.mark.parametrize("compressed", [False, True])
def test_each_failure_kind(tmp_path, compressed):
    body = json.dumps({"task": "humaneval", "items": ITEMS}).encode()
    result = tmp_path / ("he.json.zst" if compressed else "he.json")
    result.write_bytes(zstandard.ZstdCompressor().compress(body) if compressed else body)
    out, md = tmp_path / "out.json", tmp_path / "out.md"
    proc = subprocess.run([sys.executable, str(SCRIPT), f"row={result}", "--json", str(out), "--md", str(md)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["rows"]["row"]
    assert row == {"n": 8, "passed": 1, "#### reply": 1, "prose": 2, "broken code": 1, "wrong": 1, "error": 2,
                   "final_line": 2}
    assert "| row | 8 | 1 | 1 | 2 | 1 | 1 | 2 | 2 |" in md.read_text()


@pytest.mark.integration
def test_refuses_a_file_without_completions(tmp_path):
    bad = tmp_path / "gsm8k.json"
    bad.write_text(json.dumps({"task": "gsm8k", "items": [{"prediction": "#### 7", "correct": False}]}))
    proc = subprocess.run([sys.executable, str(SCRIPT), f"row={bad}"], capture_output=True, text=True)
    assert proc.returncode != 0 and f"{bad}: no completions" in proc.stderr
