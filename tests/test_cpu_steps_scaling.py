"""bench/cpu_steps/scaling.py and synthetic.py stay runnable, each run as a user runs it (a process of its
own): on a tiny synthetic stream, every step with --workers 1 and 2 gives byte-identical outputs and the
JSON says so; the synthetic stream has GSM8K sizes and passes validation."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

from bridgecli.format.reader import read_all
from bridgecli.format.spec import PREAMBLE, PROMPT, RESPONSE

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration  # each test starts the bench script, which starts the steps


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, str(ROOT / "bench" / "cpu_steps" / script), *args], env=env,
                          capture_output=True, text=True, timeout=600)


def _after_header(path: Path) -> str:
    """The sha256 of a stream's bytes after its header's zstd frame, found by zstd itself."""
    d = zstandard.ZstdDecompressor().decompressobj()
    d.decompress(path.read_bytes()[PREAMBLE.size:])
    return hashlib.sha256(d.unused_data).hexdigest()


def test_scaling_reports_identical_outputs(tmp_path):
    proc = _run("scaling.py", "--make", "200", "--workers", "1,2", "--python", sys.executable, "--keep", str(tmp_path),
                "--json", str(tmp_path / "s.json"))
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "s.json").read_text())
    assert res["identical"] and res["examples"] == 200
    for step in ("select", "close", "compact"):
        for w in ("1", "2"):
            run = res["steps"][step][w]
            assert run["identical_to_1"] and run["wall_s"] > 0 and run["examples_per_s"] > 0
    # what it compared, checked here without it: the streams after their header, the rows whole
    for name in ("select.{}.selected.bridge", "close.{}.closed.bridge"):
        assert _after_header(tmp_path / name.format(1)) == _after_header(tmp_path / name.format(2))
    rows = [(tmp_path / f"compact.{w}.rows.jsonl").read_text() for w in (1, 2)]
    assert rows[0] == rows[1] and len(rows[0].splitlines()) == 200


def test_synthetic_stream_has_gsm8k_sizes_and_passes_validation(tmp_path):
    proc = _run("synthetic.py", str(tmp_path / "s.bridge"), "-n", "300", "--frame", "64")
    assert proc.returncode == 0, proc.stderr
    assert "300 examples" in proc.stdout
    header, exs = read_all(tmp_path / "s.bridge")  # validates every example
    assert header.stage == "scores" and len(exs) == 300 and len({ex.id for ex in exs}) == 300
    prompt = sum(ex.tokens.kinds.count(PROMPT) for ex in exs) / len(exs)
    response = sum(ex.tokens.kinds.count(RESPONSE) for ex in exs) / len(exs)
    assert 50 < prompt < 70 and 110 < response < 140
    ex = exs[0]
    spans = ex.tokens.spans()
    assert "".join(ex.text[a:b] for a, b in spans) == ex.text  # offsets cover the text, token after token
    assert "####" in ex.text[spans[ex.tokens.response_positions()[0], 0]:]
