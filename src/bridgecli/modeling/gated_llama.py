"""A hand-written gated pass through Llama-family blocks: the fast path of the ``atp`` scorer.

The ``atp`` scorer (attribution.py) runs one forward pass with a key-gate bias on every gated
block's attention and the JVP along v through the tail blocks, then reverse passes from the a_j to
the biases. The generic path runs HF's modules eagerly under autograd (RMSNorm in float32 with its
casts, RoPE with cat/neg, SwiGLU, each op separately) and its tail blocks under generic forward-mode
AD (a tangent op per op), which the reverse pass differentiates again. Here, for the families
``dual_llama.supported`` accepts, every block from the first gated (or tail) block on runs by hand:

- gated blocks before the tail (:class:`GatedBlock`): primal only, with fused q|k|v and gate|up
  matmuls (weights concatenated once, no gradient to them) and RMSNorm, RoPE and SwiGLU as small
  pure functions run through ``dual_llama._Compiled`` (torch.compile on CUDA, so AOTAutograd fuses
  their backward too; eager elsewhere);
- gated tail blocks (:class:`GatedDualBlock`): (primal, tangent) pairs as ``dual_llama.DualBlock``
  computes them (a linear layer's tangent one matmul, ``[x, dx] @ [dW, W]^T``), with the
  autograd-capable compiled functions of dual_llama (not its Triton kernels, which have no
  backward);
- the attention of both is ``attention._gated_core`` (key-gate bias, plain bias and log gate as
  ``attention.key_gate`` defines them; checkpointed under ``recompute``), compiled whole on CUDA so
  that its L x L elementwise work fuses in both directions; it also gives the capture layers'
  routing rows;
- tail blocks before the first gated block (option ``layers=K``) need no gradient: they run as
  ``dual_llama.DualBlock`` (the ``bridge`` scorer's fast tail) without autograd;
- the blocks before all of these run through HF once, without autograd, and their last call gives
  the hidden states, the rotary embeddings and the attention mask (tail.py's recorder);
- the final norm and the LM head as the ``bridge`` scorer's fast tail (``token_ce_with_tangent``).

Eager (off CUDA) the small functions are checkpointed, so that either way a block keeps about its
inputs for the reverse pass, less than the generic path (``bench/score/bench_atp.py --saved-bytes``).
Losses and routing rows equal the generic path's to float64 rounding; a and B to the float32
rounding of the RMSNorm tangent (HF normalises in float32 even in a float64 model, and the tangent
here is written out instead of forward-mode AD's op by op): tests/test_gated_llama.py.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable

import torch
import torch._dynamo.config as _dynamo_config
import torch._functorch.config as _functorch_config
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from . import dual_llama, jvp_attention, scoring
from .attention import Routing, _gated_core, gated_core_args, routing
from .tail import Tail, TailCall

Tensor = torch.Tensor


# --------------------------------------------------------------------------- pure functions


def _rmsnorm(x: Tensor, w: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm in HF's op order: normalise in float32, cast back, scale."""
    xf = x.to(torch.float32)
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * n.to(x.dtype)


def _rope(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """HF's ``apply_rotary_pos_emb`` (cos and sin already broadcast over the heads)."""
    return dual_llama._rope(q, cos, sin), dual_llama._rope(k, cos, sin)


def _swiglu(gu: Tensor) -> Tensor:
    """silu(g) * u from the fused gate|up projection."""
    g, u = gu.chunk(2, -1)
    return F.silu(g) * u


class _Lean(dual_llama._Compiled):
    """``dual_llama._Compiled`` for a function differentiated afterwards. Compiled, AOTAutograd's
    partitioner keeps few tensors for the backward (mostly the inputs) and recomputes the rest;
    eager (off CUDA, ``BRIDGE_COMPILE=0``, a failed compilation) the function is checkpointed to
    keep only its inputs too, so the memory model (attribution.token_bytes) holds either way.

    Compiled without dynamo's size-oblivious rule: under it AOTAutograd cannot prove a saved input's
    symbolic stride equal to the one inductor reports, "restrides" the backward's placeholder with
    the first batch's strides as constants, and the next batch of another length fails in the
    backward (``assert_size_stride``; pytorch/pytorch#194420). A batch of one example compiles once more."""

    def __init__(self, fn):
        super().__init__(fn, size_oblivious=False)

    def __call__(self, *args):
        compiles = (
            args[0].device.type in self.device_types
            and os.environ.get("BRIDGE_COMPILE", "1") != "0"
            and not self.failed
        )
        if compiles or not torch.is_grad_enabled():
            return super().__call__(*args)
        return checkpoint(self.fn, *args, use_reentrant=False, preserve_rng_state=False)


#: compiled on CUDA (fused forward and, through AOTAutograd, backward; run them under
#: :func:`differentiable`); separate instances from dual_llama's, whose graphs are traced without autograd
rmsnorm = _Lean(_rmsnorm)
rope = _Lean(_rope)
swiglu = _Lean(_swiglu)
rmsnorm_dual = _Lean(dual_llama._rmsnorm_dual)
rope_dual = _Lean(dual_llama._rope_dual)
swiglu_dual = _Lean(dual_llama._swiglu_dual)
#: the gated attention core (matmuls, scaling, masks, gate softmax, tangent), compiled whole: its
#: L x L elementwise work fused, forward and backward; it broadcasts [B, 1, ...] masks and biases
#: over the heads, so it keeps dynamo's size-1 rule. Eager it is ``attention._gated_core`` itself.
gated_core = dual_llama._Compiled(_gated_core, size_oblivious=False)
COMPILED = (rmsnorm, rope, swiglu, rmsnorm_dual, rope_dual, swiglu_dual, gated_core)


#: graphs per compiled function before dynamo runs it eagerly (:func:`differentiable`)
RECOMPILE_LIMIT = 64


def differentiable() -> contextlib.AbstractContextManager:
    """The context of a gated pass, forward and reverse passes, for the compiled functions, where
    this torch has the settings:

    - no donated buffers: the scorer runs one reverse pass per response group over the same graph
      (``retain_graph``), which a compiled backward that frees its saved tensors refuses (and it
      checks at the reverse pass, so the setting must hold then too);
    - the backward compiled with the forward: a backward that fails to compile then fails inside
      ``_Compiled``, which runs the function eagerly from then on, instead of in the reverse pass;
    - more graphs per function than dynamo's default 8 before it stops compiling: the attention
      core compiles once per combination of block kind (before the tail or in it), inputs with or
      without grad (the first gated block's do not require it), mask or none (a batch without
      padding), a batch of one example or more, and the ig options' biases."""
    stack = contextlib.ExitStack()
    want = {"donated_buffer": False, "force_non_lazy_backward_lowering": True}
    stack.enter_context(_functorch_config.patch({k: v for k, v in want.items() if hasattr(_functorch_config, k)}))
    limits = {k: RECOMPILE_LIMIT for k in ("recompile_limit", "cache_size_limit") if hasattr(_dynamo_config, k)}
    stack.enter_context(_dynamo_config.patch(limits))
    return stack


# --------------------------------------------------------------------------- the gate of one layer


class LayerGate:
    """What the gated attention of one layer gets: the removal bias, the plain bias (or None) and
    the log gate (or None), each [B, L]; ``recompute`` checkpoints the attention core."""

    def __init__(self, bias: Tensor, plain: Tensor | None, log_gate: Tensor | None, recompute: bool):
        self.bias = bias
        self.plain = plain
        self.log_gate = log_gate
        self.recompute = recompute

    def attend(self, q, k, v, dq, dk, dv, groups: int, mask: Tensor | None, scale: float):
        """``attention._gated_attention`` on plain tensors: q [B, H, L, D], k and v [B, KV, L, D]
        (tangents or None). Returns (out, dout or None) [B, H, L, D] and the probabilities."""
        args = gated_core_args(q, k, v, dq, dk, dv, groups, mask, self.bias, self.plain, self.log_gate, scale, None)
        if self.recompute and torch.is_grad_enabled():
            # no early stop: it ends the recomputation by an exception from inside the function,
            # which _Compiled would take for a failed compilation
            return checkpoint(gated_core, *args, use_reentrant=False, preserve_rng_state=False, early_stop=False)
        return gated_core(*args)


def _capture(r: Routing | None, probs: Tensor) -> None:
    """Add one capture layer's head-averaged rows from ``r.query_start`` (as math_attention does)."""
    if r is not None:
        r.add(probs[:, :, r.query_start :, :].mean(dim=1))


# --------------------------------------------------------------------------- blocks


def _fused(weights: dict[str, Tensor], prefixes: list[str]) -> tuple[Tensor, Tensor | None]:
    """The weights (and biases, if any) of ``prefixes`` concatenated along the output dimension (one
    prefix: its own tensors, not a copy)."""
    if len(prefixes) == 1:
        return weights[f"{prefixes[0]}.weight"], weights.get(f"{prefixes[0]}.bias")
    w = torch.cat([weights[f"{p}.weight"] for p in prefixes], 0)
    biases = [weights.get(f"{p}.bias") for p in prefixes]
    b = torch.cat([x for x in biases if x is not None], 0) if biases[0] is not None else None
    return w, b


class GatedBlock:
    """One gated decoder block before the tail, primal only (autograd records it for the reverse
    pass to the gate biases; no gradient to the weights, which are plain tensors)."""

    def __init__(self, block: Any):
        attn = block.self_attn
        self.heads = int(attn.config.num_attention_heads)
        self.kv_heads = int(attn.config.num_key_value_heads)
        self.head_dim = int(attn.head_dim)
        self.scale = float(attn.scaling)
        self.eps1 = float(block.input_layernorm.variance_epsilon)
        self.eps2 = float(block.post_attention_layernorm.variance_epsilon)
        w = {n: p.detach() for n, p in block.named_parameters()}
        self.qkv = _fused(w, ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"])
        self.o = _fused(w, ["self_attn.o_proj"])
        self.gate_up = _fused(w, ["mlp.gate_proj", "mlp.up_proj"])
        self.down = _fused(w, ["mlp.down_proj"])
        self.ln1 = w["input_layernorm.weight"]
        self.ln2 = w["post_attention_layernorm.weight"]
        self.sizes = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]

    def __call__(self, h: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, gate: LayerGate, r: Routing | None):
        """The block's output; ``r`` (if given) receives this layer's routing rows."""
        B, L, _ = h.shape
        qkv = F.linear(rmsnorm(h, self.ln1, self.eps1), *self.qkv)
        q, k, v = (t.view(B, L, -1, self.head_dim).transpose(1, 2) for t in qkv.split(self.sizes, -1))
        q, k = rope(q, k, cos.unsqueeze(1), sin.unsqueeze(1))
        o, _, probs = gate.attend(q, k, v, None, None, None, self.heads // self.kv_heads, mask, self.scale)
        _capture(r, probs)
        h = h + F.linear(o.transpose(1, 2).reshape(B, L, self.sizes[0]), *self.o)
        m = swiglu(F.linear(rmsnorm(h, self.ln2, self.eps2), *self.gate_up))
        return h + F.linear(m, *self.down)


class GatedDualBlock(dual_llama.DualBlock):
    """One gated tail block: ``dual_llama.DualBlock``'s (primal, tangent) arithmetic with the
    autograd-capable compiled functions and the gated attention core."""

    @classmethod
    def sharing(cls, blk: dual_llama.DualBlock) -> GatedDualBlock:
        """A gated block on the prepared weights of ``blk`` (the bridge scorer's fast tail), not a
        copy of them."""
        out = cls.__new__(cls)
        out.__dict__.update(blk.__dict__)
        return out

    def __call__(  # type: ignore[override]
        self, h: Tensor, dh: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, gate: LayerGate, r: Routing | None
    ) -> tuple[Tensor, Tensor]:
        """The block's output and its tangent; ``r`` (if given) receives this layer's routing rows."""
        B, L, _ = h.shape
        x, dx = rmsnorm_dual(h, dh, *self.ln1, self.eps1)
        qkv, dqkv = self._linear(x, dx, self.qkv)
        sizes = [self.q_size, self.kv_size, self.kv_size]

        def heads(t: Tensor) -> list[Tensor]:
            return [p.view(B, L, -1, self.head_dim).transpose(1, 2) for p in t.split(sizes, -1)]

        (q, k, v), (dq, dk, dv) = heads(qkv), heads(dqkv)
        q, dq, k, dk = rope_dual(q, dq, k, dk, cos.unsqueeze(1), sin.unsqueeze(1))
        o, do, probs = gate.attend(q, k, v, dq, dk, dv, self.heads // self.kv_heads, mask, self.scale)
        _capture(r, probs)
        return self.after_attention(h, dh, o, do, rmsnorm_dual, swiglu_dual)


def _call_inputs(call: TailCall) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """(hidden states, cos, sin, attention mask) of a recorded block call."""
    hidden = call.args[0] if call.args else call.kwargs["hidden_states"]
    cos, sin = call.kwargs["position_embeddings"]
    return hidden, cos, sin, call.kwargs.get("attention_mask")


# --------------------------------------------------------------------------- the pass


class GatedLlama:
    """The gated pass from the first gated or tail block on, for one scorer (weights prepared once).

    ``gate_layers`` are the gated blocks (the final ones), ``tail`` the tail blocks (the final ones),
    ``fast`` the bridge scorer's fast tail over them: the tail blocks run on its prepared weights
    (the ungated ones as its DualBlocks), in ``tail_dtype``."""

    def __init__(
        self,
        model: torch.nn.Module,
        blocks,
        gate_layers: list[int],
        tail: Tail,
        fast: dual_llama.DualLlamaTail,
        tail_dtype: torch.dtype,
    ):
        n = len(blocks)
        self.gate_set = frozenset(gate_layers)
        self.tail_indices = list(tail.indices)
        self.start = min(gate_layers[0], self.tail_indices[0])
        self.recorder = Tail(model, list(range(self.start, n)))
        self.tail_dtype = tail_dtype
        norm: Any = tail.norm
        self.norm_w = norm.weight
        self.norm_eps = float(norm.variance_epsilon)
        self.blocks: dict[int, Callable] = {}
        for i in range(self.start, n):
            if i not in self.tail_indices:
                self.blocks[i] = GatedBlock(blocks[i])
            elif i in self.gate_set:
                self.blocks[i] = GatedDualBlock.sharing(fast.blocks[fast.indices.index(i)])
            else:  # an ungated tail block (before the gated ones): no gradient flows through it
                self.blocks[i] = fast.blocks[fast.indices.index(i)]

    def losses(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        rows: tuple[Tensor, Tensor, Tensor],
        gates: dict[int, LayerGate],
        r: Routing,
        lm_head: torch.nn.Module,
        row_chunk: int,
        padded: bool | None = None,
        shift: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """(per-token losses, a) of the response rows ``rows`` (b_idx, q_pos, targets) with the
        gates ``gates`` (per gated layer) on. ``r`` is active: the blocks before the hand-run ones
        capture their rows through the registered attention, the others add theirs to it. ``padded``:
        whether any row is padded, when known (see Tail.prefix). ``shift``: a constant added to the
        rows' tangent before the LM head (the bridge scorer's ``debias=common``)."""
        with torch.no_grad(), routing(r):
            _, calls = self.recorder.prefix(input_ids, attention_mask, padded=padded)
        capture = r.capture_layers
        h, _, _, _ = _call_inputs(calls[0])
        dh: Tensor | None = None
        for i, call in zip(self.recorder.indices, calls):
            _, cos, sin, mask = _call_inputs(call)
            if i == self.tail_indices[0]:  # the tail runs in its own dtype, with a tangent
                h = h.to(self.tail_dtype)
                dh = torch.zeros_like(h)
            blk = self.blocks[i]
            if dh is None:
                h = blk(h, cos, sin, mask, gates[i], r if i in capture else None)
            elif i in self.gate_set:
                cos, sin = cos.to(h.dtype), sin.to(h.dtype)
                h, dh = blk(h, dh, cos, sin, mask, gates[i], r if i in capture else None)
            else:
                cos, sin = cos.to(h.dtype), sin.to(h.dtype)
                with torch.no_grad():
                    h, dh = blk(h, dh, cos, sin, self._on_rows(r) if i in capture else None)
        assert dh is not None  # the tail is never empty
        h, dh = rmsnorm_dual(h, dh, self.norm_w.to(h.dtype), None, self.norm_eps)
        b_idx, q_pos, tgt = rows
        weight = lm_head.weight.to(self.tail_dtype)
        bias = lm_head.bias.to(self.tail_dtype) if lm_head.bias is not None else None
        dhr = dh[b_idx, q_pos]
        if shift is not None:
            dhr = dhr.to(shift.dtype) + shift
        return scoring.token_ce_with_tangent(h[b_idx, q_pos], dhr, weight, bias, tgt, row_chunk)

    def weights(self) -> list[Tensor]:
        """Every weight tensor the blocks hold (the concatenations made once per scorer among them):
        kept for the reverse pass like the model's own parameters, not per token (bench_atp.py)."""
        out: list[Tensor] = []
        todo: list[Any] = [vars(blk) for blk in self.blocks.values()]
        while todo:
            item = todo.pop()
            if isinstance(item, Tensor):
                out.append(item)
            elif isinstance(item, dict):
                todo.extend(item.values())
            elif isinstance(item, (tuple, list)):
                todo.extend(item)
        return out

    @staticmethod
    def _on_rows(r: Routing) -> Callable:
        """DualBlock's capture callback: rows recomputed from the row LSE (the bridge scorer's)."""

        def on_rows(q, k, lse, scale):
            r.add(jvp_attention.routing_rows(q, k, lse, scale, r.query_start))

        return on_rows
