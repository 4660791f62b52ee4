"""bench/cpu_steps/scaling.py stays runnable: on a tiny synthetic stream, every step with --workers 1 and 2
gives byte-identical outputs, and it says so in its JSON."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import zstandard

from bridgecli.format.reader import read_all
from bridgecli.format.spec import PREAMBLE

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "cpu_steps" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scaling_reports_identical_outputs(tmp_path):
    scaling = _load("scaling")
    code = scaling.main(["--make", "200", "--workers", "1,2", "--python", sys.executable, "--keep", str(tmp_path),
                         "--json", str(tmp_path / "s.json")])
    res = json.loads((tmp_path / "s.json").read_text())
    assert code == 0 and res["identical"] and res["examples"] == 200
    for step in ("select", "close", "compact"):
        for w in ("1", "2"):
            run = res["steps"][step][w]
            assert run["identical_to_1"] and run["wall_s"] > 0 and run["examples_per_s"] > 0
    # what it compares: a stream's bytes after its header's frame, found without zstd as zstd finds it
    closed = tmp_path / "close.2.closed.bridge"
    d = zstandard.ZstdDecompressor().decompressobj()
    d.decompress(closed.read_bytes()[PREAMBLE.size:])
    assert scaling.comparable(closed) == hashlib.sha256(d.unused_data).hexdigest()
    assert len((tmp_path / "compact.2.rows.jsonl").read_text().splitlines()) == 200


def test_synthetic_stream_has_gsm8k_sizes_and_passes_validation(tmp_path):
    sizes = _load("synthetic").make_stream(tmp_path / "s.bridge", 300, frame=64)
    assert 50 < sizes["prompt_tokens"] < 70 and 110 < sizes["response_tokens"] < 140
    header, exs = read_all(tmp_path / "s.bridge")  # validates every example
    assert header.stage == "scores" and len(exs) == 300 and len({ex.id for ex in exs}) == 300
    ex = exs[0]
    spans = ex.tokens.spans()
    assert "".join(ex.text[a:b] for a, b in spans) == ex.text  # offsets cover the text, token after token
    assert "####" in ex.text[spans[ex.tokens.response_positions()[0], 0]:]
