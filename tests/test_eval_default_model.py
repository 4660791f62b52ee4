"""bridge eval on the default model (SmolLM2-135M-Instruct, loaded once): the multiple-choice scores agree
with a direct transformers log-likelihood, and every built-in task runs on the real data (tiny --limit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bridgecli.evaluation import evaluate
from bridgecli.evaluation import multiple_choice as mc
from bridgecli.evaluation.loglik import encode_pair

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]  # one_thread: tests/conftest.py

# shared/ lies beside the repository (the CI clone too); /work/shared is the usual place on a dev machine
DATA = next((p for p in (Path(__file__).resolve().parents[2] / "shared" / "data", Path("/work/shared/data"))
             if p.is_dir()), Path("/work/shared/data"))
ARC = DATA / "arc" / "ARC-Challenge-Test.jsonl"


@pytest.fixture(scope="module")
def smollm2():
    from bridgecli.modeling.loading import load_model, load_tokenizer

    return load_model(None).eval(), load_tokenizer(None)


def _direct_scores(model, tokenizer, context: str, continuations: list[str]) -> list[float]:
    """Sum of log-softmax(model(input_ids).logits) over the continuation tokens, one sequence at a time."""
    scores = []
    for continuation in continuations:
        ctx, cont = encode_pair(tokenizer, context, continuation)
        input_ids = torch.tensor([ctx + cont])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids).logits[0].double(), dim=-1)
        scores.append(sum(float(logprobs[len(ctx) - 1 + k, token]) for k, token in enumerate(cont)))
    return scores


FALLBACK_ARC = [
    {"id": "x1", "question": {"stem": "Which of these is a source of light?", "choices": [
        {"text": "the Sun", "label": "A"}, {"text": "a rock", "label": "B"}, {"text": "a chair", "label": "C"}]},
     "answerKey": "A"},
    {"id": "x2", "question": {"stem": "What do plants need to make food?", "choices": [
        {"text": "sunlight", "label": "A"}, {"text": "sand", "label": "B"}, {"text": "plastic", "label": "C"},
        {"text": "metal", "label": "D"}]}, "answerKey": "A"},
]


def test_multiple_choice_agrees_with_direct_transformers_loglik(smollm2, tmp_path):
    model, tok = smollm2
    if ARC.exists():
        items = mc.load_arc(ARC)[:1]
    else:
        path = tmp_path / "arc.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in FALLBACK_ARC), encoding="utf-8")
        items = mc.load_arc(path)[:1]
    mmlu_item = mc.Item(0, "m", mc.mmlu_description("astronomy") + mc.mmlu_query(
        "Which planet is closest to the Sun?", ["Venus", "Mercury", "Earth", "Mars"]), [" A", " B", " C", " D"], 1, "-")
    items = [*items, mmlu_item]
    records = mc.score_items(model, tok, items, [i.query for i in items], batch_size=3, progress=False,
                             description="check")
    for item, record in zip(items, records):
        direct = _direct_scores(model, tok, item.query, item.choices)
        # Per token within 1e-4: the batched, left-padded float32 forward and the unpadded one run
        # different GEMM shapes, which moves each token's log-prob by ~1e-6 (sums of 20 tokens by ~1e-4).
        for ours, theirs, n in zip(record["loglik"], direct, record["n_tokens"]):
            assert abs(ours - theirs) <= 1e-4 * n
        assert record["pred"] == max(range(len(direct)), key=direct.__getitem__)


SMOKE = [
    # task, data, extra options
    ("gsm8k", DATA / "gsm8k" / "test.jsonl", {"limit": 2, "max_new_tokens": 8}),
    ("math", DATA / "math" / "math500_test.jsonl", {"limit": 2, "max_new_tokens": 8}),
    ("humaneval", DATA / "humaneval" / "HumanEval.jsonl.gz", {"limit": 2, "max_new_tokens": 12, "allow_code_execution": True}),
    ("mbpp", DATA / "mbpp" / "mbpp.jsonl", {"limit": 1, "max_new_tokens": 12, "allow_code_execution": True}),
    ("arc_challenge", ARC, {"limit": 2}),
    ("arc_easy", DATA / "arc" / "ARC-Easy-Test.jsonl", {"limit": 2}),
    ("hellaswag", DATA / "hellaswag" / "hellaswag_val_full.txt.bz2", {"limit": 2}),
    ("mmlu", DATA / "mmlu" / "test" / "astronomy_test.csv", {"limit": 2, "few_shot": 1}),
]


@pytest.mark.parametrize("task, data, extra", SMOKE, ids=[s[0] for s in SMOKE])
def test_every_task_runs_on_the_default_model(smollm2, task, data, extra):
    if not data.exists():
        pytest.skip(f"{data} not available")
    model, tok = smollm2
    result = evaluate(model, tok, task, str(data), batch_size=4, progress=False, **extra)
    summary = result["summary"]
    assert summary["task"] == task and summary["n"] == extra["limit"] == len(result["items"])
    assert 0.0 <= summary["accuracy"] <= 1.0 and summary["correct"] == sum(i["correct"] for i in result["items"])
    json.dumps(result)
