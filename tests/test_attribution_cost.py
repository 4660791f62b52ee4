"""The atp scorer's cost: a, loss, A and c come from the gated pass itself (equal to the ``bridge``
scorer's pass, no second forward), B is unchanged against the code before (a fixture of commit
68b685c), recomputing the gated attention in the reverse pass changes nothing, and the memory model
(pure functions of the model's shape, the sequence length and the free bytes) bounds the bytes
the pass keeps and plans the passes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.autograd.forward_ad as fwAD
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.modeling import attribution
from bridgecli.modeling import gated_memory
from bridgecli.modeling.attribution import AttributionScorer, chunk_ids, spread
from bridgecli.modeling.gated_memory import MEMORY_SHARE, RESERVE, GatedShape, pass_bytes, pass_tokens, token_bytes
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.saved_bytes import saved_bytes
from bridgecli.modeling.score_batch import make_batch
from bridgecli.modeling.scoring import BridgeScorer, ScoringContext

from tiny import record_examples as examples
from tiny import tiny_llama_config, tiny_model

pytestmark = pytest.mark.integration  # scores tiny models against the golden scores (seconds each)

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "golden" / "atp-68b685c.npz"
#: the fixture's scorer options (tests/golden/atp-68b685c.npz holds the Scores of each, at commit 68b685c)
CASES = {"default": {}, "chunks3": {"chunks": "3"}, "layers2": {"layers": "2"}, "ig2": {"ig": "2", "chunks": "2"}}


@pytest.fixture(scope="module")
def tiny(tokenizer):
    """The float64 tiny Llama of tests/test_attribution.py (init 0.02), v on its final 4 blocks."""
    cfg = tiny_llama_config(len(tokenizer))
    cfg.initializer_range = 0.02
    model = tiny_model(cfg, dtype=torch.float64)
    torch.manual_seed(1)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    return model, v, examples(tokenizer)


def scorer_of(model, tokenizer, v, opts=None, **options) -> AttributionScorer:
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                         options={"scorer_options": dict(opts or {}), **options})
    return AttributionScorer(ctx)


def bridge_pass(scorer: BridgeScorer, batch):
    """The bridge scorer's generic pass (forward-mode AD through the HF blocks): losses, a, rows."""
    with torch.no_grad():
        hidden, calls, prefix_rows = scorer._prefix(batch)
        with fwAD.dual_level():
            dual = {i: {k: fwAD.make_dual(p, scorer.tangents[i][k]) for k, p in ps.items()}
                    for i, ps in scorer.primals.items()}
            out, tail_rows = scorer._tail(batch, dual, hidden, calls)
            losses, a = fwAD.unpack_dual(out)
    rows = tail_rows if prefix_rows is None else prefix_rows + (0 if tail_rows is None else tail_rows)
    return losses, a, rows


@pytest.mark.parametrize("fast", [False, True])
def test_the_gated_pass_gives_the_bridge_scorers_a_loss_and_rows(tiny, tokenizer, fast):
    """float64, math attention on both sides: the gated pass's own losses, a_j and captured routing
    rows (hence A and c) equal the bridge scorer's pass to rounding. The hand-written gated pass
    (``fast``) differentiates HF's float32 RMSNorm its own way: a to float32 rounding there
    (tests/test_gated_llama.py checks it to float64 rounding with float64 norms)."""
    model, v, exs = tiny
    atp = scorer_of(model, tokenizer, v, fast_tail=fast, atp_fast=fast)
    assert (atp.gated_fast is not None) == fast
    bridge = BridgeScorer(ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                                         options={"fast_tail": False}))
    batch = make_batch(exs, atp.pad_id)
    groups = [chunk_ids(len(r), 1) for r in batch.resp]
    _, _, kept = atp._gated(batch, groups, keep=True)
    assert kept is not None
    losses, a, rows = kept
    ref_losses, ref_a, ref_rows = bridge_pass(bridge, batch)
    assert a.dtype == torch.float64 and rows is not None and ref_rows is not None
    for got, ref, tol in ((losses, ref_losses, 1e-10), (a, ref_a, 2e-6 if fast else 1e-10), (rows, ref_rows, 1e-10)):
        ref = ref.double()
        np.testing.assert_allclose(got.double().numpy(), ref.numpy(), rtol=tol, atol=1e-2 * tol * float(ref.abs().max()))
    assert float(rows.abs().max()) > 0 and float(a.abs().max()) > 0


def test_scores_match_the_code_before(tiny, tokenizer):
    """Every option set of the fixture: a, loss, A, c and B as commit 68b685c wrote them (a, c and
    B up to the float32 rounding of HF's RMSNorm, which the bridge scorer's fused tail, the source of
    a before, does in float64), and B as that code computed it (bridge pass, then the gated pass)."""
    model, v, exs = tiny
    old = np.load(FIXTURE)
    for tag, opts in CASES.items():
        scorer = scorer_of(model, tokenizer, v, opts)
        new = scorer.score(exs)
        for ex, sc in zip(exs, new):
            for field in ("a", "loss", "A", "c", "B"):
                ref = old[f"{tag}/{ex.id}/{field}"].astype(np.float64)
                got = getattr(sc, field).numpy().astype(np.float64)
                assert got.shape == ref.shape, (tag, field)
                np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6 * np.abs(ref).max(), err_msg=f"{tag} {field}")
        if scorer.ig is None:  # the code before, step by step: the bridge pass, then the gated pass
            base = BridgeScorer.score(scorer, exs)
            batch = make_batch(exs, scorer.pad_id)
            groups = [chunk_ids(len(r), scorer.chunks) for r in batch.resp]
            for sc, b, g, eff in zip(new, base, groups, scorer.group_effects(batch, groups)):
                before = spread(eff, g, b.a.numpy(), b.A.numpy())
                np.testing.assert_allclose(sc.B.numpy(), before, rtol=0, atol=1e-6 * np.abs(before).max())


def test_recomputing_the_gated_attention_changes_nothing(tiny, tokenizer):
    """atp_recompute=always (checkpointed gated attention) against never: the same gradients of
    the removal and plain biases at a gated state, and the same scores."""
    model, v, exs = tiny
    never = scorer_of(model, tokenizer, v, {"ig": "2"}, atp_recompute="never")
    always = scorer_of(model, tokenizer, v, {"ig": "2"}, atp_recompute="always")
    batch = make_batch(exs, never.pad_id)
    groups = [chunk_ids(len(r), 2) for r in batch.resp]
    state = never._state(batch, 0.7)
    r1, p1 = never.gated_grads(batch, groups, state, plain=True)
    r2, p2 = always.gated_grads(batch, groups, state, plain=True)
    assert p1 is not None and p2 is not None
    for x, y in ((r1, r2), (p1, p2)):
        assert np.abs(x).max() > 0
        np.testing.assert_allclose(y, x, rtol=1e-10, atol=1e-13 * np.abs(x).max())
    for s, t in zip(scorer_of(model, tokenizer, v, atp_recompute="never").score(exs),
                    scorer_of(model, tokenizer, v, atp_recompute="always").score(exs)):
        for field in ("a", "c", "B"):
            np.testing.assert_allclose(getattr(t, field).numpy(), getattr(s, field).numpy(), rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="atp_recompute"):
        scorer_of(model, tokenizer, v, atp_recompute="sometimes")


def test_the_model_keeps_requiring_grad(tiny, tokenizer):
    model, v, exs = tiny
    before = {n for n, p in model.named_parameters() if p.requires_grad}
    scorer_of(model, tokenizer, v).score(exs[:1])
    assert {n for n, p in model.named_parameters() if p.requires_grad} == before
    assert before


def test_passes_split_a_batch_that_does_not_fit_and_score_the_same(tiny, tokenizer, monkeypatch):
    """With little free memory (a pretend GPU), a batch is scored in several passes, each within the
    plan, in order; the scores equal one pass's."""
    model, v, exs = tiny
    scorer = scorer_of(model, tokenizer, v, {"chunks": "2"})
    whole = scorer.score(exs)
    lengths = [len(e.tokens.input_ids) for e in exs]
    # free bytes where a pass holds about two of the longest sequences
    target = 2 * max(lengths)
    per = token_bytes(scorer.shape, max(lengths), True) + scorer.shape.heads * max(lengths) * 8 * gated_memory.TRANSIENT_LXL
    free = (RESERVE + scorer.row_chunk * scorer.shape.vocab * 32 + target * per) / MEMORY_SHARE
    parts = scorer._passes(exs, free)
    assert [e.id for p in parts for e in p] == [e.id for e in exs]
    assert len(parts) > 1
    for p in parts:
        top = max(len(e.tokens.input_ids) for e in p)
        assert len(p) == 1 or len(p) * top <= scorer._plan(free, top)[0]
    monkeypatch.setattr(attribution, "_free_bytes", lambda device: free)
    split = scorer.score(exs)
    assert [s.a.numpy().shape for s in split] == [s.a.numpy().shape for s in whole]
    for s, t in zip(whole, split):
        for field in ("a", "loss", "c", "B"):
            np.testing.assert_allclose(getattr(t, field).numpy(), getattr(s, field).numpy(), rtol=1e-6, atol=1e-9)
    assert scorer._passes(exs, None) == [exs]


def test_default_batch_follows_free_memory(tiny, tokenizer, monkeypatch):
    model, v, _ = tiny
    scorer = scorer_of(model, tokenizer, v)
    assert scorer.max_tokens_cuda == 4096  # off a GPU (the command's CPU default)
    monkeypatch.setattr(attribution, "_free_bytes", lambda device: 70e9)
    assert scorer.max_tokens_cuda == AttributionScorer.MAX_TOKENS
    monkeypatch.setattr(attribution, "_free_bytes", lambda device: 0.0)
    assert scorer.max_tokens_cuda == 1


# --------------------------------------------------------------------------- the memory model

LLAMA_1B = GatedShape(hidden=2048, intermediate=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256,
                      prefix=12, tail=4, dtype_bytes=2)
SMOLLM_135M = GatedShape(hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152,
                         prefix=26, tail=4, dtype_bytes=2)


def test_real_shapes_get_much_bigger_passes_than_before():
    """An H100's free memory after loading the model (about 75 GB): sequences of 330 tokens (the
    MetaMath-shaped bench) get 3 times the 4,096 tokens of the fixed default before."""
    for shape in (LLAMA_1B, SMOLLM_135M):
        plain = pass_tokens(shape, 75e9, 330, 1024, recompute=False)
        again = pass_tokens(shape, 75e9, 330, 1024, recompute=True)
        assert plain >= 3 * 4096 and again > 1.25 * plain
    assert pass_tokens(SMOLLM_135M, 75e9, 330, 1024, recompute=False) >= 32768
    assert pass_tokens(LLAMA_1B, 1e9, 330, 1024, recompute=True) == 0


shapes = st.builds(GatedShape, hidden=st.integers(16, 8192), intermediate=st.integers(16, 32768),
                   heads=st.integers(1, 64), kv_heads=st.integers(1, 8), head_dim=st.sampled_from([32, 64, 128]),
                   vocab=st.integers(100, 300_000), prefix=st.integers(0, 80), tail=st.integers(1, 8),
                   dtype_bytes=st.sampled_from([2, 4, 8]))


@settings(max_examples=200)
@given(shape=shapes, free=st.floats(0, 2e11), seq=st.integers(1, 16384), chunk=st.integers(1, 8192),
       more=st.floats(1.0, 4.0), longer=st.integers(1, 4096))
def test_pass_tokens_is_the_largest_pass_that_fits(shape, free, seq, chunk, more, longer):
    budget = MEMORY_SHARE * free - RESERVE
    for recompute in (False, True):
        n = pass_tokens(shape, free, seq, chunk, recompute)
        assert n >= 0
        if n:
            assert pass_bytes(shape, n, seq, chunk, recompute) <= budget * (1 + 1e-12)
        if n + 1 >= chunk:  # past one LM-head chunk the head's part is fixed: one token more does not fit
            assert pass_bytes(shape, n + 1, seq, chunk, recompute) > budget * (1 - 1e-12)
        assert pass_tokens(shape, free * more, seq, chunk, recompute) >= n
        assert pass_tokens(shape, free, seq + longer, chunk, recompute) <= n
    assert pass_tokens(shape, free, seq, chunk, True) >= pass_tokens(shape, free, seq, chunk, False)


@pytest.mark.parametrize("dtype,hidden,inter,heads,kv", [(torch.float32, 32, 64, 4, 2), (torch.bfloat16, 64, 256, 4, 2),
                                                         (torch.float64, 48, 96, 6, 3)])
def test_the_memory_model_bounds_the_bytes_the_pass_keeps(tokenizer, dtype, hidden, inter, heads, kv):
    """Saved-tensor bytes of the gated pass (saved_tensors_hooks, modeling/saved_bytes.py) per padded
    token: at most the model's prediction, with and without recomputation; the recomputed pass keeps
    no L x L tensor but the boolean mask, the plain one keeps every gated layer's."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=inter, num_hidden_layers=6,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=1024)
    model = tiny_model(cfg, dtype=dtype)
    torch.manual_seed(1)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    exs = examples(tokenizer)
    kept = {}
    for recompute in ("never", "always"):
        scorer = scorer_of(model, tokenizer, v, atp_recompute=recompute)
        batch = make_batch(exs, scorer.pad_id)
        B, L = batch.input_ids.shape
        by = saved_bytes(scorer, batch, [chunk_ids(len(r), 1) for r in batch.resp])
        total = sum(by.values())
        lxl = sum(n for k, n in by.items() if k.endswith("LxL"))
        predicted = token_bytes(scorer.shape, L, recompute == "always") * B * L
        assert total <= predicted, (recompute, by, predicted)
        if recompute == "always":
            assert lxl <= B * L * L  # the boolean mask
        else:
            assert lxl >= len(scorer.gate_layers) * B * heads * L * L * scorer.shape.acc_bytes
        kept[recompute] = total
        if dtype == torch.bfloat16:  # the shape the model was fit on: not a loose bound
            assert total >= 0.5 * predicted, (recompute, total, predicted)
    assert kept["always"] < 0.6 * kept["never"]
