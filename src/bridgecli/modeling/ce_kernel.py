"""Fused softmax cross-entropy pieces for the LM-head tangent (GPU, Triton).

For logits z [N, V] (bf16) and targets t, ``ce_loss_and_q`` returns, in two passes over each row,
loss = logsumexp(z) - z_t (float32) and q = softmax(z) - onehot(t) (in z's dtype), the matrix whose
product with the head weight gives the tangent of the loss (ce_tangent.token_ce_with_tangent). The
unfused torch version materialises float32 copies of z several times; this reads z twice and
writes q once.

``ce_grad_logits`` is the reverse pass of (loss, a) with respect to z, where a = dz . q is the
loss's tangent along the tangent logits dz: with p = softmax(z) and abar = p . dz,
d a / d z = p * (dz - abar) and d loss / d z = p - onehot(t). Two passes over each row of z and dz
(abar, then the gradient), written once in z's dtype.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover
    HAVE_TRITON = False

if HAVE_TRITON:

    @triton.jit
    def _ce_q_kernel(Z, T, LOSS, Q, V, stride_z, stride_q, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        z_row = Z + row * stride_z
        q_row = Q + row * stride_q
        t = tl.load(T + row)
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(z_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, z)
            s = s * tl.exp(m - m_new) + tl.exp(z - m_new)
            m = m_new
        mx = tl.max(m, 0)
        lse = mx + tl.log(tl.sum(s * tl.exp(m - mx), 0))
        zt = tl.load(z_row + t).to(tl.float32)
        tl.store(LOSS + row, lse - zt)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(z_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            q = tl.exp(z - lse) - tl.where(offs == t, 1.0, 0.0)
            tl.store(q_row + offs, q.to(Q.dtype.element_ty), mask=offs < V)

    @triton.jit
    def _ce_grad_kernel(
        Z, DZ, T, LSE, GA, GL, OUT, V, stride_z, stride_dz, stride_o, HAS_GL: tl.constexpr, BLOCK: tl.constexpr
    ):
        row = tl.program_id(0)
        z_row = Z + row * stride_z
        dz_row = DZ + row * stride_dz
        o_row = OUT + row * stride_o
        t = tl.load(T + row)
        lse = tl.load(LSE + row)
        ga = tl.load(GA + row)
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(z_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            dz = tl.load(dz_row + offs, mask=offs < V, other=0.0).to(tl.float32)
            acc += tl.exp(z - lse) * dz
        abar = tl.sum(acc, 0)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            z = tl.load(z_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
            dz = tl.load(dz_row + offs, mask=offs < V, other=0.0).to(tl.float32)
            p = tl.exp(z - lse)
            g = ga * p * (dz - abar)
            if HAS_GL:
                g += tl.load(GL + row) * (p - tl.where(offs == t, 1.0, 0.0))
            tl.store(o_row + offs, g.to(OUT.dtype.element_ty), mask=offs < V)


def ce_loss_and_q(z: torch.Tensor, targets: torch.Tensor, block: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss [N] float32, softmax(z) - onehot(targets) [N, V] in z's dtype)."""
    n, v = z.shape
    loss = torch.empty(n, dtype=torch.float32, device=z.device)
    q = torch.empty_like(z)
    if n:
        _ce_q_kernel[(n,)](z, targets, loss, q, v, z.stride(0), q.stride(0), BLOCK=block, num_warps=8)
    return loss, q


def usable(z: torch.Tensor) -> bool:
    return HAVE_TRITON and z.is_cuda and z.dtype in (torch.bfloat16, torch.float16)


def ce_grad_logits(
    z: torch.Tensor,
    dz: torch.Tensor,
    lse: torch.Tensor,
    targets: torch.Tensor,
    g_a: torch.Tensor,
    g_loss: torch.Tensor | None,
    block: int = 2048,
) -> torch.Tensor:
    """g_a * p * (dz - p . dz) + g_loss * (p - onehot(targets)) per row, p = exp(z - lse), in z's
    dtype (``lse``, ``g_a``, ``g_loss``: [N] float32; ``g_loss`` None: no loss term)."""
    n, v = z.shape
    out = torch.empty_like(z)
    if n:
        gl = g_loss if g_loss is not None else g_a  # not read without HAS_GL
        _ce_grad_kernel[(n,)](
            z,
            dz,
            targets,
            lse,
            g_a,
            gl,
            out,
            v,
            z.stride(0),
            dz.stride(0),
            out.stride(0),
            HAS_GL=g_loss is not None,
            BLOCK=block,
            num_warps=8,
        )
    return out
