"""The compared methods (docs/compared-methods.md): budget matching, each scoring rule against a direct numpy
computation, the reference step against a direct forward/backward, and every method end to end on a
tiny-model stream (budgets honoured, deterministic), through the CLI too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
from typer.testing import CliRunner

from bridgecli.baselines import apportion, matched_budgets, rank_across, rules
from bridgecli.builtin import baselines as bl
from bridgecli.cli.app import app
from bridgecli.core.budgets import budget
from bridgecli.core.topk import top_b
from bridgecli.errors import FormatError, ModelError, UsageError
from bridgecli.format.reader import read_all
from bridgecli.format.records import Array, Example, Header, ModelInfo, Reference, Scores, Tokens
from bridgecli.format.spec import EOS, PROMPT, RESPONSE, TEMPLATE
from bridgecli.format.writer import open_writer
from bridgecli.steps.reference import ReferenceOptions, run_reference
from bridgecli.steps.select import SelectOptions, run_select, select_example

from tiny import tiny_llama_config, tiny_model

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "data"
METHODS = ("random", "rho1", "tokencleaning", "sstoken", "llmlingua1", "llm+tc", "tokenseek-approx")
SCOPE = {"random": "both", "rho1": "response", "tokencleaning": "response", "sstoken": "response",
         "llmlingua1": "prompt", "llmlingua2": "prompt", "llm+tc": "both", "tokenseek-approx": "both"}


# --- synthetic examples ----------------------------------------------------------------------------

def synthetic(index: int, m: int, n: int, seed: int = 0, **refs: dict) -> Example:
    """An example laid out as template, m prompt tokens, template, n response tokens, EOS, with random
    scores and the given references (name -> {field: values})."""
    kinds = [TEMPLATE] + [PROMPT] * m + [TEMPLATE] + [RESPONSE] * n + [EOS]
    rng = np.random.default_rng([seed, index])
    scores = Scores(scorer="bridge", a=Array.of(rng.normal(size=n)), c=Array.of(rng.random(n) * 0.1),
                    A=Array.of(rng.random((n, m)) / max(m, 1), "float16"), loss=Array.of(rng.random(n) * 3))
    references = {name: Reference(model=name, **{k: Array.of(v) for k, v in fields.items()})
                  for name, fields in refs.items()}
    return Example(id=f"ex{index}", index=index, text="", tokens=Tokens(
        input_ids=list(range(10, 10 + len(kinds))), kinds=bytes(kinds), offsets=[0, 0] * len(kinds)),
        scores=scores, references=references)


def with_losses(index: int, m: int, n: int, seed: int = 0) -> Example:
    rng = np.random.default_rng([seed, index, 7])
    ref = lambda: {"prompt_loss": rng.random(m) * 5, "response_loss": rng.random(n) * 5,  # noqa: E731
                   "response_attention": rng.random(n), "prompt_received": rng.random(m) * 4,
                   "response_received": rng.random(n) * 4, "prompt_grad": rng.random(m), "response_grad": rng.random(n)}
    return synthetic(index, m, n, seed, base=ref(), warmup=ref())


def arr(ex: Example, name: str, field: str) -> np.ndarray:
    return getattr(ex.references[name], field).numpy().astype(np.float64)


def select_all(method: str, examples: list[Example], rho_p: float, rho_r: float, **options) -> list[Example]:
    """bridge select's per-example path, with the selector's first pass when it has one."""
    fn = bl.BASELINES[[b.name for b in bl.BASELINES].index(method)]
    opts = fn.parse({k: str(v) for k, v in options.items()})
    plan = fn.prepare(iter(examples), rho_p, rho_r, opts) if fn.needs_plan(opts) else None
    return [select_example(ex, fn, method, rho_p, rho_r, opts, plan=plan) for ex in examples]


# --- budget arithmetic -----------------------------------------------------------------------------

def test_apportion_is_exact_and_proportional():
    assert apportion(10, [1, 1, 1]) == [4, 3, 3]  # equal remainders: the earlier entry first
    assert apportion(7, [10, 0, 4]) == [5, 0, 2]
    assert apportion(0, [3, 4]) == [0, 0] and apportion(5, [0, 0, 5]) == [0, 0, 5]
    rng = np.random.default_rng(0)
    for _ in range(50):
        w = rng.integers(0, 40, size=8)
        t = int(rng.integers(0, w.sum() + 1))
        got = apportion(t, w)
        assert sum(got) == t and all(0 <= g <= x for g, x in zip(got, w))
        assert all(abs(g - t * x / w.sum()) < 1 for g, x in zip(got, w))


def test_matched_budgets_rules():
    sizes = [(20, 40), (10, 30), (30, 10)]
    base = [(budget(0.75, m), budget(0.75, n)) for m, n in sizes]  # (15,30) (8,23) (23,8)
    B = sum(p + r for p, r in base)
    assert matched_budgets(sizes, 0.75, 0.75, "both").budgets == base
    # tokens: keep every prompt token, spend the rest of BRIDGE's total on the response
    tok = matched_budgets(sizes, 0.75, 0.75, "response", "tokens")
    assert [b[0] for b in tok.budgets] == [20, 10, 30]
    assert sum(p + r for p, r in tok.budgets) == B == tok.summary["total"] == tok.summary["bridge_total"]
    assert [b[1] for b in tok.budgets] == apportion(B - 60, [40, 30, 10])
    lingua = matched_budgets(sizes, 0.75, 0.75, "prompt", "tokens")
    assert [b[1] for b in lingua.budgets] == [40, 30, 10] and sum(map(sum, lingua.budgets)) == B
    # example: the same total per example, clamped at 0 (example 2's prompt alone exceeds it)
    ex = matched_budgets(sizes, 0.75, 0.75, "response", "example").budgets
    assert ex == [(20, 25), (10, 21), (30, 1)]
    assert matched_budgets([(40, 4)], 0.75, 0.75, "response", "example").budgets == [(40, 0)]
    # ratio: rho_p + rho_r fixed -> the selected side gets 0.5
    assert matched_budgets(sizes, 0.75, 0.75, "response", "ratio").budgets == [(20, 20), (10, 15), (30, 5)]
    assert matched_budgets(sizes, 0.7, 0.9, "prompt", "none").budgets == [(14, 40), (7, 30), (21, 10)]
    # a stream whose prompts alone exceed the total: nothing left to supervise, and it says so
    over = matched_budgets([(100, 10)], 0.5, 0.5, "response", "tokens")
    assert over.budgets == [(100, 0)] and over.summary["unmatched_by"] == 45


def test_rank_across_global_and_batch():
    scores = [np.array([5.0, 1.0, 1.0]), np.array([4.0, 4.0]), np.array([0.0, 9.0, 1.0])]
    counts = [1, 1, 2]
    flat = [(s, k, j) for k, sc in enumerate(scores) for j, s in enumerate(sc)]
    top = sorted(flat, key=lambda t: (-t[0], t[1], t[2]))[:4]
    want = [sum(1 for _, k, _ in top if k == e) for e in range(3)]
    assert rank_across(scores, counts) == want == [1, 2, 1]
    assert rank_across(scores, counts, group=2) == [1, 1, 2]  # [0, 1] share 2; [2] alone keeps 2
    assert rank_across(scores, counts, group=1) == counts
    assert rank_across([np.ones(3), np.ones(3)], [1, 2]) == [3, 0]  # ties: earlier example first


# --- each method's scoring rule against a direct computation --------------------------------------

def test_rho1_keeps_top_excess_loss_tokens():
    exs = [with_losses(k, 6, 12) for k in range(4)]
    out = select_all("rho1", exs, 0.75, 0.5, ranking="sample", match="none")
    for ex, got in zip(exs, out):
        excess = arr(ex, "base", "response_loss") - arr(ex, "warmup", "response_loss")
        b = budget(0.5, 12)
        want = np.sort(np.argsort(-excess, kind="stable")[:b])
        assert got.selection.response_keep == ex.tokens.response_positions()[want].tolist()
        assert got.selection.prompt_keep == ex.tokens.prompt_positions().tolist()  # scope: the whole prompt
        np.testing.assert_allclose(got.selection.response_scores.numpy(), excess, rtol=1e-6)
    # ref=scores: the warmup checkpoint's losses that `bridge score` stored
    out2 = select_all("rho1", exs[:1], 0.75, 0.5, ranking="sample", match="none", ref="scores")
    excess = arr(exs[0], "base", "response_loss") - exs[0].scores.loss.numpy()
    assert out2[0].selection.response_keep == exs[0].tokens.response_positions()[top_b(excess, 6)].tolist()


def test_tokencleaning_global_vs_sample_ranking():
    # example 0's tokens all score higher than example 1's: the global ranking moves budget to it
    exs = [with_losses(0, 4, 10), with_losses(1, 4, 10)]
    for ex, shift in zip(exs, (10.0, 0.0)):
        ex.references["base"] = msgspec.structs.replace(
            ex.references["base"], response_loss=Array.of(arr(ex, "base", "response_loss") + shift))
    per = select_all("tokencleaning", exs, 0.75, 0.6, ranking="sample", match="none")
    glob = select_all("tokencleaning", exs, 0.75, 0.6, ranking="global", match="none")
    assert [len(e.selection.response_keep) for e in per] == [6, 6]
    assert [len(e.selection.response_keep) for e in glob] == [10, 2]  # same total, spent on example 0
    # global == a direct top-12 over the concatenated scores
    diff = [arr(e, "base", "response_loss") - arr(e, "warmup", "response_loss") for e in exs]
    flat = np.concatenate(diff)
    keep = set(np.argsort(-flat, kind="stable")[:12].tolist())
    for k, e in enumerate(glob):
        want = [j for j in range(10) if k * 10 + j in keep]
        assert e.selection.response_keep == e.tokens.response_positions()[want].tolist()
        assert e.selection.b_r == len(want)


def test_sstoken_combination():
    ex = with_losses(0, 5, 9)
    hist, cur = arr(ex, "base", "response_loss"), arr(ex, "warmup", "response_loss")
    attn = arr(ex, "warmup", "response_attention")
    rel = hist - cur
    for gamma in (0.0, 0.3, 0.5, 1.0):
        want = gamma * (rel - rel.min()) / (rel.max() - rel.min() + 1e-8) + (1 - gamma) * attn
        np.testing.assert_allclose(rules.sstoken(hist, cur, attn, gamma), want)
        got = select_all("sstoken", [ex], 0.75, 0.5, gamma=gamma, match="none")[0]
        assert got.selection.response_keep == ex.tokens.response_positions()[top_b(want.astype(np.float32), 5)].tolist()
    # gamma = 1: the loss difference alone; gamma = 0: the attention alone
    g1 = select_all("sstoken", [ex], 0.75, 0.5, gamma=1, match="none")[0].selection.response_keep
    assert g1 == ex.tokens.response_positions()[top_b(rel, 5)].tolist()
    # the documented substitute: row sums of the stream's A
    sub = select_all("sstoken", [ex], 0.75, 0.5, gamma=0, match="none", attention="scores")[0]
    rows = ex.scores.A.numpy().astype(np.float64).sum(axis=1)
    assert sub.selection.response_keep == ex.tokens.response_positions()[top_b(rows.astype(np.float32), 5)].tolist()
    assert rules.minmax(np.full(3, 2.0)).tolist() == [0.0, 0.0, 0.0]


def test_llmlingua1_keeps_top_self_information_prompt_tokens():
    exs = [with_losses(k, 11, 7) for k in range(3)]
    out = select_all("llmlingua1", exs, 0.5, 0.75, match="none")
    for ex, got in zip(exs, out):
        si = arr(ex, "base", "prompt_loss")
        assert got.selection.prompt_keep == ex.tokens.prompt_positions()[top_b(si, 6)].tolist()
        assert got.selection.response_keep == ex.tokens.response_positions().tolist()


def test_tokenseek_joint_ranking():
    ex = with_losses(0, 8, 12)
    rec = np.concatenate([arr(ex, "base", "prompt_received"), arr(ex, "base", "response_received")])
    grad = np.concatenate([arr(ex, "base", "prompt_grad"), arr(ex, "base", "response_grad")])
    mm = lambda x: (x - x.min()) / (x.max() - x.min() + 1e-8)  # noqa: E731
    score = 0.5 * (mm(rec) + mm(grad))
    total = budget(0.5, 8) + budget(0.5, 12)
    picked = top_b(score, total)
    got = select_all("tokenseek-approx", [ex], 0.5, 0.5)[0].selection
    assert got.prompt_keep == ex.tokens.prompt_positions()[picked[picked < 8]].tolist()
    assert got.response_keep == ex.tokens.response_positions()[picked[picked >= 8] - 8].tolist()
    assert got.b_p + got.b_r == total
    per_side = select_all("tokenseek-approx", [ex], 0.5, 0.5, joint="false")[0].selection
    assert (per_side.b_p, per_side.b_r) == (4, 6)
    assert per_side.prompt_keep == ex.tokens.prompt_positions()[top_b(score[:8], 4)].tolist()


def test_random_is_seeded_per_example():
    exs = [with_losses(k, 9, 13) for k in range(5)]
    a = select_all("random", exs, 0.5, 0.5)
    b = select_all("random", exs[::-1], 0.5, 0.5)[::-1]  # another order: the same draws
    c = select_all("random", exs, 0.5, 0.5, seed=7)
    assert [e.selection.response_keep for e in a] == [e.selection.response_keep for e in b]
    assert [e.selection.response_keep for e in a] != [e.selection.response_keep for e in c]
    assert all(len(e.selection.prompt_keep) == 5 and len(e.selection.response_keep) == 7 for e in a)


def test_clear_errors_for_missing_inputs_and_bad_options():
    bare = synthetic(0, 4, 6)
    with pytest.raises(FormatError, match="no response losses named 'base'.*bridge reference"):
        select_all("tokencleaning", [bare], 0.75, 0.75, ranking="sample", match="none")
    with pytest.raises(FormatError, match="grad"):
        select_all("tokenseek-approx", [synthetic(0, 4, 6, base={"prompt_received": np.ones(4),
                                                                   "response_received": np.ones(6)})], 0.5, 0.5)
    with pytest.raises(UsageError, match="no option 'gama'"):
        bl.SSTOKEN.parse({"gama": "0.3"})
    with pytest.raises(UsageError, match="choose one of"):
        bl.TOKEN_CLEANING.parse({"ranking": "batch"})
    with pytest.raises(UsageError, match="online"):
        bl.RHO1.parse({"mode": "online"})
    with pytest.raises(UsageError, match="classifier=PATH"):
        select_all("llmlingua2", [with_losses(0, 4, 6)], 0.5, 0.5)
    with pytest.raises(ModelError, match="huggingface-cli download"):
        select_all("llmlingua2", [with_losses(0, 4, 6)], 0.5, 0.5, classifier="/nonexistent/classifier")
    with pytest.raises(FormatError, match="two examples with index 0 in one stream") as info:  # a first pass
        select_all("tokencleaning", [with_losses(0, 4, 6), with_losses(0, 5, 6)], 0.5, 0.5)
    assert info.value.record == 0


# --- the reference step against a direct computation ----------------------------------------------

@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory, tokenizer):
    """A second tiny model with the same tokenizer, standing in for the warmup checkpoint."""
    folder = tmp_path_factory.mktemp("tiny-warm")
    tiny_model(tiny_llama_config(len(tokenizer), layers=5, hidden=48), seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def stream(tmp_path_factory, tokenizer, tiny_model_dir, warm_dir):
    """A scores stream of 6 sample examples (synthetic a, c, A) with references 'base' (attention and
    gradient norms) and 'warmup' (attention), computed by the reference step with tiny models."""
    from bridgecli.data.examples import DataOptions, iter_examples
    from bridgecli.modeling.loading import load_tokenizer, tokenizer_fingerprint

    d = tmp_path_factory.mktemp("baselines")
    exs = list(iter_examples(SAMPLE / "train.jsonl", tokenizer, DataOptions(limit=6)))
    header = Header(stage="scores", producer="test", created="2025-01-01T00:00:00+00:00",
                    model=ModelInfo(source=str(tiny_model_dir), fingerprint="sha256:test",
                                    tokenizer_fingerprint=tokenizer_fingerprint(load_tokenizer(str(tiny_model_dir)))),
                    source="train.jsonl")
    with open_writer(d / "scores.bridge", header) as w:
        for ex in exs:
            m, n = len(ex.tokens.prompt_positions()), len(ex.tokens.response_positions())
            rng = np.random.default_rng(ex.index)
            w.write(msgspec.structs.replace(ex, scores=Scores(
                scorer="bridge", a=Array.of(rng.normal(size=n)), c=Array.of(rng.random(n) * 0.1),
                A=Array.of(rng.random((n, m)) / m, "float16"), loss=Array.of(rng.random(n)))))
    run_reference(ReferenceOptions(inp=str(d / "scores.bridge"), out=str(d / "base.bridge"), grad_norms=True,
                                   batch_size=4, device="cpu"))
    run_reference(ReferenceOptions(inp=str(d / "base.bridge"), out=str(d / "ref.bridge"), model=str(warm_dir),
                                   name="warmup", batch_size=3, device="cpu"))
    return d


@pytest.mark.integration  # the stream fixture runs reference models (seconds)
def test_reference_matches_a_direct_forward_and_backward(stream, tiny_model_dir, warm_dir):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    header, exs = read_all(stream / "ref.bridge")
    assert [s.step for s in header.steps][-2:] == ["reference", "reference"]
    assert header.steps[-1].params["name"] == "warmup" and header.steps[-2].params["grad_norms"] is True
    from test_step_records import unrecorded

    assert unrecorded(ReferenceOptions, header.steps[-1].params) == []  # every field of its options, or marked not to be
    for name, folder in (("base", tiny_model_dir), ("warmup", warm_dir)):
        model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        for ex in exs[:3]:
            ref = ex.references[name]
            assert ref.model == str(folder)
            ids = torch.tensor([ex.tokens.input_ids])
            p, r, e = ex.tokens.prompt_positions(), ex.tokens.response_positions(), ex.tokens.eos_positions()
            emb = model.get_input_embeddings()(ids).detach().requires_grad_(True)
            out = model(inputs_embeds=emb, output_attentions=True)
            ce = F.cross_entropy(out.logits[0, :-1].float(), ids[0, 1:], reduction="none")
            ce = torch.cat([torch.zeros(1), ce])  # position t holds the loss of predicting token t
            np.testing.assert_allclose(ref.prompt_loss.numpy(), ce[p].detach().numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(ref.response_loss.numpy(), ce[r].detach().numpy(), rtol=1e-4, atol=1e-5)
            attn = out.attentions[-1][0].mean(0).detach().numpy()  # last layer, head mean
            np.testing.assert_allclose(ref.response_attention.numpy(), attn[r, :r[0]].sum(1), atol=1e-5)
            np.testing.assert_allclose(ref.prompt_received.numpy(), attn.sum(0)[p], rtol=1e-4, atol=1e-5)
            if name == "base":
                (g,) = torch.autograd.grad(ce[np.concatenate([r, e])].mean(), emb)
                gn = g[0].norm(dim=-1).numpy()
                np.testing.assert_allclose(ref.prompt_grad.numpy(), gn[p], rtol=1e-3, atol=1e-7)
                np.testing.assert_allclose(ref.response_grad.numpy(), gn[r], rtol=1e-3, atol=1e-7)
            else:
                assert ref.prompt_grad is None


def test_reference_grad_norms_backward_leaves_cudnn_attention_out(tokenizer, monkeypatch):
    """`bridge reference --grad-norms` backpropagates through every layer's attention, padded batches with a mask:
    those calls run with cuDNN's kernel left out, as training's do (its backward gave NaN gradients for masked bf16
    shapes on an H200; modeling/sdpa_backends.py); the setting comes back after, and a pass without grad norms
    (forward only) keeps it."""
    import torch
    import torch.nn.functional as F

    from bridgecli.baselines.reference import reference_batch
    from bridgecli.data.examples import DataOptions, iter_examples

    seen: list[tuple[bool, bool]] = []  # (on a backward path, cuDNN allowed)
    real = F.scaled_dot_product_attention

    def recording(q, k, v, *args, **kwargs):
        seen.append((torch.is_grad_enabled() and q.requires_grad, torch.backends.cuda.cudnn_sdp_enabled()))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    exs = list(iter_examples(SAMPLE / "train.jsonl", tokenizer, DataOptions(limit=3)))
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=3, hidden=16, heads=2, kv_heads=1))
    assert torch.backends.cuda.cudnn_sdp_enabled()
    for attention in (True, False):
        reference_batch(model, exs, pad_id=0, attention=attention, grad_norms=True)
    assert seen and all(backward for backward, _ in seen) and not any(allowed for _, allowed in seen)
    seen.clear()
    reference_batch(model, exs, pad_id=0, attention=False, grad_norms=False)
    assert seen and not any(backward for backward, _ in seen) and all(allowed for _, allowed in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


@pytest.mark.integration  # the stream fixture runs reference models (seconds)
def test_every_method_honours_its_budget_and_is_deterministic(stream):
    header, exs = read_all(stream / "ref.bridge")
    rho_p, rho_r = 0.5, 0.75
    sizes = [(len(e.tokens.prompt_positions()), len(e.tokens.response_positions())) for e in exs]
    bridge_total = sum(budget(rho_p, m) + budget(rho_r, n) for m, n in sizes)
    plans = {}
    for method in METHODS:
        out = []
        for k in range(2):
            path = stream / f"{method}-{k}.bridge"
            run_select(SelectOptions(inp=str(stream / "ref.bridge"), out=str(path), method=method,
                                     rho_p=rho_p, rho_r=rho_r))
            out.append(read_all(path))
        (h1, a), (_, b) = out
        assert [msgspec.to_builtins(e.selection) for e in a] == [msgspec.to_builtins(e.selection) for e in b], method
        for e, (m, n) in zip(a, sizes):
            s = e.selection
            assert (len(s.prompt_keep), len(s.response_keep)) == (s.b_p, s.b_r), method
            assert s.achieved_rho_p == s.b_p / m and s.achieved_rho_r == s.b_r / n
            if SCOPE[method] == "response":
                assert s.b_p == m
            if SCOPE[method] == "prompt":
                assert s.b_r == n
            if method in ("random", "llm+tc"):
                assert s.b_p == budget(rho_p, m)
            if method == "random":
                assert s.b_r == budget(rho_r, n)
            if method == "tokenseek-approx":
                assert s.b_p + s.b_r == budget(rho_p, m) + budget(rho_r, n)
        # the matched total: every method but llm+tc (global ranking) retains exactly BRIDGE's total, unless
        # keeping one side whole already exceeds it (prompt-only methods on long responses here)
        total = sum(e.selection.b_p + e.selection.b_r for e in a)
        plan = plans[method] = h1.steps[-1].params.get("budgets", {})
        if method != "llm+tc":
            assert total == bridge_total + plan.get("unmatched_by", 0), method
        if method in ("rho1", "tokencleaning", "sstoken", "llmlingua1", "llm+tc"):
            assert plan["total"] == total
    # here the responses are long: keeping them whole exceeds BRIDGE's total, so llmlingua1 keeps no prompt token
    assert plans["llmlingua1"]["unmatched_by"] > 0
    assert all(e.selection.b_p == 0 for e in read_all(stream / "llmlingua1-0.bridge")[1])


@pytest.mark.integration  # the stream fixture runs reference models (seconds)
def test_llmlingua2_with_a_local_classifier(tmp_path, tokenizer, stream):
    import torch
    from transformers import LlamaForTokenClassification

    from bridgecli.baselines.lingua2 import word_probabilities

    cfg = tiny_llama_config(len(tokenizer), layers=2, hidden=32)
    cfg.num_labels = 2
    torch.manual_seed(0)
    clf = LlamaForTokenClassification(cfg).eval()
    clf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    _, exs = read_all(stream / "ref.bridge")
    got = select_all("llmlingua2", exs[:2], 0.5, 0.75, classifier=str(tmp_path), match="none")
    text = "Tom has 3 apples, and buys 4 more."
    words, probs = word_probabilities(text, tokenizer, clf)
    assert [text[s:e] for s, e in words] == text.split()
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    with torch.no_grad():
        p = torch.softmax(clf(input_ids=torch.tensor([enc["input_ids"]])).logits[0], -1)[:, 1].numpy()
    for (ws, we), wp in zip(words, probs):  # a word's probability: the mean over its sub-tokens
        mine = [pk for pk, (s, e) in zip(p, enc["offset_mapping"]) if e > s and ws < e <= we]
        assert wp == pytest.approx(float(np.mean(mine)), abs=1e-6)
    for ex, g in zip(exs[:2], got):
        assert len(g.selection.prompt_keep) == budget(0.5, len(ex.tokens.prompt_positions()))
        assert g.selection.response_keep == ex.tokens.response_positions().tolist()


# --- the CLI ---------------------------------------------------------------------------------------

def bridge(*args, stdin=None, **kw):
    return subprocess.run([sys.executable, "-m", "bridgecli", *map(str, args)], stdin=stdin, capture_output=True,
                          env={**os.environ, "BRIDGE_NO_PROGRESS": "1"}, **kw)


@pytest.mark.integration  # starts `python -m bridgecli`
def test_cli_select_rho1_end_to_end(stream):
    with open(stream / "ref.bridge", "rb") as fh:  # through stdin: the first pass reads a spooled copy
        proc = bridge("select", "--method", "rho1", "--rho-p", "0.5", "--rho-r", "0.5", "--option", "ranking=global",
                      "-o", stream / "cli-rho1.bridge", stdin=fh)
    assert proc.returncode == 0, proc.stderr.decode()
    header, exs = read_all(stream / "cli-rho1.bridge")
    step = header.steps[-1]
    assert step.step == "select" and step.params["method"] == "rho1"
    assert step.params["options"] == {"ranking": "global"} and step.params["budgets"]["ranking"] == "global"
    _, src = read_all(stream / "ref.bridge")
    total = sum(budget(0.5, len(e.tokens.prompt_positions())) + budget(0.5, len(e.tokens.response_positions()))
                for e in src)
    assert sum(len(e.selection.prompt_keep) + len(e.selection.response_keep) for e in exs) == total
    # the global ranking: response tokens kept are the stream's top excess-loss tokens
    excess = np.concatenate([arr(e, "base", "response_loss") - arr(e, "warmup", "response_loss") for e in src])
    kept = np.concatenate([np.isin(e.tokens.response_positions(), e.selection.response_keep) for e in exs])
    assert excess[kept].min() >= excess[~kept].max() - 1e-6
    bad = bridge("select", "--method", "rho1", stream / "ref.bridge", "-o", stream / "x.bridge", "--option", "nope=1")
    assert bad.returncode == 2 and b"no option 'nope'" in bad.stderr
    # a stream without the needed reference: one line naming the stream (a file, or stdin) and the record
    missing = bridge("select", "--method", "rho1", "--option", "ref=nosuch", stream / "ref.bridge", "-o",
                     stream / "x.bridge")
    assert missing.returncode == 3
    assert missing.stderr.decode().startswith(f"bridge select: error: {stream / 'ref.bridge'}, record 0: ")
    with open(stream / "ref.bridge", "rb") as fh:
        piped = bridge("select", "--method", "tokencleaning", "--option", "ref=nosuch", "-o", stream / "x.bridge",
                       stdin=fh)
    assert piped.returncode == 3 and piped.stderr.decode().startswith("bridge select: error: <stdin>, record 0: ")
    assert len(piped.stderr.decode().strip().splitlines()) == 1


@pytest.mark.integration  # the stream fixture runs reference models (seconds)
def test_cli_reference_refuses_another_tokenizer(stream, tmp_path):
    header, exs = read_all(stream / "scores.bridge")
    other = msgspec.structs.replace(header, model=msgspec.structs.replace(header.model,
                                                                           tokenizer_fingerprint="sha256:" + "0" * 32))
    with open_writer(tmp_path / "other.bridge", other) as w:
        for ex in exs[:1]:
            w.write(ex)
    result = CliRunner().invoke(app, ["reference", str(tmp_path / "other.bridge"), "-o", str(tmp_path / "out.bridge")])
    assert result.exit_code == ModelError.exit_code == 5
    assert "bridge reference: error:" in result.stderr and "is not the stream's" in result.stderr
    assert "--tokenizer-check vocab" in result.stderr
    assert not (tmp_path / "out.bridge").exists()


def test_compare_script_runs_every_registered_method():
    """examples/compare.sh's default METHODS: every selector the built-ins register, except llmlingua2
    (it needs a local classifier folder, which the sample setup does not have)."""
    import re
    from pathlib import Path

    from bridgecli import plugins, registry

    script = (Path(__file__).resolve().parents[1] / "examples" / "compare.sh").read_text()
    listed = re.search(r'METHODS=\$\{METHODS:?-"([^"]+)"\}', script).group(1).split()
    builtin = {e.name for e in registry.collect("selector").values() if e.plugin in plugins.DEFAULT_PLUGINS}
    assert set(listed) == builtin - {"llmlingua2"} and len(listed) == len(set(listed))
