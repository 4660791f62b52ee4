"""Forward-mode AD for causal attention on fused kernels (GPU).

PyTorch has no forward-AD rule for its fused SDPA kernels, so under ``torch.func.jvp`` attention
falls back to explicit math that materialises L x L. This module gives attention a JVP rule built
from two fused pieces:

- primal: FlashAttention through ``torch.ops.aten._scaled_dot_product_flash_attention``, which
  also returns the row log-sum-exp (LSE);
- tangent: one Triton kernel. With S = s Q K^T, P = exp(S - LSE) and dS = s (dQ K^T + Q dK^T),

      dO = (P o dS) V + P dV - rowsum(P o dS) * O

  Because the LSE is known, P is exact block by block: no online rescaling is needed. The kernel
  does five block matmuls per (query block, key block) pair, about 2.5x the primal's two.

Right-padded causal batches need no mask (a valid query never sees a later pad). GQA is handled
by indexing the key/value head in the kernel. The kernel also runs in Triton's CPU interpreter
(``TRITON_INTERPRET=1``), which the tests use when Triton is installed.

It works on ``torch.autograd.forward_ad`` dual tensors: the attention function unpacks the
primal and tangent of q, k, v, computes both with fused kernels and packs the result again.
"""

from __future__ import annotations

import inspect
import os

import torch
import torch.autograd.forward_ad as fwAD

try:  # Triton is optional: only the GPU fast path needs it
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_TRITON = False


#: the tangent kernel's block configurations, (BLOCK_M, BLOCK_N, num_warps, num_stages), among which
#: the autotuner chooses
CANDIDATES = ((64, 64, 4, 2), (64, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3), (32, 32, 4, 2))


def candidate_configs(head_dim: int) -> list[tuple[int, int, int, int]]:
    """The candidates that fit a head dimension (a 128-row query block does not above 128)."""
    fits = [c for c in CANDIDATES if head_dim <= 128 or c[0] <= 64]
    return fits or [CANDIDATES[0]]


#: the candidate measured fastest, per GPU architecture (compute capability major), head dimension and
#: context bucket (the next power of two of the padded length): ``bench/score/kernel_compile.py
#: --sweep`` on an H100 (``bench/score/results/kernel_compile_h100.json``; head dim 64 from the 1B
#: shape's 4 kv groups, which the 135M shape's 3 agree with to 2% or better, 128 from the 3B shape's 3).
#: Where a key is listed the kernel runs that configuration without autotuning: autotuning compiles
#: all five candidates and times them on the first batch of a new machine, seconds of its first
#: window (docs/benchmarks.md). Elsewhere (other GPUs, other head dims) it autotunes;
#: ``BRIDGE_ATTN_AUTOTUNE=1`` forces that.
PINNED: dict[int, dict[int, dict[int, tuple[int, int, int, int]]]] = {
    9: {
        64: {64: (64, 32, 4, 3), 128: (64, 32, 4, 3), 256: (64, 32, 4, 3), 512: (64, 32, 4, 3),
             1024: (64, 32, 4, 3), 2048: (128, 32, 8, 3), 4096: (128, 32, 8, 3)},
        128: {64: (32, 32, 4, 2), 128: (32, 32, 4, 2), 256: (128, 32, 8, 3), 512: (128, 64, 8, 2),
              1024: (128, 64, 8, 2), 2048: (128, 64, 8, 2), 4096: (128, 64, 8, 2)},
    },
}  # fmt: skip


def pinned_config(device: torch.device, head_dim: int, bucket: int) -> tuple[int, int, int, int] | None:
    """The measured configuration for this GPU's architecture, head dim and context bucket (the
    largest listed bucket above it), or None to autotune."""
    if os.environ.get("BRIDGE_ATTN_AUTOTUNE", "0") == "1" or device.type != "cuda":
        return None
    by_bucket = PINNED.get(torch.cuda.get_device_capability(device)[0], {}).get(head_dim)
    if not by_bucket:
        return None
    fits = [b for b in sorted(by_bucket) if b >= bucket]
    return by_bucket[fits[0] if fits else max(by_bucket)]


if HAVE_TRITON:
    _CONFIGS = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st) for bm, bn, w, st in CANDIDATES
    ]

    def _prune(configs, named_args, **kwargs):
        d = named_args.get("HEAD_DIM", kwargs.get("HEAD_DIM", 64))
        fits = [c for c in configs if d <= 128 or c.kwargs["BLOCK_M"] <= 64]
        return fits or configs[:1]

    # the context length and the LSE's strides (multiples of it) vary batch by batch: not specialised
    # on (Triton would compile a second variant for lengths that are multiples of 16).
    # One kernel, long on purpose: its body is one loop over key blocks (five block matmuls each),
    # which Triton helpers would only split across calls; its arguments are grouped per tensor by
    # hand (fmt: off) rather than one a line.
    # fmt: off
    @triton.jit(do_not_specialize=["N_CTX", "slb", "slh"])
    def _attn_jvp_kernel(
        Q, K, V, DQ, DK, DV, O, LSE, DO,
        sqb, sqh, sqm, sqd,  # the strides of each tensor: batch, head, position, head dimension
        skb, skh, skn, skd,
        svb, svh, svn, svd,
        sdqb, sdqh, sdqm, sdqd,
        sdkb, sdkh, sdkn, sdkd,
        sdvb, sdvh, sdvn, sdvd,
        sob, soh, som, sod,
        slb, slh, slm,  # the LSE's: batch, head, position
        sdob, sdoh, sdom, sdod,
        H, GROUPS, N_CTX, CTX_BUCKET, sm_scale,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
        PRECISION: tl.constexpr,
    ):
        start_m = tl.program_id(0)
        off_bh = tl.program_id(1)
        b = off_bh // H
        h = off_bh % H
        hk = h // GROUPS
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, HEAD_DIM)
        m_ok = offs_m < N_CTX
        q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                    mask=m_ok[:, None], other=0.0)
        dq = tl.load(DQ + b * sdqb + h * sdqh + offs_m[:, None] * sdqm + offs_d[None, :] * sdqd,
                     mask=m_ok[:, None], other=0.0)
        lse = tl.load(LSE + b * slb + h * slh + offs_m * slm, mask=m_ok, other=0.0)
        g = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        mu = tl.zeros([BLOCK_M], dtype=tl.float32)
        if CAUSAL:
            hi = tl.minimum((start_m + 1) * BLOCK_M, N_CTX)
        else:
            hi = N_CTX
        for start_n in range(0, hi, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            n_ok = offs_n < N_CTX
            k = tl.load(K + b * skb + hk * skh + offs_n[:, None] * skn + offs_d[None, :] * skd,
                        mask=n_ok[:, None], other=0.0)
            dk = tl.load(DK + b * sdkb + hk * sdkh + offs_n[:, None] * sdkn + offs_d[None, :] * sdkd,
                         mask=n_ok[:, None], other=0.0)
            v = tl.load(V + b * svb + hk * svh + offs_n[:, None] * svn + offs_d[None, :] * svd,
                        mask=n_ok[:, None], other=0.0)
            dv = tl.load(DV + b * sdvb + hk * sdvh + offs_n[:, None] * sdvn + offs_d[None, :] * sdvd,
                         mask=n_ok[:, None], other=0.0)
            kt = tl.trans(k)
            s = tl.dot(q, kt, input_precision=PRECISION) * sm_scale
            ds = (
                tl.dot(dq, kt, input_precision=PRECISION) + tl.dot(q, tl.trans(dk), input_precision=PRECISION)
            ) * sm_scale
            p = tl.exp(s - lse[:, None])
            keep = n_ok[None, :] & m_ok[:, None]
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
            pds = p * ds
            mu += tl.sum(pds, 1)
            g += tl.dot(pds.to(v.dtype), v, input_precision=PRECISION)
            g += tl.dot(p.to(dv.dtype), dv, input_precision=PRECISION)
        o = tl.load(O + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod,
                    mask=m_ok[:, None], other=0.0)
        do = g - mu[:, None] * o.to(tl.float32)
        tl.store(
            DO + b * sdob + h * sdoh + offs_m[:, None] * sdom + offs_d[None, :] * sdod,
            do.to(DO.dtype.element_ty),
            mask=m_ok[:, None],
        )

    # fmt: on

    # Triton >= 3.4 keeps the timings on disk (its cache folder): later processes skip the tuning
    _cache = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
    _attn_jvp_tuned = triton.autotune(
        _CONFIGS, key=["CTX_BUCKET", "HEAD_DIM", "GROUPS"], prune_configs_by={"early_config_prune": _prune}, **_cache
    )(_attn_jvp_kernel)


def attention_tangent(
    q,
    k,
    v,
    dq,
    dk,
    dv,
    o,
    lse,
    scale: float,
    causal: bool = True,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
) -> torch.Tensor:
    """dO for O = softmax(scale q k^T [+ causal]) v, given O and its row LSE (natural log).
    Shapes: q, dq, o [B, H, L, D]; k, v, dk, dv [B, H_kv, L, D]; lse [B, H, L] float32.
    Block sizes are autotuned on a GPU unless given (``num_warps``/``num_stages`` go with them)."""
    if not HAVE_TRITON:
        raise RuntimeError("the fused attention JVP needs Triton")
    B, H, L, D = q.shape
    h_kv = k.shape[1]
    do = torch.empty_like(q)
    args = (
        q,
        k,
        v,
        dq,
        dk,
        dv,
        o,
        lse,
        do,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *dq.stride(),
        *dk.stride(),
        *dv.stride(),
        *o.stride(),
        *lse.stride(),
        *do.stride(),
        H,
        H // h_kv,
        L,
        triton.next_power_of_2(L),
        scale,
    )
    precision = (
        "tf32" if (q.dtype != torch.float32 or (q.is_cuda and torch.backends.cuda.matmul.allow_tf32)) else "ieee"
    )
    if block_m is None and q.is_cuda:
        pinned = pinned_config(q.device, D, triton.next_power_of_2(L))
        if pinned is not None:
            block_m, block_n, num_warps, num_stages = pinned
    if block_m is None and q.is_cuda:
        tuned_grid = lambda meta: (triton.cdiv(L, meta["BLOCK_M"]), B * H)  # noqa: E731
        _attn_jvp_tuned[tuned_grid](*args, HEAD_DIM=D, CAUSAL=causal, PRECISION=precision)
        return do
    block_m = block_m or 64
    block_n = block_n or 64
    grid = (triton.cdiv(L, block_m), B * H)
    launch = {"num_warps": num_warps} | ({} if num_stages is None else {"num_stages": num_stages})
    _attn_jvp_kernel[grid](
        *args, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=D, CAUSAL=causal, PRECISION=precision, **launch
    )
    return do


def _expand_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def attention_with_lse(q, k, v, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention output [B, H, L, D] and LSE [B, H, L] (float32)."""
    groups = q.shape[1] // k.shape[1]
    k, v = _expand_kv(k, groups), _expand_kv(v, groups)
    if q.is_cuda and q.dtype in (torch.float16, torch.bfloat16):
        out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
        return out[0], out[1]
    if q.is_cuda and q.dtype == torch.float32:  # memory-efficient kernel: float32 with LSE
        out = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True, scale=scale)
        return out[0], out[1][..., : q.shape[-2]]
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    L = q.shape[-2]
    s = s.masked_fill(~torch.ones(L, L, dtype=torch.bool, device=q.device).tril(), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.matmul(torch.exp(s - lse[..., None]), v.float()).to(q.dtype)
    return o, lse


def routing_rows(q, k, lse, scale: float, query_start: int, head_chunk: int = 4) -> torch.Tensor:
    """Head-averaged causal attention probabilities of query rows ``query_start:`` [B, Lq', L]
    (float32), recomputed exactly from the LSE, a few heads at a time."""
    B, H, L, _ = q.shape
    groups = H // k.shape[1]
    qs = q[:, :, query_start:]
    lq = qs.shape[2]
    causal = torch.arange(query_start, L, device=q.device)[:, None] >= torch.arange(L, device=q.device)[None, :]
    acc = torch.zeros(B, lq, L, dtype=torch.float32, device=q.device)
    for h0 in range(0, H, head_chunk):
        h1 = min(H, h0 + head_chunk)
        kh = _expand_kv(k, groups)[:, h0:h1]
        s = torch.matmul(qs[:, h0:h1], kh.transpose(-1, -2)).float() * scale
        p = torch.exp(s - lse[:, h0:h1, query_start:, None]).masked_fill(~causal, 0.0)
        acc += p.sum(dim=1)
    return acc / H


def dual_causal_attention(query, key, value, scale: float, capture=None) -> torch.Tensor:
    """Causal attention on forward-AD dual tensors (``torch.autograd.forward_ad``): the primal by
    FlashAttention, the tangent by the Triton kernel. ``capture(q, k, lse)`` receives primal
    tensors (for the routing rows). Returns [B, H, L, D], dual when any input carries a tangent."""
    q, dq = fwAD.unpack_dual(query)
    k, dk = fwAD.unpack_dual(key)
    v, dv = fwAD.unpack_dual(value)
    o, lse = attention_with_lse(q, k, v, scale)
    if capture is not None:
        capture(q, k, lse)
    if dq is None and dk is None and dv is None:
        return o
    dq = torch.zeros_like(q) if dq is None else dq
    dk = torch.zeros_like(k) if dk is None else dk
    dv = torch.zeros_like(v) if dv is None else dv
    return fwAD.make_dual(o, attention_tangent(q, k, v, dq, dk, dv, o, lse, scale))


def supported(module, query: torch.Tensor, kwargs: dict) -> bool:
    """Whether the fused path applies: CUDA, plain causal attention.
    ``BRIDGE_FUSED_ATTENTION=0`` turns it off; ``=force`` also allows CPU tensors (with
    ``TRITON_INTERPRET=1``, for tests)."""
    mode = os.environ.get("BRIDGE_FUSED_ATTENTION", "auto")
    if mode == "0" or not HAVE_TRITON:
        return False
    d = query.shape[-1]
    plain = (
        kwargs.get("softcap") is None
        and getattr(module, "sliding_window", None) is None
        and d in (16, 32, 64, 128, 256)
        and not getattr(module, "is_cross_attention", False)
    )
    if mode == "force":
        return plain
    return plain and query.is_cuda and query.dtype in (torch.float16, torch.bfloat16, torch.float32)
