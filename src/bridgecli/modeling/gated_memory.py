"""The memory model of the ``atp`` scorer's gated pass (:mod:`.attribution`): what one pass keeps
for its reverse pass and its transient peak, so that the scorer sizes its passes to the free memory
of a GPU (``AttributionScorer._plan``). The constants are fit, with margin, to the saved-tensor
measurement of ``bench/score/bench_atp.py --saved-bytes``; tests/test_attribution_cost.py checks
them against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class GatedShape:
    """What the memory of a gated pass depends on: the model's widths and vocabulary, the gated
    blocks before the tail (``prefix``) and in it (``tail``), the bytes of one element."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    prefix: int
    tail: int
    dtype_bytes: int

    @classmethod
    def of(cls, model: torch.nn.Module, tail: int, gated: int, dtype: torch.dtype) -> GatedShape:
        cfg: Any = model.config
        hidden = int(cfg.hidden_size)
        heads = int(cfg.num_attention_heads)
        return cls(
            hidden=hidden,
            intermediate=int(getattr(cfg, "intermediate_size", None) or 4 * hidden),
            heads=heads,
            kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(cfg, "head_dim", None) or hidden // heads),
            vocab=int(cfg.vocab_size),
            prefix=max(0, gated - tail),
            tail=min(gated, tail),
            dtype_bytes=torch.empty(0, dtype=dtype).element_size(),
        )

    @property
    def acc_bytes(self) -> int:
        """Bytes of an element of the attention arithmetic (at least float32)."""
        return max(4, self.dtype_bytes)


#: bytes a gated block keeps for the reverse pass per padded token, per unit of (hidden, intermediate)
#: width and element byte, and per (head x key) element of its L x L tensors in units of
#: ``acc_bytes``: fit with margin to the saved-tensor measurement (``bench/score/bench_atp.py
#: --saved-bytes``, bf16, Llama shapes of 135M and 1B; tests/test_attribution_cost.py checks it)
PREFIX_WIDTH = (7.0, 3.5)
TAIL_WIDTH = (18.0, 11.0)
OTHER_WIDTH = 10.0  # embeddings, final norm, the LM head's inputs
PREFIX_LXL, TAIL_LXL = 1.5, 4.5
#: one layer's L x L tensors alive at once while it runs forward, or is recomputed and differentiated
TRANSIENT_LXL = 12.0
#: bytes per (row x vocabulary) element of one LM-head chunk while it is recomputed and differentiated
HEAD_TRANSIENT = 32.0
#: the share of free memory a pass may plan for, and a reserve for everything else
MEMORY_SHARE, RESERVE = 0.85, 2**30


def token_bytes(shape: GatedShape, seq_len: int, recompute: bool) -> float:
    """Bytes a gated pass keeps for its reverse pass per padded token of sequences of ``seq_len``
    tokens: every gated block's activations (and tangents in the tail), and without ``recompute``
    their attention's L x L tensors."""
    w = max(shape.hidden, shape.heads * shape.head_dim)
    db = shape.dtype_bytes
    lxl = 0.0 if recompute else shape.heads * seq_len * shape.acc_bytes
    prefix = db * (PREFIX_WIDTH[0] * w + PREFIX_WIDTH[1] * shape.intermediate) + PREFIX_LXL * lxl
    tail = db * (TAIL_WIDTH[0] * w + TAIL_WIDTH[1] * shape.intermediate) + TAIL_LXL * lxl
    return shape.prefix * prefix + shape.tail * tail + db * OTHER_WIDTH * w


def pass_bytes(shape: GatedShape, tokens: int, seq_len: int, row_chunk: int, recompute: bool) -> float:
    """Predicted peak bytes of one gated pass (forward and reverse) over ``tokens`` padded tokens of
    sequences of ``seq_len``, beyond the model's own weights."""
    transient = tokens * shape.heads * seq_len * shape.acc_bytes * TRANSIENT_LXL
    head = min(tokens, row_chunk) * shape.vocab * HEAD_TRANSIENT
    return tokens * token_bytes(shape, seq_len, recompute) + transient + head


def pass_tokens(shape: GatedShape, free_bytes: float, seq_len: int, row_chunk: int, recompute: bool) -> int:
    """The most padded tokens of sequences of ``seq_len`` one gated pass may hold in ``free_bytes``
    (0 when not even the fixed part fits): the inverse of :func:`pass_bytes` within
    ``MEMORY_SHARE * free_bytes - RESERVE``."""
    usable = MEMORY_SHARE * free_bytes - RESERVE - row_chunk * shape.vocab * HEAD_TRANSIENT
    per_token = token_bytes(shape, seq_len, recompute) + shape.heads * seq_len * shape.acc_bytes * TRANSIENT_LXL
    return max(0, int(usable // per_token))


def free_bytes(device: str | torch.device) -> int | None:
    """Bytes a pass may still allocate on a CUDA device (free, plus what the caching allocator holds
    unused); None off a GPU."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(dev)
    return int(free + torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev))
