"""``bridge analyze fidelity|shift|robustness`` end to end on a tiny random model (in-process
through Typer's runner, plus one real subprocess for the entry point)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bridgecli import plugins
from bridgecli.cli.app import app
from bridgecli.hookspecs import hookimpl

from tiny import sample_inputs

pytestmark = pytest.mark.integration  # warmup, score and the analyses on a tiny model; one subprocess



def bridge(*args, code: int = 0, cwd: Path | None = None):
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    finally:
        os.chdir(old)
    assert result.exit_code == code, f"bridge {' '.join(map(str, args))} -> {result.exit_code}\n{result.output}"
    return result


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("analyze")
    sample_inputs(d, warm=4, val=2, data=4)
    bridge("warmup", d / "warm.jsonl", "--val", d / "val.jsonl", "--model", tiny_model_dir, "--max-steps", "1",
           "--batch-size", "4", "--lr", "1e-3", "-o", d / "warm")
    return d


class ReversedAttention:
    """A scorer plugin: BRIDGE's scores with the prompt columns of A reversed (a worse router)."""

    name = "reversed"

    def __init__(self, ctx):
        from bridgecli.modeling.scoring import BridgeScorer

        self.inner = BridgeScorer(ctx)

    def score(self, batch):
        import msgspec

        from bridgecli.format.records import Array

        return [msgspec.structs.replace(s, scorer=self.name, A=Array.of(s.A.numpy()[:, ::-1], "float16"))
                for s in self.inner.score(batch)]


class ReversedPlugin:
    @hookimpl
    def register_scorers(self, register):
        register("reversed", ReversedAttention, "test: A with reversed prompt columns")


@pytest.fixture
def with_plugin(monkeypatch):
    monkeypatch.setenv("BRIDGE_LOAD_PLUGINS", "")
    plugins.reset()
    try:
        plugins.get_manager().register(ReversedPlugin(), name="reversed-plugin")
        yield
    finally:
        plugins.reset()


def test_fidelity_table_json_plugin_proxy_and_cache(workdir, with_plugin):
    d = workdir
    args = ["analyze", "fidelity", d / "data.jsonl", "--from", d / "warm", "--n", "2", "--batch-size", "16",
            "--cache", d / "cache", "--proxy", "reversed", "-o", d / "fid.json"]
    out = bridge(*args).stdout
    assert "paper (n=200)" in out and "Spearman" in out
    rep = json.loads((d / "fid.json").read_text())
    assert rep["examples_used"] == 2 and rep["params"]["perturb"] == "mask" and rep["cache_hits"] == 0
    assert [(r["side"], r["proxy"]) for r in rep["table"]] == [
        (side, proxy) for side in ("prompt", "response")
        for proxy in ("attention", "attention x a", "reversed (A x a)")]
    for row in rep["table"]:
        assert row["examples"] == 2
        for metric in ("spearman", "overlap", "jaccard", "regret"):
            s = row[metric]
            assert s["count"] + s["undefined"] == 2
            if s["mean"] is not None:
                assert -1 <= s["mean"] <= 1 and s["std"] >= 0
        assert ("paper" in row) == (row["proxy"] != "reversed (A x a)")
    for ex in rep["examples"]:
        assert ex["b_p"] == int(np.ceil(0.75 * ex["m"])) and ex["b_r"] == int(np.ceil(0.75 * ex["n"]))
        assert 0 <= ex["sides"]["prompt"]["attention x a"]["regret"] <= 1
    assert len(list((d / "cache").glob("*.npz"))) == 2

    again = bridge(*args[:-1], d / "fid2.json")  # the cached matrices give the same table
    rep2 = json.loads((d / "fid2.json").read_text())
    assert rep2["cache_hits"] == 2 and rep2["table"] == rep["table"]
    assert "Spearman" in again.stdout


def test_shift_json_and_plot(workdir):
    d = workdir
    bridge("analyze", "shift", d / "data.jsonl", "--from", d / "warm", "--n", "2", "--levels", "1.0,0.6,0.3",
           "--batch-size", "16", "--cache", d / "cache", "-o", d / "shift.json")
    rep = json.loads((d / "shift.json").read_text())
    assert rep["levels"] == [1.0, 0.6, 0.3] and rep["examples_used"] == 2
    assert set(rep["summary"]) == {"exact", "surrogate"}
    for scores in ("exact", "surrogate"):
        for side in ("prompt", "response"):
            first = rep["summary"][scores][side][0]
            assert first["mean"] == pytest.approx(0.0, abs=1e-9)  # full retention: nothing shifts
            assert all(s["mean"] is None or 0 <= s["mean"] <= 2 for s in rep["summary"][scores][side])
    png = d / "shift.png"  # next to the JSON by default
    assert png.exists() and png.stat().st_size > 5000
    from PIL import Image

    assert np.asarray(Image.open(png).convert("L"), dtype=float).var() > 1.0
    sur = bridge("analyze", "shift", d / "data.jsonl", "--from", d / "warm", "--n", "1", "--scores", "surrogate",
                 "--subset", "random", "--levels", "1,0.5", "-o", "-", "--png", d / "s.png")
    rep = json.loads(sur.stdout)
    assert set(rep["summary"]) == {"surrogate"} and rep["params"]["subset"] == "random"


def test_robustness_from_a_scores_stream(workdir):
    d = workdir
    bridge("score", d / "data.jsonl", "--from", d / "warm", "-o", d / "scores.bridge")
    out = bridge("analyze", "robustness", d / "scores.bridge", "-o", d / "rob.json", "--all-swaps").stdout
    assert "robust at b_opp" in out
    rep = json.loads((d / "rob.json").read_text())
    assert rep["examples_used"] == 4
    for ex in rep["examples"]:
        for side in ("prompt", "response"):
            s = ex[side]
            assert len(s["kappa"]) == s["opposite"] and len(s["selected"]) == s["b"]
            assert s["kappa"][-1] >= -1e-6  # the state S^F was selected for
            negative = [q + 1 for q, k in enumerate(s["kappa"]) if k < 0]
            assert [w["q"] for w in s["swaps"]] == negative
            for w in s["swaps"]:
                assert w["out"] in s["selected"] and w["in"] not in s["selected"] and len(w["V"]) == w["q"]
                assert w["gain"] == pytest.approx(-w["kappa"], rel=1e-6, abs=1e-9)
    to_stdout = bridge("analyze", "robustness", d / "scores.bridge", "--rho-p", "0.5", "-o", "-")
    assert json.loads(to_stdout.stdout)["params"]["rho_p"] == 0.5


def test_errors(workdir):
    d = workdir
    r = bridge("analyze", "fidelity", d / "data.jsonl", "--from", d / "warm", "--perturb", "delete", code=2)
    assert "unknown perturbation 'delete'" in r.output
    r = bridge("analyze", "robustness", d / "data.jsonl", code=3)
    assert "run `bridge score` on it" in r.output
    r = bridge("analyze", "shift", d / "data.jsonl", "--from", d / "nowhere", code=5)
    assert "is not a warmup run folder" in r.output
    # rho has one range everywhere, [0, 1] (select's): 1.5 is refused before the model loads
    r = bridge("analyze", "fidelity", d / "data.jsonl", "--from", d / "warm", "--rho-p", "1.5", code=2)
    assert "--rho-p must be a finite number in [0, 1], got 1.5" in r.output
    r = bridge("analyze", "robustness", d / "data.jsonl", "--rho-r", "-0.1", code=2)
    assert "--rho-r must be a finite number in [0, 1]" in r.output


def test_entry_point_lists_the_subcommands():
    proc = subprocess.run([sys.executable, "-m", "bridgecli", "analyze", "--help"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    for name in ("fidelity", "shift", "robustness", "decompose"):
        assert name in proc.stdout
