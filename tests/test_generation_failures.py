"""bench/diagnostics/generation_failures.py, run as a process on a small eval result written here: the
counts it reports, worked out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration  # runs the script as a process
def test_counts_runaways_final_lines_and_foreign_operands(tmp_path):
    items = [
        # operands 48 and 2: 48 is the question's, 2 is not; the second calculation uses 24, the first's result
        {"question": "Natalia sold 48 clips.", "prediction": "48/2 = <<48/2=24>>24\n24+1,000 = <<24+1000=1024>>1024\n#### 1024",
         "correct": True, "hit_limit": False, "new_tokens": 30},
        # every operand foreign; ran into the limit
        {"question": "A robe takes 2 bolts.", "prediction": "<<7*9=63>>63 <<63+5=68>>68 <<68+5=73>>", "correct": False,
         "hit_limit": True, "new_tokens": 512},
        # no calculation at all
        {"question": "How many?", "prediction": "#### 7", "correct": False, "hit_limit": False, "new_tokens": 4},
    ]
    result = tmp_path / "acc.json"
    result.write_text(json.dumps({"task": "gsm8k", "items": items}))
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/diagnostics/generation_failures.py"), f"row={result}", "--json", str(out)],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    row = json.loads(out.read_text())["rows"]["row"]
    assert row["n"] == 3 and row["hit_limit"] == 1
    assert row["accuracy"] == pytest.approx(1 / 3) and row["accuracy_stopped"] == pytest.approx(1 / 2)
    assert row["final_line"] == pytest.approx(2 / 3)
    assert row["mean_new_tokens"] == pytest.approx(546 / 3)
    # first calculations: (48, 2) and (7, 9): 3 of 4 foreign
    assert (row["first_calc_operands"], row["first_calc_foreign"]) == (4, pytest.approx(3 / 4))
    # every calculation: 48 2 | 24 1000 | 7 9 | 63 5 | 68 5 -> foreign: 2, 1000, 7, 9, 5, 5 = 6 of 10
    assert (row["calc_operands"], row["calcs_foreign"]) == (10, pytest.approx(6 / 10))


@pytest.mark.integration
def test_refuses_a_file_without_predictions(tmp_path):
    bad = tmp_path / "loss.json"
    bad.write_text(json.dumps({"task": "heldout-loss", "items": [{"loss": 1.0}]}))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench/diagnostics/generation_failures.py"), f"row={bad}"],
        capture_output=True, text=True,
    )
    assert proc.returncode != 0
    assert f"{bad}: no predictions" in proc.stderr
