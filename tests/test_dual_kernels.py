"""The Triton RMSNorm / RoPE / SwiGLU primal+tangent kernels (dual_kernels) against the eager
functions of dual_llama, and their tangents against forward-mode AD of the eager primal.

Runs on a GPU, or on the CPU in Triton's interpreter (tests/conftest.py turns it on when Triton is
installed and there is no GPU). Tolerances: float32 within 2e-6 relative (float32 sums and exp in
another order); bfloat16/float16 round at eager's points, so RoPE is bit-exact and RMSNorm / SwiGLU
differ from eager on at most 2% of the elements, where a float32 row sum or exp lands on the other
side of a rounding boundary: the intermediate (n, dn, sigmoid, of order 1) moves by one ulp, and
the output by at most 2 ulps of itself or eps of its dtype (one ulp at 1.0) once scaled by w."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from bridgecli.modeling import dual_kernels as dk
from bridgecli.modeling import dual_llama as dl

CUDA = torch.cuda.is_available()
pytestmark = [
    pytest.mark.skipif(
        not dk.HAVE_TRITON or not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
        reason="needs Triton (on a GPU, or TRITON_INTERPRET=1)",
    ),
    pytest.mark.integration,  # GPU kernels, on a CPU in Triton's interpreter: seconds
]
DEV = "cuda" if CUDA else "cpu"
EPS = 1e-5


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """On the CPU the kernels run only when forced (the interpreter)."""
    monkeypatch.setenv("BRIDGE_DUAL_KERNELS", "auto" if CUDA else "force")


def ulps(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """|got - want| in units of the ulp (in want's dtype) of the larger magnitude."""
    a, b = got.double(), want.double()
    _, e = torch.frexp(torch.maximum(a.abs(), b.abs()))
    ulp = torch.ldexp(torch.full_like(a, torch.finfo(want.dtype).eps), e - 1)
    return (a - b).abs() / ulp


def assert_matches_eager(got, want, exact: bool = False):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == torch.float32:
            torch.testing.assert_close(g, w, rtol=2e-6, atol=1e-6)
        elif exact:
            assert torch.equal(g, w), (g.float() - w.float()).abs().max()
        else:
            off = ulps(g, w)
            far = (off > 2) & ((g.double() - w.double()).abs() > torch.finfo(w.dtype).eps)
            assert not far.any(), (g[far], w[far])
            assert (off > 0).float().mean() <= 0.02, (off > 0).float().mean()


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


# --- RMSNorm --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 5, 48), (1, 1, 100), (2, 9, 100)])
@pytest.mark.parametrize("with_dw", [False, True])
def test_rmsnorm_matches_eager(dtype, shape, with_dw):
    torch.manual_seed(0)
    x, dx = randn(*shape, dtype=dtype, scale=3.0), randn(*shape, dtype=dtype)
    w = (1 + 0.1 * randn(shape[-1])).to(dtype)
    dw = randn(shape[-1], dtype=dtype) if with_dw else None
    assert dk.rmsnorm_applies(x, dx, w, dw, EPS)
    assert_matches_eager(dk.rmsnorm_dual(x, dx, w, dw, EPS), dl._rmsnorm_dual(x, dx, w, dw, EPS))


def test_rmsnorm_strided_rows():
    """Rows read through a row stride (a slice of a wider tensor), and a transposed input (copied)."""
    torch.manual_seed(1)
    wide, dwide = randn(4, 6, 130), randn(4, 6, 130)
    x, dx = wide[..., :100], dwide[..., 30:]
    w, dw = randn(100), randn(100)
    assert_matches_eager(dk.rmsnorm_dual(x, dx, w, dw, EPS), dl._rmsnorm_dual(x, dx, w, dw, EPS))
    xt, dxt = randn(6, 4, 48).transpose(0, 1), randn(4, 6, 48)
    w48 = randn(48)
    assert_matches_eager(dk.rmsnorm_dual(xt, dxt, w48, None, EPS), dl._rmsnorm_dual(xt, dxt, w48, None, EPS))


def test_rmsnorm_tangent_is_forward_ad_of_the_eager_primal():
    """dy against torch.func.jvp of y(x, w) (float64 inputs; the eager primal normalises in float32,
    as LlamaRMSNorm does), with and without a weight tangent."""
    torch.manual_seed(2)
    x, dx, w, dw = randn(2, 3, 100, scale=2.0), randn(2, 3, 100), 1 + 0.1 * randn(100), randn(100)

    def primal(a, b):
        return dl._rmsnorm_dual(a, torch.zeros_like(a), b, None, EPS)[0]

    for tangent_w in (torch.zeros_like(dw), dw):
        _, want = torch.func.jvp(primal, (x.double(), w.double()), (dx.double(), tangent_w.double()))
        y, got = dk.rmsnorm_dual(x, dx, w, tangent_w, EPS)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    y0, got0 = dk.rmsnorm_dual(x, dx, w, None, EPS)
    torch.testing.assert_close(got0, dk.rmsnorm_dual(x, dx, w, torch.zeros_like(dw), EPS)[1], rtol=0, atol=0)


# --- RoPE -----------------------------------------------------------------------------------


def rope_inputs(B, H, HK, L, D, dtype, cos_batch=1, seed=0):
    """q, dq, k, dk as the scorer passes them (transposed head views of the fused q|k|v projection
    and its tangent) and cos/sin [cos_batch, 1, L, D]."""
    torch.manual_seed(seed)
    width = (H + 2 * HK) * D
    qkv, dqkv = randn(B, L, width, dtype=dtype), randn(B, L, width, dtype=dtype)

    def heads(t, start, n):
        return t[..., start : start + n * D].view(B, L, n, D).transpose(1, 2)

    q, k = heads(qkv, 0, H), heads(qkv, H * D, HK)
    dq, dk_ = heads(dqkv, 0, H), heads(dqkv, H * D, HK)
    angle = torch.arange(L, device=DEV)[:, None] * torch.rand(D, device=DEV)[None, :]
    if cos_batch > 1:
        angle = angle[None] + torch.rand(cos_batch, 1, 1, device=DEV)
    cos, sin = torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)
    cos, sin = cos.expand(cos_batch, L, D).unsqueeze(1), sin.expand(cos_batch, L, D).unsqueeze(1)
    return q, dq, k, dk_, cos, sin


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "B,H,HK,L,D,cos_batch",
    [(2, 4, 2, 7, 16, 1), (1, 3, 1, 1, 12, 1), (3, 6, 2, 5, 8, 3), (1, 2, 2, 9, 32, 1)],
)
def test_rope_matches_eager(dtype, B, H, HK, L, D, cos_batch):
    args = rope_inputs(B, H, HK, L, D, dtype, cos_batch)
    assert dk.rope_applies(*args)
    got, want = dk.rope_dual(*args), dl._rope_dual(*args)
    assert_matches_eager(got, want, exact=True)
    assert all(g.transpose(1, 2).is_contiguous() for g in got + want)  # eager's [B, L, H, D] memory layout


def test_rope_contiguous_inputs_and_3d_tables():
    torch.manual_seed(3)
    q, dq, k, dk_ = randn(2, 4, 6, 16), randn(2, 4, 6, 16), randn(2, 2, 6, 16), randn(2, 2, 6, 16)
    cos, sin = randn(6, 16), randn(6, 16)  # [L, D]: broadcasts over batch and heads
    assert dk.rope_applies(q, dq, k, dk_, cos, sin)
    assert_matches_eager(dk.rope_dual(q, dq, k, dk_, cos, sin), dl._rope_dual(q, dq, k, dk_, cos, sin))


def test_rope_tangent_is_forward_ad_of_the_eager_primal():
    q, dq, k, dk_, cos, sin = rope_inputs(2, 4, 2, 6, 16, torch.float32)

    def primal(a, b):
        return dl._rope(a, cos.double(), sin.double()), dl._rope(b, cos.double(), sin.double())

    _, (want_q, want_k) = torch.func.jvp(primal, (q.double(), k.double()), (dq.double(), dk_.double()))
    _, got_q, _, got_k = dk.rope_dual(q, dq, k, dk_, cos, sin)
    torch.testing.assert_close(got_q.double(), want_q, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_k.double(), want_k, rtol=1e-5, atol=1e-6)


# --- SwiGLU ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 3, 80), (1, 1, 100), (1, 2, 2 * 1100)])
def test_swiglu_matches_eager(dtype, shape):
    torch.manual_seed(4)
    gu, dgu = randn(*shape, dtype=dtype, scale=3.0), randn(*shape, dtype=dtype)
    assert dk.swiglu_applies(gu, dgu)
    assert_matches_eager(dk.swiglu_dual(gu, dgu), dl._swiglu_dual(gu, dgu))


def test_swiglu_strided_rows():
    torch.manual_seed(5)
    gu, dgu = randn(3, 4, 90)[..., 10:], randn(3, 4, 200)[..., :80]
    assert_matches_eager(dk.swiglu_dual(gu, dgu), dl._swiglu_dual(gu, dgu))


def test_swiglu_tangent_is_forward_ad_of_the_eager_primal():
    torch.manual_seed(6)
    gu, dgu = randn(2, 5, 2 * 60, scale=3.0), randn(2, 5, 2 * 60)
    _, want = torch.func.jvp(lambda a: dl._swiglu_dual(a, a)[0], (gu.double(),), (dgu.double(),))
    torch.testing.assert_close(dk.swiglu_dual(gu, dgu)[1].double(), want, rtol=1e-5, atol=1e-6)


# --- rounding, dispatch ---------------------------------------------------------------------

if dk.HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _round_kernel(X, Y, N, BLOCK: tl.constexpr, RND: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        tl.store(Y + offs, dk._rd(tl.load(X + offs, mask=ok), RND), mask=ok)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the interpreter's fp16 cast
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_to_the_input_dtype_is_torchs(dtype):
    """The kernels' round-trip through bf16/fp16 equals torch's cast: ties to even, overflow to inf,
    NaN kept, subnormals."""
    torch.manual_seed(7)
    bits = torch.randint(-(2**31), 2**31 - 1, (4096,), dtype=torch.int64).to(torch.int32)
    base = torch.randn(2048).to(dtype).float()  # representable values, then exact ties between them
    ties = (base.view(torch.int32) | (1 << 15 if dtype == torch.bfloat16 else 1 << 12)).view(torch.float32)
    special = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 3.4e38, -3.4e38, 1e-40, 65520.0, 6e-8])
    x = torch.cat([bits.view(torch.float32), base, ties, special]).to(DEV)
    y = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024, RND=2 if dtype == torch.bfloat16 else 1)
    want = x.to(dtype).float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan], want[~nan])


def test_applies_and_dispatch(monkeypatch):
    x, dx, w = randn(2, 3, 48), randn(2, 3, 48), randn(48)
    calls = []

    def fallback(*args):
        calls.append(args)
        return dl._rmsnorm_dual(*args)

    norm = dk.Dispatch(dk.rmsnorm_dual, dk.rmsnorm_applies, fallback)
    norm(x, dx, w, None, EPS)
    assert not calls
    # not served: float64, mixed dtypes, autograd recording, a per-head RoPE table, odd SwiGLU width
    assert not dk.rmsnorm_applies(x.double(), dx.double(), w.double(), None, EPS)
    assert not dk.rmsnorm_applies(x.bfloat16(), dx.bfloat16(), w, None, EPS)
    wg = w.clone().requires_grad_(True)
    assert not dk.rmsnorm_applies(x, dx, wg, None, EPS)
    with torch.no_grad():
        assert dk.rmsnorm_applies(x, dx, wg, None, EPS)
    q, dq, k, dk_, cos, sin = rope_inputs(1, 2, 1, 4, 8, torch.float32)
    assert not dk.rope_applies(q, dq, k, dk_, cos.expand(1, 2, 4, 8), sin)
    assert not dk.swiglu_applies(randn(2, 7), randn(2, 7))
    norm(x.double(), dx.double(), w.double(), None, EPS)
    assert len(calls) == 1
    monkeypatch.setenv("BRIDGE_DUAL_KERNELS", "0")
    assert not dk.rmsnorm_applies(x, dx, w, None, EPS)
    if not CUDA:  # CPU tensors only when forced
        monkeypatch.setenv("BRIDGE_DUAL_KERNELS", "auto")
        assert not dk.swiglu_applies(randn(2, 8), randn(2, 8))


@pytest.mark.integration  # a model's fast and eager passes (seconds)
def test_fast_tail_on_the_kernels_matches_its_eager_path(tokenizer, monkeypatch):
    """dual_llama's three functions dispatched to the kernels (the wiring proposed for it), on a
    tiny float32 Llama and one short example (the interpreter is slow; bf16 CPU matmuls too):
    every call the scorer makes is served by a kernel, and the scores equal those of the same
    scorer with the kernels off to float32 accuracy."""
    from bridgecli.modeling.params import tail_parameters
    from bridgecli.modeling.scoring import BridgeScorer, ScoringContext

    from tiny import record_examples as examples
    from tiny import tiny_llama_config, tiny_model

    served = []

    def counted(kernel):
        def run(*args):
            served.append(kernel.__name__)
            return kernel(*args)

        run.__name__ = kernel.__name__
        return run

    for name, applies, eager in [
        ("rmsnorm_dual", dk.rmsnorm_applies, dl._rmsnorm_dual),
        ("rope_dual", dk.rope_applies, dl._rope_dual),
        ("swiglu_dual", dk.swiglu_applies, dl._swiglu_dual),
    ]:
        monkeypatch.setattr(dl, name, dk.Dispatch(counted(getattr(dk, name)), applies, eager))
    model = tiny_model(tiny_llama_config(len(tokenizer), hidden=48, heads=3, kv_heads=1)).to(DEV)
    torch.manual_seed(3)
    v = {n: torch.randn_like(p) for n, p in tail_parameters(model, 2).items()}
    exs = sorted(examples(tokenizer), key=lambda e: len(e.tokens.input_ids))[:1]

    def scores():
        ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=2, device=DEV)
        scorer = BridgeScorer(ctx)
        assert scorer.fast is not None
        return scorer.score(exs)

    on = scores()
    assert sorted(set(served)) == ["rmsnorm_dual", "rope_dual", "swiglu_dual"]
    assert len(served) == 2 * 4 + 1  # two blocks (2 norms, RoPE, SwiGLU each) and the final norm
    monkeypatch.setenv("BRIDGE_DUAL_KERNELS", "0")
    off = scores()
    for f, g in zip(on, off, strict=True):
        np.testing.assert_allclose(f.a.numpy(), g.a.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f.loss.numpy(), g.loss.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(f.A.numpy(), g.A.numpy())
