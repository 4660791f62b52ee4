"""The common direction of a_j (``debias=common``) and a_j's split into target and anchor parts,
against brute force on tiny random models: a_j by one backward pass per token through the plain HF
model, u_j = d . (w_y - W^T p) from its logits; the warm-up's d and beta; the run-folder file and its
checks; and ``bridge warmup`` / ``bridge score`` / ``bridge analyze decompose`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from bridgecli.analysis.decompose import slope
from bridgecli.artifacts.common_file import CommonDirection, CommonFit, CommonMeta, load_common, save_common
from bridgecli.artifacts.direction_file import DirectionMeta
from bridgecli.errors import ModelError, UsageError
from bridgecli.format.records import Example
from bridgecli.training.direction import combine
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext

from tiny import record_examples, sample_inputs, tiny_llama_config, tiny_model

pytestmark = pytest.mark.integration  # tiny random models, backward passes per token, CLI runs (seconds)


def per_token_grads(model, ex: Example, names: list[str]) -> list[dict[str, torch.Tensor]]:
    """grad l_j over ``names`` for every response token of ``ex``, one backward pass each."""
    ids = torch.tensor([ex.tokens.input_ids])
    resp = ex.tokens.response_positions()
    params = dict(model.named_parameters())
    logits = model(input_ids=ids).logits[0]
    losses = F.cross_entropy(logits[resp - 1].double(), ids[0, resp], reduction="none")
    out = []
    for j in range(len(resp)):
        grads = torch.autograd.grad(losses[j], [params[n] for n in names], retain_graph=True)
        out.append(dict(zip(names, grads)))
    return out


def dot(grads: dict[str, torch.Tensor], v: dict[str, torch.Tensor]) -> float:
    return sum(float((grads[n].double() * v[n].double()).sum()) for n in v)


def residuals(model, ex: Example, positions: np.ndarray) -> torch.Tensor:
    """w_y - W^T p at the tokens ``positions`` (each predicted from the position before), from the HF
    model's logits and its LM head weight: [k, hidden], float64."""
    ids = torch.tensor([ex.tokens.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    W = model.get_output_embeddings().weight.detach().double()
    p = F.softmax(logits[positions - 1], dim=-1)
    return W[ids[0, positions]] - p @ W


def four_layers(tokenizer):
    """The float64 four-layer tiny model (seed 0) of the brute-force tests."""
    return tiny_model(tiny_llama_config(len(tokenizer), layers=4), dtype=torch.float64)


@pytest.fixture(scope="module")
def four_layer_grads(tokenizer) -> list[list[dict[str, torch.Tensor]]]:
    """The brute force of :func:`per_token_grads` over the last two blocks of a fresh :func:`four_layers`
    model, for each of the record examples: one backward pass per response token is most of these tests'
    time, and the five debias paths and the parts test check against the same gradients (computed once)."""
    model = four_layers(tokenizer)
    names = list(tail_parameters(model, 2))
    return [per_token_grads(model, ex, names) for ex in record_examples(tokenizer)]


def common_of(d: torch.Tensor, beta: float, vocab: int) -> CommonDirection:
    fit = CommonFit(beta=beta, intercept=0.0, fit_tokens=1, fit_examples=1, residual_tokens=1, residual_norm=1.0)
    return CommonDirection(d, CommonMeta(fit=fit, hidden_size=int(d.shape[0]), vocab_size=vocab, direction=DirectionMeta()))


@pytest.mark.parametrize("path", ["fused-llama", "forward-ad", "forward-ad-head", "atp", "atp-fast"])
def test_debiased_a_is_a_minus_beta_u_by_brute_force(tokenizer, four_layer_grads, path):
    model = four_layers(tokenizer)
    exs = record_examples(tokenizer)
    torch.manual_seed(3)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    d = torch.randn(model.config.hidden_size, dtype=torch.float64)
    beta = 20.0
    scorer_options = {"debias": "common", **({"fast": "1"} if path == "atp-fast" else {})}
    options = {"fast_tail": path in ("fused-llama", "atp-fast"), "scorer_options": scorer_options}
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, options=options,
                         common=lambda: common_of(d, beta, len(tokenizer)))
    if path.startswith("atp"):  # the gated pass through HF's modules, or the hand-written one (fast=1)
        from bridgecli.modeling.attribution import AttributionScorer

        scorer: BridgeScorer = AttributionScorer(ctx)
        assert (scorer.gated_fast is not None) == (path == "atp-fast")
    else:
        scorer = BridgeScorer(ctx)
        assert (scorer.fast is not None) == (path == "fused-llama")
        if path == "forward-ad-head":  # the LM head under forward-mode AD (models with a non-plain head)
            scorer.plain_head = False
    assert scorer.header_params["debias"]["beta"] == beta
    assert set(four_layer_grads[0][0]) == set(v)  # the brute force is over v's parameters
    for ex, sc, grads in zip(exs, scorer.score(exs), four_layer_grads, strict=True):
        resp = ex.tokens.response_positions()
        a_ref = np.array([dot(g, v) for g in grads])
        u_ref = (residuals(model, ex, resp) @ d).numpy()
        want = a_ref - beta * u_ref
        assert np.abs(beta * u_ref).max() > 0.3 * np.abs(a_ref).max()  # the shift is not negligible here
        np.testing.assert_allclose(sc.a.numpy(), want, rtol=0, atol=2e-6 * np.abs(want).max())


def test_atp_interactions_follow_the_debiased_a(tokenizer):
    """The atp scorer's B estimates the effect of hiding a key on the score it stores: with debias the
    reverse pass differentiates a_j - beta u_j, so B changes (u_j depends on the prompt)."""
    from bridgecli.modeling.attribution import AttributionScorer

    model = tiny_model(tiny_llama_config(len(tokenizer), layers=4), dtype=torch.float64)
    exs = record_examples(tokenizer)[:2]
    torch.manual_seed(4)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    d = torch.randn(model.config.hidden_size, dtype=torch.float64)

    def scores(debias: str, beta: float):
        ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v,
                             options={"scorer_options": {"debias": debias}},
                             common=lambda: common_of(d, beta, len(tokenizer)))
        return AttributionScorer(ctx).score(exs)

    plain, zero, shifted = scores("none", 0.0), scores("common", 0.0), scores("common", 20.0)
    for p, z, s in zip(plain, zero, shifted):
        np.testing.assert_allclose(z.B.numpy(), p.B.numpy(), rtol=1e-6, atol=1e-9)  # beta 0: nothing moves
        assert np.abs(s.B.numpy() - p.B.numpy()).max() > 1e-4 * np.abs(p.B.numpy()).max()


def test_debias_refusals(tokenizer):
    model = tiny_model(tiny_llama_config(len(tokenizer), layers=4))
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 1).items()}
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, options={"scorer_options": {"debias": "x"}})
    with pytest.raises(UsageError, match="debias must be one of none, common, got 'x'"):
        BridgeScorer(ctx)
    ctx.options = {"scorer_options": {"debias": "common"}}
    with pytest.raises(UsageError, match="was given none"):
        BridgeScorer(ctx)
    from bridgecli.modeling.scoring import ExactScorer

    with pytest.raises(UsageError, match="unknown option 'debias'"):
        ExactScorer(ctx)
    ctx.options = {"scorer_options": {"debias": "none"}}
    assert BridgeScorer(ctx).header_params is None


def test_parts_sum_to_a_and_the_anchor_part_is_its_own_term(tokenizer, four_layer_grads):
    from bridgecli.analysis.parts import score_parts, split_direction

    model = four_layers(tokenizer)
    exs = record_examples(tokenizer)
    torch.manual_seed(5)
    tail = tail_parameters(model, 2)
    g_target = {n: torch.randn_like(p) for n, p in tail.items()}
    g_anchor = {n: 0.01 * torch.randn_like(p) for n, p in tail.items()}
    lam, eps = 0.3, 1e-8
    v, stats = combine(g_target, g_anchor, lam=lam, eps=eps)
    v = {n: t.double() for n, t in v.items()}
    split = split_direction(v, g_anchor, lam, eps)
    assert split.anchor_norm == pytest.approx(stats.g_anchor_norm)
    d = torch.randn(model.config.hidden_size, dtype=torch.float64)
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v)
    parts = score_parts(ctx, split, exs, d=d, batch_size=2)
    whole = BridgeScorer(ctx).score(exs)
    assert set(four_layer_grads[0][0]) == set(v)  # the brute force is over v's parameters
    for ex, p, w, grads in zip(exs, parts, whole, four_layer_grads, strict=True):
        a = w.a.numpy().astype(np.float64)
        np.testing.assert_allclose(p.target + p.anchor, a, rtol=0, atol=1e-6 * np.abs(a).max())
        na = np.sqrt(sum(float((g.double() ** 2).sum()) for g in g_anchor.values()))
        anchor_ref = np.array([lam * dot(g, g_anchor) / (na + eps) for g in grads])
        nt = np.sqrt(sum(float((g.double() ** 2).sum()) for g in g_target.values()))
        target_ref = np.array([(1 - lam) * dot(g, g_target) / (nt + eps) for g in grads])
        np.testing.assert_allclose(p.anchor, anchor_ref, rtol=0, atol=1e-6 * np.abs(anchor_ref).max())
        np.testing.assert_allclose(p.target, target_ref, rtol=0, atol=1e-6 * np.abs(target_ref).max())
        u_ref = (residuals(model, ex, ex.tokens.response_positions()) @ d).numpy()
        np.testing.assert_allclose(p.u, u_ref, rtol=0, atol=1e-7 * np.abs(u_ref).max())


def test_warmup_fit_is_d_over_g_targets_tokens_and_the_least_squares_slope(tokenizer):
    from bridgecli.training.common_direction import fit
    from bridgecli.training.rows import full_response_row

    model = tiny_model(tiny_llama_config(len(tokenizer), layers=3), dtype=torch.float64)
    val = record_examples(tokenizer)
    torch.manual_seed(6)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    attn = model.config._attn_implementation
    rows = [full_response_row(e.id, e.tokens) for e in val]
    common = fit(model, tokenizer, v, DirectionMeta(v_norm=1.0), val, rows, device="cpu", batch_size=2)
    assert model.config._attn_implementation == attn  # the scorer's attention is not left on the model
    # d: the mean residual over the response tokens and the EOS of every example (g_target's tokens)
    res = [residuals(model, e, np.concatenate([e.tokens.response_positions(), e.tokens.eos_positions()])) for e in val]
    d_ref = torch.cat(res).mean(0)
    np.testing.assert_allclose(common.d.numpy(), d_ref.numpy(), rtol=1e-5, atol=1e-7)
    assert common.meta.fit.residual_tokens == sum(len(r) for r in res)
    # beta: the least-squares slope of a_j on u_j over the response tokens (u from the stored d)
    names = list(v)
    a_ref = np.concatenate([[dot(g, v) for g in per_token_grads(model, e, names)] for e in val])
    u_ref = np.concatenate([(residuals(model, e, e.tokens.response_positions()) @ common.d.double()).numpy()
                            for e in val])
    beta, intercept = slope(a_ref, u_ref)
    assert common.meta.fit.beta == pytest.approx(beta, rel=1e-5)
    assert common.meta.fit.intercept == pytest.approx(intercept, rel=1e-4, abs=1e-6)
    assert common.meta.fit.fit_tokens == len(a_ref) and common.meta.fit.fit_examples == len(val)
    assert common.meta.direction.v_norm == 1.0


def test_common_file_round_trip_and_checks(tmp_path):
    d = torch.arange(6, dtype=torch.float32)
    meta = CommonMeta(
        fit=CommonFit(beta=0.5, intercept=0.1, fit_tokens=10, fit_examples=2, fit_pearson=0.8, residual_tokens=12,
                      residual_norm=float(d.norm())),
        hidden_size=6, vocab_size=11, checkpoint_fingerprint="sha256:abc",
        direction=DirectionMeta(lam=0.2, eps=1e-8, g_target_norm=1.5, g_anchor_norm=0.3, v_norm=0.9, layers=4),
    )
    assert load_common(tmp_path) is None  # a run made before the file existed
    save_common(CommonDirection(d, meta), tmp_path)
    back = load_common(tmp_path)
    assert back is not None and back.meta == meta and torch.equal(back.d, d) and back.beta == 0.5
    ok = dict(direction=meta.direction, hidden_size=6, vocab_size=11, checkpoint_fingerprint="sha256:abc")
    assert meta.mismatch(**ok) is None
    assert "LM head of 11 x 6" in meta.mismatch(**{**ok, "hidden_size": 7})
    assert "another checkpoint" in meta.mismatch(**{**ok, "checkpoint_fingerprint": "sha256:def"})
    other = DirectionMeta(lam=0.2, eps=1e-8, g_target_norm=1.5, g_anchor_norm=0.3, v_norm=0.91, layers=4)
    assert "another direction v (v_norm 0.9 against 0.91)" in meta.mismatch(**{**ok, "direction": other})
    path = tmp_path / "common_direction.safetensors"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(ModelError, match="cannot read the common direction"):
        load_common(tmp_path)


# ------------------------------------------------------------------------------------------- end to end


def bridge(*args, code: int = 0):
    from bridgecli.cli.app import app

    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == code, f"bridge {' '.join(map(str, args))} -> {result.exit_code}\n{result.output}"
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_model_dir) -> Path:
    d = tmp_path_factory.mktemp("debias")
    sample_inputs(d, warm=4, val=2, data=3)
    bridge("warmup", d / "warm.jsonl", "--val", d / "val.jsonl", "--model", tiny_model_dir, "--max-steps", "1",
           "--batch-size", "4", "--lr", "1e-3", "-o", d / "warm")
    return d


def read(path: Path):
    from bridgecli.format.reader import open_reader

    with open_reader(path) as reader:
        return reader.header, [ex.scores for ex in reader]


def test_warmup_stores_the_common_direction_and_score_records_it(run):
    d = run
    meta = json.loads((d / "warm" / "warmup.json").read_text())
    fit = meta["common_direction"]
    assert fit["fit_examples"] == 2 and fit["fit_tokens"] > 0 and fit["residual_tokens"] > fit["fit_tokens"]
    common = load_common(d / "warm")
    assert common is not None and common.meta.fit.beta == fit["beta"]
    assert common.meta.checkpoint_fingerprint.startswith("sha256:")

    bridge("score", d / "data.jsonl", "--from", d / "warm", "-o", d / "plain.bridge")
    bridge("score", d / "data.jsonl", "--from", d / "warm", "--scorer-option", "debias=common", "-o", d / "deb.bridge")
    bridge("score", d / "data.jsonl", "--from", d / "warm", "--scorer", "atp", "--scorer-option", "debias=common",
           "-o", d / "atp.bridge")
    head_plain, plain = read(d / "plain.bridge")
    assert "scorer_params" not in head_plain.steps[-1].params
    for name in ("deb.bridge", "atp.bridge"):
        header, scores = read(d / name)
        params = header.steps[-1].params
        assert params["scorer_options"] == {"debias": "common"}
        rec = params["scorer_params"]["debias"]
        assert rec["mode"] == "common" and rec["beta"] == fit["beta"] and rec["file"] == "common_direction.safetensors"
        for p, s in zip(plain, scores):
            assert not np.allclose(p.a.numpy(), s.a.numpy())  # the stored a_j is the debiased one
    _, deb = read(d / "deb.bridge")
    _, atp = read(d / "atp.bridge")
    for x, y in zip(deb, atp):  # the two scorers' debiased a_j agree
        np.testing.assert_allclose(x.a.numpy(), y.a.numpy(), rtol=1e-4, atol=1e-5 * np.abs(x.a.numpy()).max())


def test_an_old_run_scores_plainly_and_refuses_debias_in_one_line(run, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(run / "warm", old)
    (old / "common_direction.safetensors").unlink()
    bridge("score", run / "data.jsonl", "--from", old, "-o", tmp_path / "s.bridge")
    r = bridge("score", run / "data.jsonl", "--from", old, "--scorer-option", "debias=common",
               "-o", tmp_path / "d.bridge", code=5)
    err = [line for line in r.output.splitlines() if "error" in line]
    assert len(err) == 1 and "holds no common_direction.safetensors" in err[0] and "rerun `bridge warmup`" in err[0]
    assert not (tmp_path / "d.bridge").exists()
    moved = tmp_path / "moved"  # another run's file: refused, naming it
    shutil.copytree(run / "warm", moved)
    cfg = moved / "checkpoint" / "config.json"
    cfg.write_text(cfg.read_text().replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": 1e-05'))
    r = bridge("score", run / "data.jsonl", "--from", moved, "--scorer-option", "debias=common",
               "-o", tmp_path / "m.bridge", code=5)
    assert "not this run's common direction: it was made with another checkpoint" in r.output


def test_analyze_decompose_with_and_without_the_common_direction(run, tmp_path):
    import shutil

    d = run
    out = bridge("analyze", "decompose", d / "data.jsonl", "--from", d / "warm", "--n", "3", "--min-id-count", "2",
                 "-o", tmp_path / "dec.json").stdout
    assert "sign set by anchor" in out and "debiased" in out
    rep = json.loads((tmp_path / "dec.json").read_text())
    assert rep["command"] == "analyze decompose" and rep["examples_used"] == 3
    assert rep["direction"]["g_anchor_norm_rebuilt"] == pytest.approx(rep["direction"]["g_anchor_norm"], rel=1e-5)
    total = sum(len(e["target"]) for e in rep["examples"])
    assert rep["tokens"] == total == rep["a"]["classes"]["all"]["tokens"]
    assert sum(v["tokens"] for k, v in rep["a"]["classes"].items() if k != "all") == total
    t = np.concatenate([e["target"] for e in rep["examples"]])
    n = np.concatenate([e["anchor"] for e in rep["examples"]])
    u = np.concatenate([e["u"] for e in rep["examples"]])
    assert rep["a"]["classes"]["all"]["share_sign_set_by_anchor"] == pytest.approx(
        np.mean(np.sign(t + n) != np.sign(t)))
    beta = rep["common_direction"]["beta"]
    assert rep["debiased"]["beta"] == beta
    assert rep["debiased"]["classes"]["all"]["share_positive"] == pytest.approx(np.mean(t + n - beta * u > 0), abs=1e-6)
    # the stream's own a_j, as `bridge score` stores it, is the sum of the two parts (same examples, in order)
    bridge("score", d / "data.jsonl", "--from", d / "warm", "-o", tmp_path / "s.bridge")
    _, scores = read(tmp_path / "s.bridge")
    a = np.concatenate([s.a.numpy() for s in scores])
    np.testing.assert_allclose(t + n, a, rtol=0, atol=1e-5 * np.abs(a).max())

    old = tmp_path / "old"
    shutil.copytree(d / "warm", old)
    (old / "common_direction.safetensors").unlink()
    out = bridge("analyze", "decompose", d / "data.jsonl", "--from", old, "--n", "3", "-o", tmp_path / "old.json").stdout
    assert "no common direction in this warm-up run" in out
    rep = json.loads((tmp_path / "old.json").read_text())
    assert "debiased" not in rep and rep["common_direction"] is None
    bad = bridge("analyze", "decompose", d / "data.jsonl", "--from", d / "warm", "--base-model", tmp_path / "nowhere",
                 code=5)
    assert "no such model folder" in bad.output
