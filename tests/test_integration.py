"""The real default model (SmolLM2-135M-Instruct from the embedded GGUF) on a handful of examples:
warmup -> score -> select -> close -> compact in-process, and the JVP a_j against the exact
per-token-backward scorer on the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bridgecli.data.examples import DataOptions, iter_examples
from bridgecli.format.reader import read_all
from bridgecli.modeling.loading import load_model, load_tokenizer
from bridgecli.modeling.scoring import BridgeScorer, ExactScorer, ScoringContext
from bridgecli.artifacts.warmup_run import WarmupRun
from bridgecli.steps.close import CloseOptions, run_close
from bridgecli.steps.compact import CompactOptions, run_compact
from bridgecli.steps.score import ScoreOptions, run_score
from bridgecli.steps.select import SelectOptions, run_select
from bridgecli.steps.warmup import WarmupOptions, run_warmup
from bridgecli.training.config import SFTConfig

from tiny import head

pytestmark = pytest.mark.integration
SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data"
GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k" / "train.jsonl"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("real")
    warm = head(SAMPLE / "warm.jsonl", d / "warm.jsonl", 4)
    val = head(SAMPLE / "val.jsonl", d / "val.jsonl", 2)
    run_warmup(WarmupOptions(data=str(warm), val=str(val), out=d / "warmup", device="cpu",
                             sft=SFTConfig(epochs=1, batch_size=4, grad_accum=1, max_steps=1)))
    return d


def test_pipeline_on_the_default_model(run_dir):
    d = run_dir
    meta = json.loads((d / "warmup" / "warmup.json").read_text())
    assert meta["base_model"] == "smollm2" and meta["steps"] == 1
    data = head(SAMPLE / "train.jsonl", d / "data.jsonl", 3)
    run_score(ScoreOptions(data=str(data), out=str(d / "s.bridge"), run=d / "warmup", device="cpu", batch_size=3))
    run_select(SelectOptions(inp=str(d / "s.bridge"), out=str(d / "sel.bridge"), rho_p=0.75, rho_r=0.75, rounds=4))
    run_close(CloseOptions(inp=str(d / "sel.bridge"), out=str(d / "c.bridge"), segmenter="math"))
    stats = run_compact(CompactOptions(inp=str(d / "c.bridge"), out=str(d / "train.jsonl")))
    header, exs = read_all(d / "c.bridge")
    assert header.model.source == "smollm2" and len(exs) == 3
    for ex in exs:
        a = ex.scores.a.numpy()
        assert np.isfinite(a).all() and a.std() > 0
        A, c = ex.scores.A.numpy(), ex.scores.c.numpy()
        assert (A >= 0).all() and (A.sum(1) + c <= 1.001).all()
        assert np.all(np.diff(ex.selection.u_sur) >= -1e-6 * np.abs(ex.selection.u_sur).max())
        assert len(ex.closure.supervise) <= ex.selection.b_r
    assert stats.rows + len(stats.dropped) == 3


def test_jvp_matches_exact_on_the_real_checkpoint(run_dir):
    run = WarmupRun.open(run_dir / "warmup")
    tok = load_tokenizer(str(run.checkpoint))
    model = load_model(str(run.checkpoint), dtype=torch.float32)
    v = run.direction().v
    src = GSM8K if GSM8K.exists() else SAMPLE / "train.jsonl"
    exs = list(iter_examples(src, tok, DataOptions(limit=1)))
    ctx = ScoringContext(model=model, tokenizer=tok, direction=v)
    fast = BridgeScorer(ctx).score(exs)[0]
    exact = ExactScorer(ctx).score(exs)[0]
    a, ref = fast.a.numpy(), exact.a.numpy()
    assert np.max(np.abs(a - ref)) <= 1e-3 * np.max(np.abs(ref))

    def ranks(x):
        return np.argsort(np.argsort(x))

    assert np.corrcoef(ranks(a), ranks(ref))[0, 1] >= 0.999
    # A is stored in float16: the two passes may round a value to neighbouring halves.
    np.testing.assert_allclose(fast.A.numpy(), exact.A.numpy(), rtol=2e-3, atol=1e-7)
