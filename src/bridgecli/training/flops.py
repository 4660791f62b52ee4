"""Training FLOPs by a stated formula: what a run executes, so that two runs compare at equal compute.

For a dense decoder-only transformer (Llama, Qwen2, Gemma, SmolLM shapes) a forward over a row of ``s``
tokens costs ``F(s) = 2 N_mm s + 2 L d s^2``: ``N_mm`` the weights used in matrix products per token (each
block's q, k, v and o projections and its gated MLP's gate, up and down, and the output head, tied or not:
it is a product either way), ``L`` the blocks and ``d`` the query width (``heads x head_dim``). The ``s^2``
term is the attention scores and their product with the values: two products of ``2 d`` FLOPs per key, over
the ``s/2`` keys a causal row attends on average (an implementation that computes the whole square does twice
that; the formula counts what the model needs, not what a kernel spends). Training
is forward plus backward, and the backward costs two forwards, so a row costs ``3 F(s)``. Embedding
look-ups, norms, activations, softmax and the optimizer are left out; so is padding (the rows' own tokens
are what the formula counts). Checked against torch's FLOP counter (``torch.utils.flop_counter``) on tiny
Llama and Qwen2 models in tests/test_flops.py.

A model of another shape (mixture of experts, a config without these fields) gets no figure: ``None``,
never a guess. A LoRA run gets none either: its frozen weights have no weight gradients, so the factor 3
does not hold.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

#: the formula, as recorded beside a figure
FORMULA = "3 x sum over executed rows of (2 N_mm s + 2 L d s^2), s = a row's tokens"

#: config keys that name experts: a mixture-of-experts model's weights are not all used per token
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


class Shape(NamedTuple):
    """What the formula reads of a model: ``n_mm`` weights in matrix products per token, ``layers``
    blocks and ``d_attn`` the query width."""

    n_mm: int
    layers: int
    d_attn: int


def shape_of(config: Mapping[str, Any] | None) -> Shape | None:
    """The formula's :class:`Shape` of a Hugging Face config (as a dict; a multimodal config's
    ``text_config`` is read), or None where the config is not a dense decoder the formula describes."""
    if not config:
        return None
    cfg = config.get("text_config") or config
    if any(isinstance(cfg.get(k), int) and cfg[k] > 1 for k in _EXPERT_KEYS):
        return None
    try:
        d = int(cfg["hidden_size"])
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        ffn = int(cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    head_dim = int(cfg.get("head_dim") or d // heads)
    kv = int(cfg.get("num_key_value_heads") or heads)
    q = heads * head_dim
    attn = d * q + 2 * d * kv * head_dim + q * d
    mlp = 3 * d * ffn
    return Shape(layers * (attn + mlp) + d * vocab, layers, q)


def row_flops(length: int, shape: Shape) -> float:
    """Training FLOPs of one row of ``length`` tokens: ``3 F(s)``."""
    s = float(length)
    return 3.0 * (2.0 * shape.n_mm * s + 2.0 * shape.layers * shape.d_attn * s * s)


def rows_flops(lengths: Iterable[int], shape: Shape) -> float:
    """Training FLOPs of one pass over rows of these lengths."""
    return sum(row_flops(s, shape) for s in lengths)


def steps_for_flops(step_lengths: Sequence[Sequence[int]], shape: Shape, target: float) -> tuple[int, float]:
    """The step count whose training FLOPs come nearest ``target`` (a tie goes to the fewer steps; at least
    one step, at most the plan's), over a plan's steps given as their rows' lengths, and those FLOPs."""
    if not step_lengths:
        raise ValueError("a plan of no steps")
    best_k, best, total = 1, math.inf, 0.0
    for k, lengths in enumerate(step_lengths, start=1):
        total += rows_flops(lengths, shape)
        if abs(total - target) < abs(best - target):
            best_k, best = k, total
    return best_k, best
