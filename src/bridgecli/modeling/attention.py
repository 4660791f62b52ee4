"""An attention implementation for scoring: fused SDPA where no tangent flows, explicit math where
forward-mode AD must pass (the tail blocks), and capture of the response-query attention rows of
the routing layers only (never the full L x L maps of every layer).

It is registered with transformers' AttentionInterface as ``"bridge"``; :func:`routing` activates
capture for one forward pass.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.autograd.forward_ad as fwAD

from . import jvp_attention

IMPLEMENTATION = "bridge"


@dataclass
class Routing:
    """What to do in one forward pass. ``math_layers`` run an attention with a forward-AD rule
    (fused kernels where supported, else explicit math); ``capture_layers`` record the
    head-averaged attention rows of query positions ``query_start:`` into ``rows`` (summed over the
    captured layers)."""

    math_layers: frozenset[int]
    capture_layers: frozenset[int]
    query_start: int = 0
    #: batches are right-padded and causal: a valid query never sees a pad, so the fused
    #: causal kernels may ignore the padding mask
    right_padded: bool = False
    rows: torch.Tensor | None = None
    captured: int = 0

    def add(self, rows: torch.Tensor) -> None:
        """Accumulate one layer's head-averaged rows."""
        self.rows = rows if self.rows is None else self.rows + rows
        self.captured += 1


_active: Routing | None = None


@contextlib.contextmanager
def routing(r: Routing) -> Iterator[Routing]:
    global _active
    prev, _active = _active, r
    try:
        yield r
    finally:
        _active = prev


_hidden: torch.Tensor | None = None


@contextlib.contextmanager
def hidden_keys(mask: torch.Tensor) -> Iterator[None]:
    """While active, hide the keys where ``mask`` ([B, L] bool, True = hidden) is set from every
    query at every layer, positions unchanged (``bridge analyze``'s exact perturbation scores). It
    applies on the SDPA and the math paths and turns the fused path off."""
    global _hidden
    prev, _hidden = _hidden, mask
    try:
        yield
    finally:
        _hidden = prev


_gate: dict | None = None
_gate_plain: dict | None = None
_gate_log: torch.Tensor | None = None
_gate_recompute = False


@contextlib.contextmanager
def key_gate(
    biases: dict, plain: dict | None = None, log_gate: torch.Tensor | None = None, recompute: bool = False
) -> Iterator[None]:
    """While active, every layer ``l`` in ``biases`` runs explicit-math attention with a per-key
    logit bias ``biases[l]`` ([B, L], zero in value where differentiated, requiring grad) added as
    ``s_qk + b_k / (1 - p_qk)`` (p the unbiased probabilities, not differentiated). The gradient of
    any function M with respect to ``b_i`` is then ``sum_{h, q} dM/ds_qi / (1 - p_qi)``: minus the
    first-order change of M when key i is hidden from every query of that layer, with the softmax
    change of hiding taken exactly (AtP*'s key fix, Kramar et al. 2024). See attribution.py.

    ``log_gate`` ([B, L], no grad, <= 0) moves the state first: every gated layer adds ``log g_k`` to
    its scores (g = 1 kept, g -> 0 hidden), and p above is then the gated state's. ``plain`` (per layer,
    like ``biases``) adds ``b_k`` itself, so that its gradient is ``sum_{h, q} dM/ds_qk``, i.e.
    ``g_k dM/dg_k`` for a gate shared by every layer (integrated gradients, attribution.py).

    ``recompute``: the gated attention keeps only its inputs for a reverse pass and recomputes its
    L x L tensors there (activation checkpointing), one layer at a time.

    With grad enabled the biases are taken to be zero in value (the estimate is the gradient at
    zero, and the forward keeps one softmax, ``_GatedSoftmax``); without grad any value is applied."""
    global _gate, _gate_plain, _gate_log, _gate_recompute
    prev = _gate, _gate_plain, _gate_log, _gate_recompute
    _gate, _gate_plain, _gate_log, _gate_recompute = biases, plain, log_gate, recompute
    try:
        yield
    finally:
        _gate, _gate_plain, _gate_log, _gate_recompute = prev


#: p_qk above this counts as saturated: 1 - p is clamped here (the first-order estimate is poor there)
GATE_EPS = 1e-4


def _with_hidden(attention_mask, query, key):
    lq, lk = query.shape[-2], key.shape[-2]
    keep = ~_hidden[:, None, None, :lk].to(query.device)
    if attention_mask is None:
        return torch.ones(lq, lk, dtype=torch.bool, device=query.device).tril(diagonal=lk - lq) & keep
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., :lk] & keep
    return attention_mask[..., :lk].masked_fill(~keep, torch.finfo(attention_mask.dtype).min)


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups == 1:
        return x
    b, h, n, d = x.shape
    return x[:, :, None, :, :].expand(b, h, groups, n, d).reshape(b, h * groups, n, d)


def math_attention(
    module, query, key, value, attention_mask, scaling, softcap=None, gate=None, plain=None, log_gate=None
):
    """softmax(q k^T * scaling + mask) v with plain ops (forward-mode AD works through them).
    ``gate`` ([B, Lk], zeros requiring grad) adds the key-gate bias of :func:`key_gate`; ``log_gate``
    and ``plain`` its gated state and plain bias (only with ``gate``).
    Returns (output [B, Lq, H, D], probabilities [B, H, Lq, Lk] in float32, or float64 for float64 inputs)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if gate is not None:
        return _gated_attention(query, key, value, groups, attention_mask, scaling, softcap, gate, plain, log_gate)
    key = _repeat_kv(key, groups)
    value = _repeat_kv(value, groups)
    acc = torch.promote_types(query.dtype, torch.float32)  # at least float32 (float64 stays float64)
    scores = torch.matmul(query, key.transpose(2, 3)).to(acc) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    lq, lk = scores.shape[-2], scores.shape[-1]
    if attention_mask is None:
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=scores.device).tril(diagonal=lk - lq)
    elif attention_mask.dtype == torch.bool:
        allowed = attention_mask
    else:
        allowed = None
        scores = scores + attention_mask[..., :lk].to(acc)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, torch.finfo(acc).min)
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs.to(value.dtype), value)
    return out.transpose(1, 2).contiguous(), probs


def _gated_attention(query, key, value, groups, attention_mask, scaling, softcap, gate, plain, log_gate):
    """:func:`math_attention` with the key gate, on forward-AD dual inputs: the primal and the
    tangent computed by :func:`_gated_core` from unpacked tensors (checkpointed under
    ``key_gate(recompute=True)``) and packed again. Probabilities come back as a plain tensor."""
    q, dq = fwAD.unpack_dual(query)
    k, dk = fwAD.unpack_dual(key)
    v, dv = fwAD.unpack_dual(value)
    args = gated_core_args(q, k, v, dq, dk, dv, groups, attention_mask, gate, plain, log_gate, scaling, softcap)
    if _gate_recompute and torch.is_grad_enabled():
        from torch.utils.checkpoint import checkpoint

        out, dout, probs = checkpoint(_gated_core, *args, use_reentrant=False, preserve_rng_state=False)
    else:
        out, dout, probs = _gated_core(*args)
    out = out.transpose(1, 2).contiguous()
    if dout is not None:
        out = fwAD.make_dual(out, dout.transpose(1, 2).contiguous())
    return out, probs


def gated_core_args(q, k, v, dq, dk, dv, groups, mask, gate, plain, log_gate, scaling, softcap) -> tuple:
    """:func:`_gated_core`'s arguments from plain tensors: k, v and their tangents (None or not)
    repeated to the query heads, the mask cut to the keys, the key-gate bias, plain bias and log
    gate ([B, Lk] or None) as [B, 1, 1, Lk]."""
    k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    dk = _repeat_kv(dk, groups) if dk is not None else None
    dv = _repeat_kv(dv, groups) if dv is not None else None
    lk = k.shape[-2]

    def per_key(t):
        return t[:, None, None, :lk] if t is not None else None

    mask = mask[..., :lk] if mask is not None else None
    return (q, k, v, dq, dk, dv, per_key(gate), per_key(plain), per_key(log_gate), mask, scaling, softcap)


class _GatedSoftmax(torch.autograd.Function):
    """``softmax(s + gate / (1 - p) + plain)`` over the last dimension for zero ``gate`` and ``plain``
    ([B, 1, 1, Lk]; p = softmax(s), not differentiated): the value is softmax(s), and the reverse
    pass gives s its softmax gradient g_s, the gate ``sum_{h, q} g_s / (1 - p)`` and the plain bias
    ``sum_{h, q} g_s``. One softmax is kept (the written-out form kept the bias scale, the
    exponentials and their sums)."""

    @staticmethod
    def forward(ctx, scores, gate, plain):
        probs = torch.softmax(scores, dim=-1)
        ctx.save_for_backward(probs)
        ctx.dtypes = gate.dtype, None if plain is None else plain.dtype
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        g_s = probs * (grad - (grad * probs).sum(dim=-1, keepdim=True))
        g_gate = (g_s / (1.0 - probs).clamp_min(GATE_EPS)).sum(dim=(1, 2), keepdim=True)
        g_plain = None if ctx.dtypes[1] is None else g_s.sum(dim=(1, 2), keepdim=True).to(ctx.dtypes[1])
        return g_s, g_gate.to(ctx.dtypes[0]), g_plain


def _gated_core(q, k, v, dq, dk, dv, gate, plain, log_gate, mask, scaling, softcap):
    """Gated attention and its tangent, from plain tensors (q [B, H, Lq, D], k and v repeated to H
    heads; ``d*`` their tangents or None): ``s = q k^T * scaling`` (+ mask, + log gate), then the
    key-gate bias ``gate / (1 - p0)`` (p0 = softmax(s), not differentiated) and the plain bias,
    ``p = softmax(s + biases)`` (:class:`_GatedSoftmax` where differentiated), ``out = p v``; the
    tangent ``dout = dp v + p dv`` with ``dp = p * (ds - sum_k p ds)``,
    ``ds = (dq k^T + q dk^T) * scaling``. Returns (out, dout or None, p detached)."""
    acc = torch.promote_types(q.dtype, torch.float32)  # at least float32 (float64 stays float64)
    scores = torch.matmul(q, k.transpose(2, 3)).to(acc) * scaling
    ds = None
    if dq is not None or dk is not None:
        parts = [torch.matmul(a, b.transpose(2, 3)) for a, b in ((dq, k), (q, dk)) if a is not None and b is not None]
        ds = (parts[0] if len(parts) == 1 else parts[0] + parts[1]).to(acc) * scaling
    if softcap is not None:
        t = torch.tanh(scores / softcap)
        if ds is not None:
            ds = ds * (1.0 - t * t)
        scores = t * softcap
    lq, lk = scores.shape[-2], scores.shape[-1]
    if mask is None:
        scores = scores.masked_fill(
            ~torch.ones(lq, lk, dtype=torch.bool, device=scores.device).tril(diagonal=lk - lq), torch.finfo(acc).min
        )
    elif mask.dtype == torch.bool:
        scores = scores.masked_fill(~mask, torch.finfo(acc).min)
    else:
        scores = scores + mask.to(acc)
    if log_gate is not None:
        scores = scores + log_gate.to(acc)
    if torch.is_grad_enabled():  # differentiated at zero biases (key_gate)
        probs = _GatedSoftmax.apply(scores, gate, plain)
    else:  # any bias value, applied (finite differences of the gate)
        scale = 1.0 / (1.0 - torch.softmax(scores, dim=-1)).clamp_min(GATE_EPS)
        biased = scores + gate.to(acc) * scale + (0.0 if plain is None else plain.to(acc))
        probs = torch.softmax(biased, dim=-1)
    p_v = probs.to(v.dtype)
    out = torch.matmul(p_v, v)
    dout = None
    if ds is not None:
        dp = probs * (ds - (probs * ds).sum(dim=-1, keepdim=True))
        dout = torch.matmul(dp.to(v.dtype), v)
    if dv is not None:
        pdv = torch.matmul(p_v, dv)
        dout = pdv if dout is None else dout + pdv
    return out, dout, probs.detach()


def bridge_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    r = _active
    layer = getattr(module, "layer_idx", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if _hidden is not None:
        attention_mask = _with_hidden(attention_mask, query, key)
    gate = _gate.get(layer) if _gate is not None else None
    if gate is None and (r is None or (layer not in r.math_layers and layer not in r.capture_layers)):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    capture = r is not None and layer in r.capture_layers
    if (
        gate is None
        and r is not None
        and r.right_padded
        and _hidden is None
        and jvp_attention.supported(module, query, kwargs)
    ):

        def keep_rows(q, k, lse):
            r.add(jvp_attention.routing_rows(q, k, lse, scaling, r.query_start))

        out = jvp_attention.dual_causal_attention(query, key, value, scaling, keep_rows if capture else None)
        return out.transpose(1, 2).contiguous(), None
    plain = _gate_plain.get(layer) if gate is not None and _gate_plain is not None else None
    log_gate = _gate_log if gate is not None else None
    out, probs = math_attention(
        module, query, key, value, attention_mask, scaling, kwargs.get("softcap"), gate, plain, log_gate
    )
    if capture and r is not None:
        r.add(fwAD.unpack_dual(probs).primal[:, :, r.query_start :, :].mean(dim=1))
    return out, None


_registered = False


def register() -> None:
    """Make ``attn_implementation="bridge"`` known to transformers (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, bridge_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    _registered = True


def use_bridge_attention(model) -> None:
    register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(IMPLEMENTATION)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = IMPLEMENTATION
