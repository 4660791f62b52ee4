"""A hand-written primal + tangent pass through Llama-family tail blocks (Llama, Qwen2, Mistral
without sliding windows, SmolLM2): the fast path of the scoring JVP.

Forward-mode AD through the HF modules works for every architecture (scoring.py), but it runs each
op's JVP formula separately. Here every quantity is carried as a (primal, tangent) pair and the
expensive parts are fused:

- a linear layer's tangent ``dy = x dW^T + dx W^T`` is ONE matmul, ``[x, dx] @ [dW, W]^T``, with
  the concatenated weight built once; q/k/v and gate/up share one matmul each;
- RMSNorm's tangent is written out (``dn = r (dx - n mean(n dx))`` with n = x r); on CUDA the
  RMSNorm, RoPE and SwiGLU pairs run as one Triton kernel each (dual_kernels.py: no torch.compile,
  so a process pays no dynamo tracing), elsewhere through torch.compile or eagerly;
- attention uses FlashAttention for the primal and the Triton kernel of jvp_attention for the
  tangent (explicit math on CPU);
- the final norm and the LM head on response rows only (token_ce_with_tangent).

``tests/test_dual_llama.py`` checks it against the generic forward-AD path in float64.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch._dynamo.config as _dynamo_config
import torch.fx.experimental._config as _fx_config
import torch.nn.functional as F

from . import dual_kernels, jvp_attention

FAMILIES = ("llama", "mistral", "qwen2")


def supported(model, blocks) -> bool:
    cfg = model.config
    if getattr(cfg, "model_type", None) not in FAMILIES or getattr(cfg, "hidden_act", None) != "silu":
        return False
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return False
    blk = blocks[-1]
    needed = ["input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"]
    return all(_has(blk, n) for n in needed) and not _has(blk, "self_attn.q_norm")


def _has(mod, dotted: str) -> bool:
    for part in dotted.split("."):
        mod = getattr(mod, part, None)
        if mod is None:
            return False
    return True


def _shape_config(size_oblivious: bool) -> dict:
    """Dynamo's shape settings while compiling, where this torch has them: no duck sizing (two dims
    equal in the first batch would share one symbol), and with ``size_oblivious`` no specialisation
    of dims of size 1 (a batch of one example would compile again; this also stops broadcasting
    over a dynamic dim, so only functions that broadcast none use it)."""
    want = {"use_duck_shape": False, "backed_size_oblivious": size_oblivious}
    return {k: v for k, v in want.items() if hasattr(_fx_config, k)}


#: dynamo's settings while compiling, where this torch has them: a float argument (an RMSNorm's eps,
#: attention's scale) is a constant of the graph, not a graph input. Unspecialised, it came in as a
#: 0-d float64 CPU tensor, and inductor wrote a C++ kernel to read it: every process then checked the
#: host's vector ISA by compiling test programs with the system compiler, under a file lock (most of
#: the atp fast path's first batch, later runs included; docs/benchmarks.md's changelog). The floats
#: are fixed per model, so specialising them compiles nothing more.
_DYNAMO_CONFIG = {k: v for k, v in {"specialize_float": True}.items() if hasattr(_dynamo_config, k)}


class _Compiled:
    """Run ``fn`` through ``torch.compile`` on CUDA tensors (fusing its elementwise ops), falling
    back to eager if compilation fails; ``BRIDGE_COMPILE=0`` turns it off.

    One compiled graph serves every batch shape. What made dynamo compile again, batch after batch
    (`TORCH_LOGS=recompiles`, bench/score/e2e.py), and what avoids it:
    - a weight passed once as an ``nn.Parameter`` and once as a plain tensor (a type guard):
      parameters are passed as plain tensors (``detach``; no gradient flows to a weight here);
    - duck sizing, and the specialisation of dims of size 1 (a batch of one example): both off
      while compiling (``_shape_config``); RoPE broadcasts cos/sin over the heads, so it keeps
      the size-1 rule and compiles once more for a batch of one example;
    - float arguments are specialised (``_DYNAMO_CONFIG``), so no graph has a CPU input.
    """

    #: where to compile (a test compiles on CPU with the "eager" backend to count recompiles)
    device_types: tuple[str, ...] = ("cuda",)
    backend = "inductor"

    def __init__(self, fn, size_oblivious: bool = True):
        self.fn = fn
        self.shape_config = _shape_config(size_oblivious)
        self.compiled = None
        self.failed = False
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        on = args[0].device.type in self.device_types and os.environ.get("BRIDGE_COMPILE", "1") != "0"
        if on and not self.failed:
            try:
                if self.compiled is None:
                    self.compiled = torch.compile(self.fn, dynamic=True, backend=self.backend)
                plain = tuple(a.detach() if isinstance(a, torch.nn.Parameter) else a for a in args)
                with _fx_config.patch(**self.shape_config), _dynamo_config.patch(**_DYNAMO_CONFIG):
                    return self.compiled(*plain)
            except Exception as exc:  # pragma: no cover - depends on the toolchain
                self.failed = True
                warnings.warn(f"torch.compile failed for {self.fn.__name__} ({exc}); running eagerly")
        return self.fn(*args)


def _rmsnorm_dual(x, dx, w, dw, eps: float):
    """LlamaRMSNorm (normalise in float32, cast back, scale) and its tangent."""
    xf, dxf = x.float(), dx.float()
    r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    n = xf * r
    dn = r * (dxf - n * (n * dxf).mean(-1, keepdim=True))
    n, dn = n.to(x.dtype), dn.to(x.dtype)
    y = w * n
    dy = w * dn if dw is None else w * dn + dw * n
    return y, dy


rmsnorm_dual = dual_kernels.Dispatch(dual_kernels.rmsnorm_dual, dual_kernels.rmsnorm_applies, _Compiled(_rmsnorm_dual))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(x, cos, sin):
    return x * cos + _rotate_half(x) * sin


def _rope_dual(q, dq, k, dk, cos, sin):
    return _rope(q, cos, sin), _rope(dq, cos, sin), _rope(k, cos, sin), _rope(dk, cos, sin)


def _swiglu_dual(gu, dgu):
    """silu(g) * u and its tangent, from the fused gate|up projection and its tangent."""
    g, u = gu.chunk(2, -1)
    dg, du = dgu.chunk(2, -1)
    sg = torch.sigmoid(g)
    act = g * sg
    return act * u, (sg * (1 + g * (1 - sg))) * dg * u + act * du


rope_dual = dual_kernels.Dispatch(
    dual_kernels.rope_dual, dual_kernels.rope_applies, _Compiled(_rope_dual, size_oblivious=False)
)
swiglu_dual = dual_kernels.Dispatch(dual_kernels.swiglu_dual, dual_kernels.swiglu_applies, _Compiled(_swiglu_dual))


def attention_dual_math(q, k, v, dq, dk, dv, scale):
    """Causal attention, its tangent, and the row LSE, with explicit math (CPU / reference)."""
    groups = q.shape[1] // k.shape[1]
    k, v, dk, dv = (jvp_attention._expand_kv(t, groups) for t in (k, v, dk, dv))
    L = q.shape[-2]
    causal = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    s = (q @ k.transpose(-1, -2)).float() * scale
    s = s.masked_fill(~causal, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    ds = ((dq @ k.transpose(-1, -2)).float() + (q @ dk.transpose(-1, -2)).float()) * scale
    pds = (p * ds).masked_fill(~causal, 0.0)
    o = p.to(v.dtype) @ v
    do = pds.to(v.dtype) @ v + p.to(dv.dtype) @ dv - pds.sum(-1, keepdim=True).to(o.dtype) * o
    return o, do, lse


class DualBlock:
    """One decoder block as (primal, tangent) arithmetic, weights prepared once."""

    def __init__(self, block, primal: dict[str, torch.Tensor], tangent: dict[str, torch.Tensor]):
        attn = block.self_attn
        self.heads = attn.config.num_attention_heads
        self.kv_heads = attn.config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scale = attn.scaling
        self.eps1 = block.input_layernorm.variance_epsilon
        self.eps2 = block.post_attention_layernorm.variance_epsilon

        def p(name):
            return primal[name]

        def t(name):
            return tangent.get(name)

        def pair(prefix):
            w = p(f"{prefix}.weight")
            dw = t(f"{prefix}.weight")
            dw = torch.zeros_like(w) if dw is None else dw
            bias = primal.get(f"{prefix}.bias")
            dbias = tangent.get(f"{prefix}.bias") if bias is not None else None
            return w, dw, bias, dbias

        def fused(prefixes):
            ws, dws, bs, dbs = zip(*(pair(x) for x in prefixes))
            w = torch.cat(ws, 0)
            wcat = torch.cat([torch.cat([dw, w_], 1) for dw, w_ in zip(dws, ws)], 0)  # multiplies [x, dx]
            b = torch.cat(bs, 0) if bs[0] is not None else None
            db = (
                torch.cat([d if d is not None else torch.zeros_like(b_) for d, b_ in zip(dbs, bs)], 0)
                if b is not None
                else None
            )
            return w, wcat, b, db

        self.qkv = fused(["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])
        self.o = fused(["self_attn.o_proj"])
        self.gate_up = fused(["mlp.gate_proj", "mlp.up_proj"])
        self.down = fused(["mlp.down_proj"])
        self.ln1 = (p("input_layernorm.weight"), t("input_layernorm.weight"))
        self.ln2 = (p("post_attention_layernorm.weight"), t("post_attention_layernorm.weight"))
        self.q_size = self.heads * self.head_dim
        self.kv_size = self.kv_heads * self.head_dim

    @staticmethod
    def _linear(x, dx, fused):
        w, wcat, b, db = fused
        y = F.linear(x, w, b)
        dy = F.linear(torch.cat([x, dx], -1), wcat, db)
        return y, dy

    def __call__(self, h, dh, cos, sin, capture=None):
        B, L, _ = h.shape
        x, dx = rmsnorm_dual(h, dh, *self.ln1, self.eps1)
        qkv, dqkv = self._linear(x, dx, self.qkv)
        sizes = [self.q_size, self.kv_size, self.kv_size]
        q, k, v = qkv.split(sizes, -1)
        dq, dk, dv = dqkv.split(sizes, -1)

        def heads(t, n):
            return t.view(B, L, n, self.head_dim).transpose(1, 2)

        q, dq = heads(q, self.heads), heads(dq, self.heads)
        k, dk = heads(k, self.kv_heads), heads(dk, self.kv_heads)
        v, dv = heads(v, self.kv_heads), heads(dv, self.kv_heads)
        q, dq, k, dk = rope_dual(q, dq, k, dk, cos.unsqueeze(1), sin.unsqueeze(1))
        if q.is_cuda and jvp_attention.HAVE_TRITON:
            o, lse = jvp_attention.attention_with_lse(q, k, v, self.scale)
            do = jvp_attention.attention_tangent(q, k, v, dq, dk, dv, o, lse, self.scale)
        else:
            o, do, lse = attention_dual_math(q, k, v, dq, dk, dv, self.scale)
        if capture is not None:
            capture(q, k, lse, self.scale)
        return self.after_attention(h, dh, o, do)

    def after_attention(self, h, dh, o, do, rmsnorm=None, swiglu=None):
        """The block from its attention output (o, do [B, H, L, D]) on: the output projection, the
        residual, the MLP half. ``rmsnorm``/``swiglu``: the pair functions (default this module's;
        gated_llama passes ones autograd differentiates)."""
        rmsnorm = rmsnorm or rmsnorm_dual
        swiglu = swiglu or swiglu_dual
        B, L, _ = h.shape
        o = o.transpose(1, 2).reshape(B, L, self.q_size)
        do = do.transpose(1, 2).reshape(B, L, self.q_size)
        a, da = self._linear(o, do, self.o)
        h, dh = h + a, dh + da
        x, dx = rmsnorm(h, dh, *self.ln2, self.eps2)
        gu, dgu = self._linear(x, dx, self.gate_up)
        m, dm = swiglu(gu, dgu)
        y, dy = self._linear(m, dm, self.down)
        return h + y, dh + dy


class DualLlamaTail:
    """The tail blocks, the final norm and the LM head, in (primal, tangent) form."""

    def __init__(self, blocks, indices, primals, tangents, norm):
        self.indices = list(indices)
        self.blocks = [DualBlock(blocks[i], primals[i], tangents[i]) for i in self.indices]
        self.norm_w = norm.weight
        self.norm_eps = norm.variance_epsilon

    def run(self, hidden, calls, capture_layers, on_rows):
        """Returns the final-normed hidden states and their tangent. ``on_rows(q, k, lse, scale)``
        is called for the blocks in ``capture_layers``."""
        h, dh = hidden, torch.zeros_like(hidden)
        for i, blk, call in zip(self.indices, self.blocks, calls):
            cos, sin = call.kwargs["position_embeddings"]
            h, dh = blk(h, dh, cos.to(h.dtype), sin.to(h.dtype), on_rows if i in capture_layers else None)
        return rmsnorm_dual(h, dh, self.norm_w.to(h.dtype), None, self.norm_eps)
