"""bench/train/run.py stays runnable: a two-step CPU run on the bundled sample writes its JSON and table."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def test_bench_runs_and_reports(tmp_path):
    spec = importlib.util.spec_from_file_location("train_bench", ROOT / "bench" / "train" / "run.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:
        result = bench.main(["--preset", "cpu", "--data", str(ROOT / "examples" / "data" / "train.jsonl"), "--rows",
                             "12", "--steps", "2", "--skip-steps", "0", "--batch-size", "2", "--grad-accum", "2",
                             "--threads", "1", "-o", str(tmp_path), "--name", "smoke"])
    finally:
        torch.set_num_threads(threads)
    saved = json.loads((tmp_path / "smoke.json").read_text())
    assert saved["summary"] == result["summary"]
    s, c, u = result["summary"], result["compacted"], result["uncompacted"]
    assert 0 < s["token_ratio"] < 1 and s["time_ratio"] > 0
    assert c["executed_tokens"] < u["executed_tokens"] and c["supervised_tokens"] == u["supervised_tokens"]
    assert "executed-token ratio" in (tmp_path / "smoke.md").read_text()
