"""Triton kernels for the elementwise parts of the fused decoder tail (dual_llama): RMSNorm, RoPE
and SwiGLU, each computing the primal AND the tangent in one pass that reads every input once.

They replace ``torch.compile`` of ``dual_llama._rmsnorm_dual`` / ``_rope_dual`` / ``_swiglu_dual``
on CUDA: a new process then pays no import of dynamo/inductor and no tracing before its first
batch, only Triton's compilation of three small kernels (four variants: RMSNorm with and
without a weight tangent), kept in Triton's cache folder, so paid once per machine. The arithmetic is that of the eager functions, rounding where they round:

- internal math in float32, with no fused multiply-adds (eager rounds a product before adding)
  and IEEE division for the means and the sigmoid;
- in bfloat16/float16 every eager op rounds its result to the input dtype (``w * n``, ``1 - sg``,
  ...), so the kernels round at the same points (``_rd``), including RMSNorm's explicit cast of
  n and dn before the weight multiplies. Elementwise results then agree with eager bit for bit up
  to the rounding of float32 ``exp``/``rsqrt`` and the order of RMSNorm's row sums, which flip
  the rounding of an intermediate (n, dn, the sigmoid) by one ulp on a few elements.
  (``torch.compile`` keeps intermediates in float32 instead, so it differs from eager on more.)
- bfloat16 rounding is done with integer ops (round to nearest even), the same on a GPU and in
  Triton's CPU interpreter (whose own float32 -> bfloat16 cast truncates); the tests run there.

Layouts: RMSNorm rows and SwiGLU rows may have any row stride (inputs whose rows are not evenly
strided, or whose last dim is strided, are copied by ``reshape``/``contiguous``); RoPE reads q,
k and their tangents through their four strides (the scorer passes ``transpose`` views of the
fused qkv projection) and cos/sin through broadcast strides ([1 or B, 1, L, D]). Outputs are
laid out as eager's: RMSNorm and SwiGLU contiguous, RoPE [B, L, H, D] in memory viewed as
[B, H, L, D].

``*_applies(*args)`` says whether a kernel serves the call (CUDA, Triton, one supported dtype,
supported shapes, no autograd recording); :class:`Dispatch` picks the kernel or a fallback.
``BRIDGE_DUAL_KERNELS=0`` turns the kernels off; ``=force`` also allows CPU tensors (Triton's
interpreter, ``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

import torch

try:  # Triton is optional: only the GPU fast path needs it
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except Exception:  # pragma: no cover - depends on the environment
    HAVE_TRITON = False

#: the dtypes the kernels take, and the rounding code each passes (RND: 0 none, 1 fp16, 2 bf16)
_RND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
#: the widest RMSNorm row one program holds in registers
MAX_HIDDEN = 16384
_SWIGLU_BLOCK = 1024
#: launch options: no fused multiply-add (each eager op rounds its product before the add)
_EXACT = {"enable_fp_fusion": False}

if HAVE_TRITON:

    @triton.jit
    def _rd(x, RND: tl.constexpr):
        """Round float32 ``x`` to the input dtype and back (what an eager op in that dtype does)."""
        if RND == 2:  # bfloat16, round to nearest even on the bits (NaN kept)
            bits = x.to(tl.uint32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
        elif RND == 1:
            return x.to(tl.float16).to(tl.float32)
        else:
            return x

    @triton.jit
    def _rmsnorm_dual_kernel(
        X,
        DX,
        W,
        DW,
        Y,
        DY,
        N,
        sx,
        sdx,
        sy,
        sdy,
        eps,
        HAS_DW: tl.constexpr,
        BLOCK: tl.constexpr,
        RND: tl.constexpr,
    ):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        ok = offs < N
        x = tl.load(X + row * sx + offs, mask=ok, other=0.0).to(tl.float32)
        dx = tl.load(DX + row * sdx + offs, mask=ok, other=0.0).to(tl.float32)
        r = tl.math.rsqrt(tl.math.div_rn(tl.sum(x * x, 0), N * 1.0) + eps)
        n = x * r
        dn = r * (dx - n * tl.math.div_rn(tl.sum(n * dx, 0), N * 1.0))
        n = _rd(n, RND)
        dn = _rd(dn, RND)
        w = tl.load(W + offs, mask=ok, other=0.0).to(tl.float32)
        y = _rd(w * n, RND)
        dy = _rd(w * dn, RND)
        if HAS_DW:
            dw = tl.load(DW + offs, mask=ok, other=0.0).to(tl.float32)
            dy = _rd(dy + _rd(dw * n, RND), RND)
        tl.store(Y + row * sy + offs, y.to(Y.dtype.element_ty), mask=ok)
        tl.store(DY + row * sdy + offs, dy.to(DY.dtype.element_ty), mask=ok)

    @triton.jit
    def _rope_heads(
        X, DX, OX, ODX, b, pos, sxb, sxh, sxl, sxd, sdb, sdh, sdl, sdd, sob, soh, sol, c1, c2, s1, s2, NH, HALF,
        HP: tl.constexpr, HALFP: tl.constexpr, RND: tl.constexpr,
    ):  # fmt: skip
        """x * cos + rotate_half(x) * sin for the NH heads of one token, for x and its tangent
        (the outputs share one layout, last stride 1)."""
        hs = tl.arange(0, HP)
        ds = tl.arange(0, HALFP)
        ok = (hs[:, None] < NH) & (ds[None, :] < HALF)
        px = X + b * sxb + pos * sxl + hs[:, None] * sxh + ds[None, :] * sxd
        pd = DX + b * sdb + pos * sdl + hs[:, None] * sdh + ds[None, :] * sdd
        po = b * sob + pos * sol + hs[:, None] * soh + ds[None, :]
        x1 = tl.load(px, mask=ok, other=0.0).to(tl.float32)
        x2 = tl.load(px + HALF * sxd, mask=ok, other=0.0).to(tl.float32)
        d1 = tl.load(pd, mask=ok, other=0.0).to(tl.float32)
        d2 = tl.load(pd + HALF * sdd, mask=ok, other=0.0).to(tl.float32)
        # rotate_half(x) = cat(-x2, x1): each product rounds, then the sum
        y1 = _rd(_rd(x1 * c1, RND) + _rd(-x2 * s1, RND), RND)
        y2 = _rd(_rd(x2 * c2, RND) + _rd(x1 * s2, RND), RND)
        e1 = _rd(_rd(d1 * c1, RND) + _rd(-d2 * s1, RND), RND)
        e2 = _rd(_rd(d2 * c2, RND) + _rd(d1 * s2, RND), RND)
        tl.store(OX + po, y1.to(OX.dtype.element_ty), mask=ok)
        tl.store(OX + po + HALF, y2.to(OX.dtype.element_ty), mask=ok)
        tl.store(ODX + po, e1.to(ODX.dtype.element_ty), mask=ok)
        tl.store(ODX + po + HALF, e2.to(ODX.dtype.element_ty), mask=ok)

    @triton.jit(do_not_specialize=["L"])
    def _rope_dual_kernel(
        Q, DQ, K, DK, C, S, OQ, ODQ, OK, ODK,
        sqb, sqh, sql, sqd, sdqb, sdqh, sdql, sdqd,
        skb, skh, skl, skd, sdkb, sdkh, sdkl, sdkd,
        scb, scl, scd, ssb, ssl, ssd,
        soqb, soqh, soql, sokb, sokh, sokl,
        L, H, HK, HALF,
        HP: tl.constexpr, HKP: tl.constexpr, HALFP: tl.constexpr, RND: tl.constexpr,
    ):  # fmt: skip
        """One program per token (b, l): cos/sin read once, then every q and k head."""
        t = tl.program_id(0).to(tl.int64)
        b = t // L
        pos = t % L
        ds = tl.arange(0, HALFP)
        dok = ds < HALF
        pc = C + b * scb + pos * scl + ds * scd
        ps = S + b * ssb + pos * ssl + ds * ssd
        c1 = tl.load(pc, mask=dok, other=0.0).to(tl.float32)[None, :]
        c2 = tl.load(pc + HALF * scd, mask=dok, other=0.0).to(tl.float32)[None, :]
        s1 = tl.load(ps, mask=dok, other=0.0).to(tl.float32)[None, :]
        s2 = tl.load(ps + HALF * ssd, mask=dok, other=0.0).to(tl.float32)[None, :]
        _rope_heads(
            Q, DQ, OQ, ODQ, b, pos, sqb, sqh, sql, sqd, sdqb, sdqh, sdql, sdqd, soqb, soqh, soql,
            c1, c2, s1, s2, H, HALF, HP, HALFP, RND,
        )  # fmt: skip
        _rope_heads(
            K, DK, OK, ODK, b, pos, skb, skh, skl, skd, sdkb, sdkh, sdkl, sdkd, sokb, sokh, sokl,
            c1, c2, s1, s2, HK, HALF, HKP, HALFP, RND,
        )  # fmt: skip

    @triton.jit
    def _swiglu_dual_kernel(GU, DGU, M, DM, NI, sg, sdg, sm, sdm, BLOCK: tl.constexpr, RND: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < NI
        g = tl.load(GU + row * sg + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(GU + row * sg + NI + cols, mask=ok, other=0.0).to(tl.float32)
        dg = tl.load(DGU + row * sdg + cols, mask=ok, other=0.0).to(tl.float32)
        du = tl.load(DGU + row * sdg + NI + cols, mask=ok, other=0.0).to(tl.float32)
        sig = _rd(tl.math.div_rn(1.0, 1.0 + tl.exp(-g)), RND)
        act = _rd(g * sig, RND)
        m = _rd(act * u, RND)
        slope = _rd(sig * _rd(1.0 + _rd(g * _rd(1.0 - sig, RND), RND), RND), RND)
        dm = _rd(_rd(_rd(slope * dg, RND) * u, RND) + _rd(act * du, RND), RND)
        tl.store(M + row * sm + cols, m.to(M.dtype.element_ty), mask=ok)
        tl.store(DM + row * sdm + cols, dm.to(DM.dtype.element_ty), mask=ok)


def _mode() -> str:
    return os.environ.get("BRIDGE_DUAL_KERNELS", "auto")


def _usable(*tensors: torch.Tensor) -> bool:
    """Triton on, every tensor on one CUDA device (any device with ``force``), one supported dtype,
    and no autograd graph to record (the kernels have no backward)."""
    mode = _mode()
    if mode == "0" or not HAVE_TRITON:
        return False
    first = tensors[0]
    if first.dtype not in _RND or (mode != "force" and not first.is_cuda):
        return False
    if any(t.dtype != first.dtype or t.device != first.device for t in tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def rmsnorm_applies(x, dx, w, dw, eps: float | None = None) -> bool:
    """Whether :func:`rmsnorm_dual` serves ``(x, dx, w, dw, eps)``."""
    tensors = [x, dx, w] + ([] if dw is None else [dw])
    if not all(isinstance(t, torch.Tensor) for t in tensors) or x.dim() == 0 or dx.shape != x.shape:
        return False
    n = x.shape[-1]
    shapes_ok = w.shape == (n,) and (dw is None or dw.shape == (n,)) and 0 < n <= MAX_HIDDEN
    return shapes_ok and _usable(*tensors)


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t`` as [rows, n] with unit column stride (a view where possible, else a copy)."""
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 or t2.shape[0] == 0 else t2.contiguous()


def rmsnorm_dual(x, dx, w, dw, eps: float):
    """LlamaRMSNorm (normalise in float32, cast back, scale) and its tangent: returns (y, dy),
    as ``dual_llama._rmsnorm_dual`` (``dw`` None: the weight has no tangent)."""
    n = x.shape[-1]
    x2, dx2 = _rows(x, n), _rows(dx, n)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dy = torch.empty_like(y)
    rows = x2.shape[0]
    if rows:
        w = w.detach().contiguous()
        dw_ = w if dw is None else dw.detach().contiguous()
        block = triton.next_power_of_2(n)
        warps = 4 if block <= 1024 else 8 if block <= 4096 else 16
        _rmsnorm_dual_kernel[(rows,)](
            x2, dx2, w, dw_, y, dy, n, x2.stride(0), dx2.stride(0), n, n, float(eps),
            HAS_DW=dw is not None, BLOCK=block, RND=_RND[x.dtype], num_warps=warps, **_EXACT,
        )  # fmt: skip
    return y, dy


def _rope_table(c: torch.Tensor, shape: tuple[int, int, int, int]) -> torch.Tensor | None:
    """cos or sin broadcast to [B, 1, L, D] (a view with zero strides), or None if it does not
    broadcast so (a per-head table, say)."""
    try:
        if torch.broadcast_shapes(c.shape, shape) != torch.Size(shape):
            return None
    except RuntimeError:
        return None
    return c.expand(shape)


def rope_applies(q, dq, k, dk, cos, sin) -> bool:
    """Whether :func:`rope_dual` serves ``(q, dq, k, dk, cos, sin)``: q, dq [B, H, L, D], k, dk
    [B, H_kv, L, D], cos/sin broadcasting to [B, 1, L, D], D even."""
    tensors = [q, dq, k, dk, cos, sin]
    if not all(isinstance(t, torch.Tensor) for t in tensors) or q.dim() != 4 or k.dim() != 4:
        return False
    B, _, L, D = q.shape
    shapes_ok = (
        dq.shape == q.shape
        and dk.shape == k.shape
        and (k.shape[0], k.shape[2], k.shape[3]) == (B, L, D)
        and D % 2 == 0
        and D > 0
        and _rope_table(cos, (B, 1, L, D)) is not None
        and _rope_table(sin, (B, 1, L, D)) is not None
    )
    return shapes_ok and _usable(*tensors)


def _bhld(like: torch.Tensor) -> torch.Tensor:
    """An empty [B, H, L, D] tensor laid out [B, L, H, D] in memory (eager's layout here)."""
    B, H, L, D = like.shape
    return torch.empty(B, L, H, D, dtype=like.dtype, device=like.device).transpose(1, 2)


def rope_dual(q, dq, k, dk, cos, sin):
    """RoPE of q, k and of their tangents: returns (q', dq', k', dk') as ``dual_llama._rope_dual``."""
    B, H, L, D = q.shape
    hk = k.shape[1]
    c = _rope_table(cos, (B, 1, L, D))
    s = _rope_table(sin, (B, 1, L, D))
    assert c is not None and s is not None, "cos/sin must broadcast to [B, 1, L, D]"
    oq, odq, ok, odk = _bhld(q), _bhld(q), _bhld(k), _bhld(k)
    if B * L and (H or hk):
        half = D // 2
        _rope_dual_kernel[(B * L,)](
            q, dq, k, dk, c, s, oq, odq, ok, odk,
            *q.stride(), *dq.stride(), *k.stride(), *dk.stride(),
            c.stride(0), c.stride(2), c.stride(3), s.stride(0), s.stride(2), s.stride(3),
            *oq.stride()[:3], *ok.stride()[:3],
            L, H, hk, half,
            HP=triton.next_power_of_2(max(H, 1)), HKP=triton.next_power_of_2(max(hk, 1)),
            HALFP=triton.next_power_of_2(half), RND=_RND[q.dtype], num_warps=4, **_EXACT,
        )  # fmt: skip
    return oq, odq, ok, odk


def swiglu_applies(gu, dgu) -> bool:
    """Whether :func:`swiglu_dual` serves ``(gu, dgu)``: one shape [..., 2 I]."""
    if not (isinstance(gu, torch.Tensor) and isinstance(dgu, torch.Tensor)) or gu.dim() == 0:
        return False
    return dgu.shape == gu.shape and gu.shape[-1] % 2 == 0 and _usable(gu, dgu)


def swiglu_dual(gu, dgu):
    """silu(g) * u and its tangent from the fused gate|up projection [..., 2 I] and its tangent:
    returns (m, dm) [..., I] as ``dual_llama._swiglu_dual``."""
    two_i = gu.shape[-1]
    i = two_i // 2
    gu2, dgu2 = _rows(gu, two_i), _rows(dgu, two_i)
    m = torch.empty(*gu.shape[:-1], i, dtype=gu.dtype, device=gu.device)
    dm = torch.empty_like(m)
    rows = gu2.shape[0]
    if rows and i:
        grid = (rows, triton.cdiv(i, _SWIGLU_BLOCK))
        _swiglu_dual_kernel[grid](
            gu2, dgu2, m, dm, i, gu2.stride(0), dgu2.stride(0), i, i,
            BLOCK=_SWIGLU_BLOCK, RND=_RND[gu.dtype], num_warps=4, **_EXACT,
        )  # fmt: skip
    return m, dm


class Dispatch:
    """``kernel(*args)`` where ``applies(*args)``, else ``fallback(*args)`` (the compiled or eager
    function), so that a call the kernels do not serve (CPU, float64, autograd) keeps its path."""

    def __init__(self, kernel: Callable[..., Any], applies: Callable[..., bool], fallback: Callable[..., Any]):
        self.kernel = kernel
        self.applies = applies
        self.fallback = fallback
        self.__doc__ = getattr(fallback, "__doc__", None)

    failed = False

    def __call__(self, *args):
        if not self.failed and self.applies(*args):
            try:
                return self.kernel(*args)
            except Exception as exc:  # pragma: no cover - a Triton that cannot build the kernel
                self.failed = True
                warnings.warn(f"the Triton kernel {self.kernel.__name__} failed ({exc}); using torch instead")
        return self.fallback(*args)
