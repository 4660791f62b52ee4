"""bench/train/run.py stays runnable: a two-step CPU run on the bundled sample, as a process of its own,
writes its JSON and table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration  # starts bench/train/run.py as a process of its own
def test_bench_runs_and_reports(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "train" / "run.py"), "--preset", "cpu",
                           "--data", str(ROOT / "examples" / "data" / "train.jsonl"), "--rows", "12", "--steps", "2",
                           "--skip-steps", "0", "--batch-size", "2", "--grad-accum", "2", "--threads", "1",
                           "-o", str(tmp_path), "--name", "smoke"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "smoke.json").read_text())
    s, c, u = saved["summary"], saved["compacted"], saved["uncompacted"]
    assert 0 < s["token_ratio"] < 1 and s["time_ratio"] > 0
    assert c["executed_tokens"] < u["executed_tokens"] and c["supervised_tokens"] == u["supervised_tokens"]
    assert "executed-token ratio" in (tmp_path / "smoke.md").read_text()
    assert "executed-token ratio" in proc.stdout  # it prints the table
