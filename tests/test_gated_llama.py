"""The hand-written gated pass of the ``atp`` scorer (gated_llama.py) against the generic path through
HF's modules (``fast_tail`` off), on tiny float64 Llama-family models: right-padded batches of
examples of different lengths, grouped-query attention, every option that reaches the gated pass.

HF's RMSNorm normalises in float32 even in a float64 model, and the two paths differentiate it
differently (forward-mode AD op by op, or the written-out tangent), so a and B agree to float32
rounding as the models stand; with every RMSNorm patched to normalise in float64 (both paths) they
agree to float64 rounding, which checks every other term to ~1e-10."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bridgecli.errors import UsageError
from bridgecli.modeling import dual_llama, gated_llama, jvp_attention
from bridgecli.modeling.attention import _repeat_kv
from bridgecli.modeling.attribution import AttributionScorer, chunk_ids
from bridgecli.modeling.params import tail_parameters
from bridgecli.modeling.score_batch import make_batch
from bridgecli.modeling.scoring import ScoringContext

from test_dual_llama import qwen2
from tiny import record_examples as examples
from tiny import tiny_llama_config, tiny_model

pytestmark = pytest.mark.integration  # tiny models' gated passes, torch.compile (seconds each)

#: scorer options that reach the gated pass: layers=2 leaves two of the four tail blocks ungated,
#: layers=5 gates one block before the tail, ig=... run the pass at gated states with plain biases
CASES = {
    "default": {},
    "layers2": {"layers": "2"},
    "layers5": {"layers": "5"},
    "ig_path": {"ig": "2", "chunks": "2"},
    "ig_avg": {"ig": "2", "ig_rule": "avg"},
}


@pytest.fixture(scope="module")
def models(tokenizer):
    """family -> (float64 model, v on its final 4 blocks); the Llama has 4 heads on 2 KV heads."""
    out = {}
    for family in ("llama", "qwen2"):
        cfg = tiny_llama_config(len(tokenizer)) if family == "llama" else qwen2(len(tokenizer))
        cfg.initializer_range = 0.02
        model = tiny_model(cfg, dtype=torch.float64)
        torch.manual_seed(1)
        out[family] = model, {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    return out


def scorer_of(model, tokenizer, v, opts, fast: bool, **options) -> AttributionScorer:
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=3,
                         options={"scorer_options": dict(opts), "fast_tail": fast, "atp_fast": fast, **options})
    scorer = AttributionScorer(ctx)
    assert (scorer.gated_fast is not None) == fast
    return scorer


@pytest.fixture
def float64_norms(monkeypatch):
    """Every RMSNorm of both paths normalises in the input's dtype (float64) instead of float32."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    def hf_norm(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    def norm(x, w, eps):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def norm_dual(x, dx, w, dw, eps):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        n = x * r
        dn = r * (dx - n * (n * dx).mean(-1, keepdim=True))
        return w * n, (w * dn if dw is None else w * dn + dw * n)

    for cls in (LlamaRMSNorm, Qwen2RMSNorm):
        monkeypatch.setattr(cls, "forward", hf_norm)
    monkeypatch.setattr(gated_llama.rmsnorm, "fn", norm)
    monkeypatch.setattr(gated_llama.rmsnorm_dual, "fn", norm_dual)
    # the ungated tail blocks (layers=2) run the bridge scorer's fused tail, whose CPU attention and
    # routing rows work in float32: in float64 here
    monkeypatch.setattr(dual_llama.rmsnorm_dual, "fallback", norm_dual)
    monkeypatch.setattr(dual_llama, "attention_dual_math", attention_dual_float64)
    monkeypatch.setattr(jvp_attention, "routing_rows", routing_rows_float64)


def causal(lq: int, lk: int) -> torch.Tensor:
    return torch.ones(lq, lk, dtype=torch.bool).tril(diagonal=lk - lq)


def attention_dual_float64(q, k, v, dq, dk, dv, scale):
    """dual_llama.attention_dual_math in the inputs' dtype."""
    groups = q.shape[1] // k.shape[1]
    k, v, dk, dv = (_repeat_kv(t, groups) for t in (k, v, dk, dv))
    allowed = causal(q.shape[-2], k.shape[-2])
    s = ((q @ k.transpose(-1, -2)) * scale).masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    pds = (p * ((dq @ k.transpose(-1, -2) + q @ dk.transpose(-1, -2)) * scale)).masked_fill(~allowed, 0.0)
    o = p @ v
    return o, pds @ v + p @ dv - pds.sum(-1, keepdim=True) * o, lse


def routing_rows_float64(q, k, lse, scale, query_start):
    """jvp_attention.routing_rows in the inputs' dtype."""
    k = _repeat_kv(k, q.shape[1] // k.shape[1])
    s = (q[:, :, query_start:] @ k.transpose(-1, -2)) * scale
    p = torch.exp(s - lse[:, :, query_start:, None]).masked_fill(~causal(s.shape[-2], s.shape[-1]), 0.0)
    return p.mean(dim=1)


def gated(scorer: AttributionScorer, exs, log_gate: float | None = None, plain: bool = False):
    """The gated pass over ``exs`` in one right-padded batch: removal and plain-bias gradients
    [B, k, L] (3 groups), and the pass's own losses, a and routing rows."""
    batch = make_batch(exs, scorer.pad_id)
    assert len({len(e.tokens.input_ids) for e in exs}) > 1  # padding in play
    groups = [chunk_ids(len(r), 3) for r in batch.resp]
    state = scorer._state(batch, log_gate) if log_gate is not None else None
    removal, plains, kept = scorer._gated(batch, groups, state, plain=plain, keep=True)
    assert kept is not None
    losses, a, rows = kept
    assert rows is not None
    # the rows of real queries (pad queries: the fused tail's attention ignores the padding mask)
    real = rows.numpy().copy()
    for b, ex in enumerate(exs):
        real[b, len(ex.tokens.input_ids) - batch.query_start :] = 0.0
    return {"removal": removal, "plain": plains, "loss": losses.numpy(), "a": a.numpy(), "rows": real}


def assert_close(got: dict, ref: dict, rtol: float, exact: tuple[str, ...] = ()) -> None:
    """Every array of ``got`` against ``ref``, within ``rtol`` of the largest magnitude (1e-10 for
    the names in ``exact``); each reference nonzero."""
    for key, want in ref.items():
        if want is None:
            assert got[key] is None
            continue
        scale = float(np.abs(want).max())
        assert scale > 0, key
        tol = 1e-10 if key in exact else rtol
        np.testing.assert_allclose(got[key], want, rtol=0, atol=tol * scale, err_msg=key)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("case", list(CASES))
def test_fast_gated_pass_equals_the_generic_path_with_float64_norms(models, tokenizer, float64_norms, family, case):
    model, v = models[family]
    exs = examples(tokenizer)
    fast = scorer_of(model, tokenizer, v, CASES[case], True)
    generic = scorer_of(model, tokenizer, v, CASES[case], False)
    for state, plain in ((None, False), (0.6, True)):
        assert_close(gated(fast, exs, state, plain), gated(generic, exs, state, plain), 1e-10)


@pytest.mark.parametrize("case", list(CASES))
def test_fast_scores_equal_the_generic_path(models, tokenizer, case):
    """As the models stand (float32 RMSNorm): losses and routing rows to float64 rounding, a and B to
    the float32 rounding of the norm's tangent; every field of the scores too. (layers=2: the ungated
    tail blocks run the bridge scorer's fused tail, whose CPU attention works in float32.)"""
    model, v = models["llama"]
    exs = examples(tokenizer)
    fast = scorer_of(model, tokenizer, v, CASES[case], True)
    generic = scorer_of(model, tokenizer, v, CASES[case], False)
    exact = () if case == "layers2" else ("loss", "rows")
    assert_close(gated(fast, exs, 0.7, True), gated(generic, exs, 0.7, True), 2e-6, exact)
    for f, g in zip(fast.score(exs), generic.score(exs)):
        for field in ("a", "loss", "A", "c", "B"):
            want = getattr(g, field).numpy().astype(np.float64)
            got = getattr(f, field).numpy().astype(np.float64)
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-6 * np.abs(want).max(), err_msg=f"{case} {field}")


def test_recomputed_attention_gives_the_same_gradients(models, tokenizer):
    """atp_recompute=always (checkpointed gated core) against never, on the fast path."""
    model, v = models["llama"]
    exs = examples(tokenizer)
    opts = {"layers": "5"}
    never = gated(scorer_of(model, tokenizer, v, opts, True, atp_recompute="never"), exs, 0.7, True)
    always = gated(scorer_of(model, tokenizer, v, opts, True, atp_recompute="always"), exs, 0.7, True)
    assert_close(always, never, 1e-12)


def test_the_fast_pass_needs_a_supported_family_and_the_switch(models, tokenizer):
    from transformers import Gemma3TextConfig

    model, v = models["llama"]
    assert scorer_of(model, tokenizer, v, {}, True).gated_fast is not None
    cfg = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=1, head_dim=8, max_position_embeddings=256)
    gemma = tiny_model(cfg)
    w = {n: torch.randn_like(p) for n, p in tail_parameters(gemma, 2).items()}
    ctx = ScoringContext(model=gemma, tokenizer=tokenizer, direction=w, options={"scorer_options": {"fast": "1"}})
    assert AttributionScorer(ctx).gated_fast is None


def test_the_fast_pass_is_opt_in_for_users(models, tokenizer):
    """`bridge score --scorer atp` runs the generic path unless `--scorer-option fast=1`."""
    model, v = models["llama"]

    def atp(**scorer_options):
        ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, options={"scorer_options": scorer_options})
        return AttributionScorer(ctx)

    assert atp().gated_fast is None and atp(fast="0").gated_fast is None
    assert atp(fast="1").gated_fast is not None
    with pytest.raises(UsageError, match="fast must be 0 or 1"):
        atp(fast="maybe")
    # `bridge score` tells the user of the compiling, where there is some: the fast pass on a GPU
    fast, generic = atp(fast="1"), atp()
    assert fast.startup_note is None and generic.startup_note is None  # on the CPU nothing compiles
    fast.ctx.device = generic.ctx.device = "cuda"
    assert "compiles before the first batch" in fast.startup_note and generic.startup_note is None


@pytest.fixture
def compiled_on_cpu(monkeypatch):
    """gated_llama's compiled functions through torch.compile on CPU with the aot_eager backend
    (AOTAutograd's forward and backward graphs, no code generation)."""
    monkeypatch.delenv("BRIDGE_COMPILE", raising=False)
    for c in gated_llama.COMPILED:
        monkeypatch.setattr(c, "device_types", ("cpu",))
        monkeypatch.setattr(c, "backend", "aot_eager")
        monkeypatch.setattr(c, "compiled", None)
        monkeypatch.setattr(c, "failed", False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_functions_work_under_autograd(compiled_on_cpu):
    """Each compiled function's values and input gradients equal the eager function's (float64)."""
    torch.manual_seed(0)
    B, L, H, KV, D, W = 2, 5, 4, 2, 8, 16

    def x(*shape):
        return torch.randn(*shape, dtype=torch.float64, requires_grad=True)

    cases = [
        (gated_llama.rmsnorm, (x(B, L, W), x(W).detach(), 1e-6)),
        (gated_llama.rope, (x(B, H, L, D), x(B, KV, L, D), x(B, 1, L, D).detach(), x(B, 1, L, D).detach())),
        (gated_llama.swiglu, (x(B, L, 2 * W),)),
        (gated_llama.rmsnorm_dual, (x(B, L, W), x(B, L, W), x(W).detach(), x(W).detach(), 1e-6)),
        (gated_llama.rope_dual, (x(B, H, L, D), x(B, H, L, D), x(B, KV, L, D), x(B, KV, L, D),
                                 x(B, 1, L, D).detach(), x(B, 1, L, D).detach())),
        (gated_llama.swiglu_dual, (x(B, L, 2 * W), x(B, L, 2 * W))),
    ]
    for fn, args in cases:
        leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        results = []
        for run in (fn, fn.fn):
            out = run(*args)
            outs = out if isinstance(out, tuple) else (out,)
            weights = [torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view(o.shape) for o in outs]
            grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(outs, weights)), leaves)
            results.append([o.detach() for o in outs] + list(grads))
        for got, want in zip(*results):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert fn.compiled is not None and not fn.failed, fn.fn.__name__


def test_the_fast_pass_runs_with_compiled_functions(models, tokenizer, compiled_on_cpu):
    """The whole fast pass with its functions and the gated attention core compiled (aot_eager),
    checkpointed or not, equals it eager; nothing fell back to eager on the way. Both modes in one test:
    the second reuses the first's compiled graphs (two tests compiled everything twice)."""
    model, v = models["llama"]
    exs = examples(tokenizer)
    scorers = {r: scorer_of(model, tokenizer, v, {"layers": "5"}, True, atp_recompute=r) for r in ("never", "always")}
    got = {r: gated(scorer, exs, 0.7, True) for r, scorer in scorers.items()}
    assert all(c.compiled is not None and not c.failed for c in gated_llama.COMPILED)
    for c in gated_llama.COMPILED:
        c.device_types = ()
    for r, scorer in scorers.items():
        assert_close(got[r], gated(scorer, exs, 0.7, True), 1e-12)


def test_inductor_backward_serves_batches_of_other_lengths(monkeypatch, tmp_path):
    """With inductor, one compiled graph differentiates batches of different lengths: the backward
    does not keep the first batch's strides as constants (which it did under dynamo's size-oblivious
    rule, failing at the second length). Every differentiated compiled function is built that way."""
    assert all(c.shape_config.get("backed_size_oblivious", False) is False for c in gated_llama.COMPILED)
    fn = gated_llama._Lean(gated_llama.dual_llama._rmsnorm_dual)
    monkeypatch.delenv("BRIDGE_COMPILE", raising=False)
    monkeypatch.setattr(fn, "device_types", ("cpu",))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # a graph cached by another build is no test
    torch._dynamo.reset()
    torch.manual_seed(0)
    try:
        for L in (5, 7, 3):
            args = [torch.randn(2, L, 16, dtype=torch.float64, requires_grad=True) for _ in range(2)]
            w = torch.randn(16, dtype=torch.float64)
            results = []
            for run in (fn, fn.fn):
                y, dy = run(*args, w, None, 1e-6)  # as the blocks call it
                results.append([y, dy, *torch.autograd.grad((y * dy).sum(), args)])
            for got, want in zip(*results):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32 inside
        assert fn.compiled is not None and not fn.failed
    finally:
        torch._dynamo.reset()


@pytest.mark.parametrize("fast", [True, False])
def test_padding_a_pass_to_a_multiple_changes_no_score(models, tokenizer, fast):
    """A GPU pass is padded to a multiple of 8 (aligned matrix products): masked keys after every
    real token change no field of the scores (float64: to rounding)."""
    model, v = models["llama"]
    exs = examples(tokenizer)
    scorer = scorer_of(model, tokenizer, v, {"chunks": "2"}, fast)
    assert scorer.pad_multiple == 1  # on the CPU
    lengths = [len(ex.tokens.input_ids) for ex in exs]
    want = scorer.score(exs)
    scorer.pad_multiple = 16
    assert max(lengths) % 16 and make_batch(exs, scorer.pad_id, "cpu", 16).input_ids.shape[1] % 16 == 0
    for w, g in zip(want, scorer.score(exs)):
        for field in ("a", "loss", "A", "c", "B"):
            np.testing.assert_allclose(getattr(g, field).numpy(), getattr(w, field).numpy(), rtol=1e-9,
                                       atol=1e-12, err_msg=field)
    assert scorer.multiple_for(exs) == 16
    limit = model.config.max_position_embeddings
    try:  # a pass is never padded past the model's positions
        model.config.max_position_embeddings = max(lengths) + 1
        assert scorer.multiple_for(exs) == 1
    finally:
        model.config.max_position_embeddings = limit
