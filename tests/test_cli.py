"""The CLI through real processes: every step, the shell pipe, stdin/stdout, error paths. The pipe and the
terminal run fresh `python -m bridgecli` interpreters; every other command a forked child of one interpreter
that imported the CLI once (tests/forked_cli.py: a real process, its own files and exit status)."""

from __future__ import annotations

import json
import os
import pty
import shlex
import subprocess
import sys

import numpy as np
import pytest

from bridgecli.format.reader import read_all

from tiny import sample_inputs

BRIDGE = [sys.executable, "-m", "bridgecli"]
pytestmark = pytest.mark.integration  # every test runs `bridge` processes


@pytest.fixture(scope="module")
def bridge(bridge_cli):
    """`bridge ARGS` in a process (a forked child, see the module's docstring); with ``check`` its exit is 0."""
    return bridge_cli


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir, bridge):
    d = tmp_path_factory.mktemp("cli")
    sample_inputs(d, warm=6, val=3, data=5, test=2)
    bridge("warmup", "warm.jsonl", "--val", "val.jsonl", "--model", tiny_model_dir, "--max-steps", "2",
           "--batch-size", "3", "--lr", "1e-3", cwd=d)  # default -o: runs/warmup
    return d


def test_warmup_folder(workdir, tiny_model_dir):
    run = workdir / "runs" / "warmup"
    meta = json.loads((run / "warmup.json").read_text())
    assert meta["base_model"] == str(tiny_model_dir)
    assert meta["warm_examples"] == 6 and meta["val_examples"] == 3 and meta["steps"] == 2
    assert (run / "direction.safetensors").exists() and (run / "checkpoint" / "config.json").exists()
    assert meta["direction"]["v_norm"] > 0


def test_full_pipeline_in_steps_and_as_a_pipe(workdir, bridge):
    d = workdir
    bridge("score", "data.jsonl", "-o", "scores.bridge", cwd=d)  # default --from: runs/warmup
    bridge("select", "scores.bridge", "-o", "sel.bridge", "--rho-p", "0.75", "--rho-r", "0.75", "-T", "4", cwd=d)
    bridge("close", "sel.bridge", "-o", "closed.bridge", "--segmenter", "math", cwd=d)
    bridge("compact", "closed.bridge", "-o", "train.jsonl", cwd=d)

    b = " ".join(shlex.quote(x) for x in BRIDGE)
    pipe = (f"set -o pipefail; {b} score data.jsonl | tee piped-scores.bridge | {b} select --rho-p 0.75 --rho-r 0.75 "
            f"-T 4 | {b} close --segmenter math | {b} compact -o piped.jsonl")
    proc = subprocess.run(["bash", "-c", pipe], cwd=d, capture_output=True,
                          env={**os.environ, "BRIDGE_NO_PROGRESS": "1"})
    assert proc.returncode == 0, proc.stderr.decode()
    # scoring to stdout gives the scores of scoring to a file: the same records, the values up to float32 noise
    # (CPU reductions need not be bitwise stable between two processes on a loaded machine)
    _, to_file = read_all(str(d / "scores.bridge"))
    _, to_pipe = read_all(str(d / "piped-scores.bridge"))
    assert [(e.id, e.tokens) for e in to_pipe] == [(e.id, e.tokens) for e in to_file]
    for x, y in zip(to_pipe, to_file):
        for name in ("a", "c", "A"):
            np.testing.assert_allclose(getattr(x.scores, name).numpy("float64"),
                                       getattr(y.scores, name).numpy("float64"), rtol=1e-4, atol=1e-5)
    # and the piped steps give, byte for byte, what the same steps give on those scores one file at a time
    bridge("select", "piped-scores.bridge", "-o", "sel2.bridge", "--rho-p", "0.75", "--rho-r", "0.75", "-T", "4", cwd=d)
    bridge("close", "sel2.bridge", "-o", "closed2.bridge", "--segmenter", "math", cwd=d)
    bridge("compact", "closed2.bridge", "-o", "train2.jsonl", cwd=d)
    assert (d / "piped.jsonl").read_text() == (d / "train2.jsonl").read_text()

    header, exs = read_all(d / "closed.bridge")
    assert header.stage == "closure" and [s.step for s in header.steps] == ["score", "select", "close"]
    assert len(exs) == 5
    rows = [json.loads(line) for line in (d / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [e.id for e in exs if e.closure.supervise]
    for r, e in zip(rows, exs):
        assert len(r["input_ids"]) == len(r["labels"])
        sup = [x for x in r["labels"] if x != -100]
        assert len(sup) == len(e.closure.supervise) + 1  # + EOS
        assert len(e.closure.supervise) <= e.selection.b_r
        assert len(r["input_ids"]) == len(e.tokens.input_ids) - (len(e.tokens.prompt_positions())
                                                                - len(e.selection.prompt_keep))
    meta = json.loads((d / "train.jsonl.bridge.json").read_text())
    assert meta["rows"] == len(rows)

    text = bridge("compact", "closed.bridge", "--format", "text", cwd=d).stdout.decode()
    assert sum(line.startswith("### ") for line in text.splitlines()) == len(rows) and "[[" in text

    info = json.loads(bridge("inspect", "closed.bridge", "--json", cwd=d).stdout)
    assert info["stage"] == "closure" and info["examples"] == 5
    assert info["selection"]["prompt_kept"] == sum(len(e.selection.prompt_keep) for e in exs)
    assert "closure" in bridge("inspect", "closed.bridge", cwd=d).stdout.decode()


def test_train_and_eval(workdir, tiny_model_dir, bridge):
    d = workdir
    if not (d / "train.jsonl").exists():
        pytest.skip("needs the pipeline test's output")
    bridge("train", "train.jsonl", "-o", "final", "--max-steps", "1", "--batch-size", "2", "--grad-accum", "2", cwd=d)
    summary = json.loads((d / "final" / "bridge_train.json").read_text())
    assert summary["base_model"] == str(tiny_model_dir)  # theta_old, found through the compact sidecar
    assert summary["steps"] == 1
    lines = (d / "final" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["tokens"] > 0
    out = bridge("eval", "final", "--task", "gsm8k", "--data", "test.jsonl", "--max-new-tokens", "4",
                 "--batch-size", "2", cwd=d).stdout.decode()
    assert "gsm8k" in out
    result = json.loads((d / "final" / "eval-gsm8k.json").read_text())
    assert result["summary"]["n"] == 2 and len(result["items"]) == 2
    assert 0.0 <= result["summary"]["accuracy"] <= 1.0


def test_binary_output_refused_on_a_terminal(workdir):
    master, slave = pty.openpty()
    try:
        proc = subprocess.run([*BRIDGE, "score", "data.jsonl"], cwd=workdir, stdout=slave, stderr=subprocess.PIPE,
                              env={**os.environ, "BRIDGE_NO_PROGRESS": "1"})
    finally:
        os.close(slave)
        os.close(master)
    err = proc.stderr.decode().strip()
    assert proc.returncode == 2
    assert len(err.splitlines()) == 1 and "refusing to write" in err and "terminal" in err


def test_bad_jsonl_line_names_file_and_line(workdir, bridge):
    (workdir / "bad.jsonl").write_text('{"question": "q", "answer": "a"}\n{"question": oops}\n')
    proc = bridge("score", "bad.jsonl", "-o", "bad.bridge", cwd=workdir, check=False)
    errors = [line for line in proc.stderr.decode().splitlines() if "error" in line]
    assert proc.returncode == 4
    assert len(errors) == 1 and errors[0].startswith("bridge score: error: bad.jsonl, line 2: invalid JSON")
    assert "Traceback" not in proc.stderr.decode()
    assert not (workdir / "bad.bridge").exists()  # nothing half-written
    assert not list(workdir.glob(".bad.bridge.*"))


def test_missing_field_names_field(workdir, bridge):
    (workdir / "nofield.jsonl").write_text('{"question": "q"}\n')
    proc = bridge("score", "nofield.jsonl", "-o", "x.bridge", cwd=workdir, check=False)
    assert proc.returncode == 4 and "nofield.jsonl, line 1" in proc.stderr.decode()


def test_score_without_warmup_names_the_command(tmp_path, bridge):
    (tmp_path / "d.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    proc = bridge("score", "d.jsonl", "-o", "x.bridge", cwd=tmp_path, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 5 and "bridge warmup" in err and "runs/warmup" in err


def test_stage_checks(workdir, bridge):
    proc = bridge("close", "scores.bridge", "-o", "x.bridge", cwd=workdir, check=False)
    assert proc.returncode == 3 and "run `bridge select` first" in proc.stderr.decode()
    proc = bridge("select", "data.jsonl", "-o", "x.bridge", cwd=workdir, check=False)
    assert proc.returncode == 3 and "bridge score" in proc.stderr.decode()


def test_schedules_and_flags_validated(workdir, bridge):
    proc = bridge("select", "scores.bridge", "-o", "x.bridge", "--rho-p", "1.5", cwd=workdir, check=False)
    assert proc.returncode == 2 and "--rho-p" in proc.stderr.decode()
    proc = bridge("select", "scores.bridge", "-o", "x.bridge", "--method", "nope", cwd=workdir, check=False)
    assert proc.returncode == 6 and "independent" in proc.stderr.decode()
    for method in ("independent", "one-pass"):
        bridge("select", "scores.bridge", "-o", f"{method}.bridge", "--method", method, cwd=workdir)
        _, exs = read_all(workdir / f"{method}.bridge")
        assert all(e.selection.method == method for e in exs)
