"""The LM head's per-token loss and tangent (ce_tangent), its written-out reverse pass, and the
Triton pieces (ce_kernel) against torch. The kernels run on a GPU, or in Triton's interpreter on
the CPU (tests/conftest.py turns it on when Triton is installed and there is no GPU)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from bridgecli.modeling import ce_kernel, ce_tangent

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
KERNELS = pytest.mark.skipif(
    not ce_kernel.HAVE_TRITON or not (CUDA or os.environ.get("TRITON_INTERPRET") == "1"),
    reason="needs Triton (on a GPU, or TRITON_INTERPRET=1)",
)


def reference(h, dh, W, b, t):
    """(loss, tangent) written out in plain differentiable ops: loss = logsumexp(z) - z_t and its
    derivative along the tangent logits dz = dh W^T, softmax(z) . dz - dz_t."""
    z = h @ W.T
    if b is not None:
        z = z + b
    dz = dh @ W.T
    loss = torch.logsumexp(z, -1) - z.gather(1, t[:, None])[:, 0]
    tangent = (torch.softmax(z, -1) * dz).sum(-1) - dz.gather(1, t[:, None])[:, 0]
    return loss, tangent


def test_reference_is_forward_mode_ad():
    h, dh, W, b, t = problem()
    with fwAD.dual_level():
        want = fwAD.unpack_dual(F.cross_entropy(fwAD.make_dual(h, dh) @ W.T + b, t, reduction="none"))
        want = (want.primal, want.tangent)
    for g, w in zip(reference(h, dh, W, b, t), want):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def problem(rows=23, hidden=16, vocab=300, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, dtype=torch.float64, generator=g)
    dh = torch.randn(rows, hidden, dtype=torch.float64, generator=g)
    W = torch.randn(vocab, hidden, dtype=torch.float64, generator=g) * 2
    b = torch.randn(vocab, dtype=torch.float64, generator=g) if bias else None
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[0] = int((h[0] @ W.T).argmax())  # a confident row
    return h, dh, W, b, t


@pytest.mark.parametrize("bias", [True, False])
def test_values_match_forward_mode_ad(bias):
    h, dh, W, b, t = problem(bias=bias)
    want = reference(h, dh, W, b, t)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            got = ce_tangent.token_ce_with_tangent(h.requires_grad_(grad), dh, W, b, t, chunk=7)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("terms", ["tangent", "loss", "both"])
def test_reverse_pass_matches_autograd(bias, terms):
    """d(g_a . a + g_l . loss)/d(h, dh) of the written-out reverse pass equals autograd through
    forward-mode AD of F.cross_entropy (float64), for either output alone or both."""
    h, dh, W, b, t = problem(bias=bias, seed=1)
    g_a = torch.randn(len(t), dtype=torch.float64)
    g_l = torch.randn(len(t), dtype=torch.float64)

    def objective(loss, a):
        return {"tangent": (g_a * a).sum(), "loss": (g_l * loss).sum(), "both": (g_a * a + g_l * loss).sum()}[terms]

    grads = []
    for fn in (reference, lambda *args: ce_tangent.token_ce_with_tangent(*args, chunk=5)):
        x, dx = h.clone().requires_grad_(), dh.clone().requires_grad_()
        grads.append(torch.autograd.grad(objective(*fn(x, dx, W, b, t)), [x, dx], allow_unused=True))
    for want, got in zip(*grads):
        if want is None:
            assert got is None or not got.any()
        else:
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_reverse_pass_matches_finite_differences():
    """A directional derivative of the tangent a with respect to h, against central differences."""
    h, dh, W, b, t = problem(rows=4, vocab=40, seed=2)
    x = h.clone().requires_grad_()
    (grad,) = torch.autograd.grad(ce_tangent.token_ce_with_tangent(x, dh, W, b, t)[1].sum(), [x])
    u = torch.randn_like(h)
    eps = 1e-6
    with torch.no_grad():
        plus = ce_tangent.token_ce_with_tangent(h + eps * u, dh, W, b, t)[1].sum()
        minus = ce_tangent.token_ce_with_tangent(h - eps * u, dh, W, b, t)[1].sum()
    assert abs(float((grad * u).sum()) - float((plus - minus) / (2 * eps))) < 1e-6


@KERNELS
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_loss", [True, False])
def test_grad_kernel_matches_torch(dtype, with_loss):
    """ce_kernel.ce_grad_logits against ce_tangent.grad_logits on the same inputs (vocabulary not a
    multiple of the block, a row with its target at the last column)."""
    torch.manual_seed(0)
    n, v = 6, 300
    z = (torch.randn(n, v) * 3).to(DEV, dtype)
    dz = torch.randn(n, v).to(DEV, dtype)
    t = torch.randint(0, v, (n,), device=DEV)
    t[1] = v - 1
    lse = torch.logsumexp(z.float(), -1)
    g_a = torch.randn(n, device=DEV)
    g_l = torch.randn(n, device=DEV) if with_loss else None
    got = ce_kernel.ce_grad_logits(z, dz, lse, t, g_a, g_l, block=128)
    want = ce_tangent.grad_logits(z, dz, lse, t, g_a, g_l)
    assert got.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    else:  # float32 inside both, rounded once to bfloat16: at most one bf16 ulp apart
        torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-5)


@KERNELS
def test_loss_and_q_kernel_matches_torch():
    torch.manual_seed(1)
    n, v = 5, 257
    z = (torch.randn(n, v) * 3).to(DEV, torch.bfloat16)
    t = torch.randint(0, v, (n,), device=DEV)
    loss, q = ce_kernel.ce_loss_and_q(z, t, block=64)
    zf = z.float()
    torch.testing.assert_close(loss, F.cross_entropy(zf, t, reduction="none"), rtol=1e-5, atol=1e-5)
    want = torch.softmax(zf, -1) - F.one_hot(t, v).float()
    torch.testing.assert_close(q.float(), want, rtol=2 ** -7, atol=1e-5)


def autograd_path(h, dh, W, b, t):
    """The chunk as it was differentiated before the written-out reverse pass: autograd through the
    float32 softmax of the head's logits (for a baseline of half-precision error)."""
    z = (h @ W.T).float()
    if b is not None:
        z = z + b.float()
    lse = torch.logsumexp(z, -1)
    loss = lse - z.gather(1, t[:, None])[:, 0]
    q = torch.exp(z - lse[:, None]).scatter_add(1, t[:, None], z.new_full((len(t), 1), -1.0))
    return loss, ((q.to(W.dtype) @ W).float() * dh.float()).sum(-1)


@pytest.mark.parametrize("bias", [True, False])
def test_half_precision_reverse_pass_no_worse_than_autograd(bias):
    """In bfloat16 (on a GPU without a bias: the Triton kernels) the gradients' error against float64
    from the same rounded inputs is at most that of autograd through the float32 softmax (bf16
    logits set both), and small."""
    h, dh, W, b, t = problem(rows=64, hidden=32, vocab=1000, bias=bias, seed=3)
    args16 = [x.to(DEV, torch.bfloat16) if x is not None else None for x in (h, dh, W, b)]
    args64 = [x.double() if x is not None else None for x in args16]
    grads = []
    for fn, args in ((ce_tangent.token_ce_with_tangent, args16), (autograd_path, args16),
                     (ce_tangent.token_ce_with_tangent, args64)):
        x, dx = args[0].clone().requires_grad_(), args[1].clone().requires_grad_()
        loss, a = fn(x, dx, args[2], args[3], t.to(DEV))
        grads.append(torch.autograd.grad((a + 0.5 * loss).sum(), [x, dx]))
    for got, base, want in zip(*grads):
        err = float((got.double() - want).norm() / want.norm())
        base_err = float((base.double() - want).norm() / want.norm())
        assert got.dtype == torch.bfloat16 and err <= 1.2 * base_err + 2e-3 and err < 0.05, (err, base_err)
