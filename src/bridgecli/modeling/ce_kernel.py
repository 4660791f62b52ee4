"""Fused softmax cross-entropy pieces for the LM-head tangent (GPU, Triton).

For logits z [N, V] (bf16) and targets t it returns, in two passes over each row,
loss = logsumexp(z) - z_t (float32) and q = softmax(z) - onehot(t) (in z's dtype), the matrix whose
product with the head weight gives the tangent of the loss (scoring.token_ce_with_tangent). The
unfused torch version materialises float32 copies of z several times; this reads z twice and
writes q once.
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
