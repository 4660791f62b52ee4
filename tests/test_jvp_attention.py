"""The fused attention JVP (Triton) against forward-mode AD through plain math attention.

Runs on a GPU, or on the CPU in Triton's interpreter (tests/conftest.py turns it on when Triton is
installed and there is no GPU, as in CI, where the test extra installs Triton). Skipped without Triton."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from bridgecli.modeling import jvp_attention as ja

CUDA = torch.cuda.is_available()
pytestmark = [pytest.mark.skipif(not ja.HAVE_TRITON or not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
                                 reason="needs Triton (on a GPU, or TRITON_INTERPRET=1)"),
              pytest.mark.integration]  # GPU kernels, on a CPU in Triton's interpreter: seconds
DEV = "cuda" if CUDA else "cpu"


def math_attention(q, k, v, scale):
    groups = q.shape[1] // k.shape[1]
    k = ja._expand_kv(k, groups)
    v = ja._expand_kv(v, groups)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    L = q.shape[-2]
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    return torch.matmul(torch.softmax(s, -1), v)


@pytest.mark.parametrize("B,H,HKV,L,D", [(2, 4, 2, 37, 16), (1, 2, 2, 64, 32), (1, 3, 1, 70, 64)])
def test_tangent_matches_forward_ad_through_math(B, H, HKV, L, D):
    torch.manual_seed(0)
    dtype = torch.float32
    q = torch.randn(B, H, L, D, device=DEV, dtype=dtype)
    k = torch.randn(B, HKV, L, D, device=DEV, dtype=dtype)
    v = torch.randn(B, HKV, L, D, device=DEV, dtype=dtype)
    dq, dk, dv = (torch.randn_like(t) for t in (q, k, v))
    scale = D ** -0.5
    o_ref, do_ref = torch.func.jvp(lambda a, b, c: math_attention(a, b, c, scale), (q, k, v), (dq, dk, dv))
    o, lse = ja.attention_with_lse(q, k, v, scale)
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    do = ja.attention_tangent(q, k, v, dq, dk, dv, o, lse, scale, block_m=16, block_n=16)
    torch.testing.assert_close(do, do_ref, atol=1e-3, rtol=1e-3)


def test_dual_attention_and_routing_rows():
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(1)
    B, H, HKV, L, D = 2, 4, 2, 40, 16
    q, k, v = torch.randn(B, H, L, D), torch.randn(B, HKV, L, D), torch.randn(B, HKV, L, D)
    q, k, v = (t.to(DEV) for t in (q, k, v))
    dq, dk, dv = (torch.randn_like(t) for t in (q, k, v))
    scale = D ** -0.5
    seen = []
    with fwAD.dual_level():
        out = ja.dual_causal_attention(fwAD.make_dual(q, dq), fwAD.make_dual(k, dk), fwAD.make_dual(v, dv), scale,
                                       lambda qq, kk, lse: seen.append(ja.routing_rows(qq, kk, lse, scale, 25)))
        o, do = fwAD.unpack_dual(out)
    o_ref, do_ref = torch.func.jvp(lambda a, b, c: math_attention(a, b, c, scale), (q, k, v), (dq, dk, dv))
    torch.testing.assert_close(o, o_ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(do, do_ref, atol=1e-3, rtol=1e-3)
    probs = torch.softmax((q @ ja._expand_kv(k, 2).transpose(-1, -2) * scale).masked_fill(
        ~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf")), -1)
    torch.testing.assert_close(seen[0], probs[:, :, 25:].mean(1), atol=1e-5, rtol=1e-5)
    # no tangent in, plain tensor out
    assert fwAD.unpack_dual(ja.dual_causal_attention(q, k, v, scale)).tangent is None


@pytest.mark.integration  # scores a model in Triton's interpreter (seconds)
def test_scorer_with_fused_attention_matches_math(tokenizer, monkeypatch):
    from bridgecli.modeling.params import tail_parameters
    from bridgecli.modeling.scoring import BridgeScorer, ScoringContext

    from tiny import record_examples as examples
    from tiny import tiny_llama_config, tiny_model

    model = tiny_model(tiny_llama_config(len(tokenizer), hidden=64, heads=4, kv_heads=2))
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 4).items()}
    exs = examples(tokenizer)
    ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v)
    monkeypatch.setenv("BRIDGE_FUSED_ATTENTION", "0")
    ref = BridgeScorer(ctx).score(exs)
    monkeypatch.setenv("BRIDGE_FUSED_ATTENTION", "force")
    fused = BridgeScorer(ctx).score(exs)
    for r, f in zip(ref, fused):
        np.testing.assert_allclose(f.a.numpy(), r.a.numpy(), rtol=1e-3, atol=1e-5)
        np.testing.assert_allclose(f.A.numpy(), r.A.numpy(), atol=1e-3)
        np.testing.assert_allclose(f.c.numpy(), r.c.numpy(), atol=1e-5)


def test_pinned_configs_are_candidates_and_looked_up_by_bucket(monkeypatch):
    """The pinned table: every entry is a candidate of the autotuner, a key is found at its own
    bucket or the next listed one above (the largest for longer contexts), and there is no pin off
    a GPU, on an unlisted architecture or head dim, or with BRIDGE_ATTN_AUTOTUNE=1."""
    for by_dim in ja.PINNED.values():
        for dim, by_bucket in by_dim.items():
            assert set(by_bucket.values()) <= set(ja.candidate_configs(dim))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.delenv("BRIDGE_ATTN_AUTOTUNE", raising=False)
    table = ja.PINNED[9][128]
    assert ja.pinned_config(cuda, 128, 256) == table[256]
    assert ja.pinned_config(cuda, 128, 32) == table[min(table)]
    assert ja.pinned_config(cuda, 128, 1 << 15) == table[max(table)]
    assert ja.pinned_config(cuda, 96, 256) is None
    assert ja.pinned_config(torch.device("cpu"), 128, 256) is None
    monkeypatch.setenv("BRIDGE_ATTN_AUTOTUNE", "1")
    assert ja.pinned_config(cuda, 128, 256) is None
    monkeypatch.delenv("BRIDGE_ATTN_AUTOTUNE")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert ja.pinned_config(cuda, 128, 256) is None
