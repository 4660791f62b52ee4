"""The BRIDGE scoring pass: a_j by one forward-mode JVP along v, and the routing rows A, c.

For a batch, the per-token losses l_j of every eligible response token are a function of the
tail-block parameters; ``torch.func.jvp`` along v gives all a_j = v . grad l_j in one pass. The
same forward pass captures the head-averaged attention rows of the routing layers for the
response query rows (see attention.py); A[j, i] are the columns of eligible prompt positions and
c_j the mass on earlier response tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from ..format.records import Array, Example, Scores
from .attention import Routing, routing, use_bridge_attention
from .batching import ScoreBatch, make_batch
from .params import decoder_of, relative_names, tail_layer_indices


@dataclass
class ScoringContext:
    """Everything a scorer needs: the scoring checkpoint, its tokenizer, the direction v."""

    model: torch.nn.Module
    tokenizer: object
    direction: dict[str, torch.Tensor]  # full parameter name -> v component
    attention_layers: int = 4
    device: str = "cpu"
    options: dict = field(default_factory=dict)


class Scorer(Protocol):
    name: str

    def score(self, batch: list[Example]) -> list[Scores]: ...


def _per_token_losses(model, hidden: torch.Tensor, batch: ScoreBatch, rows) -> torch.Tensor:
    b_idx, q_pos, tgt = rows
    h = hidden[b_idx, q_pos]  # [N, d]: lm_head on response rows only
    logits = model.get_output_embeddings()(h).float()
    return F.cross_entropy(logits, tgt, reduction="none")


def split_rows(routing_rows: torch.Tensor, batch: ScoreBatch, n_layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """From summed captured rows [B, Lq', L] to per-example (A [n, m], c [n])."""
    q0 = batch.query_start
    rows = (routing_rows / n_layers).float().cpu().numpy()
    out = []
    for b, (p, r) in enumerate(zip(batch.prompt, batch.resp)):
        q = r - 1 - q0
        A = rows[b][np.ix_(q, p)] if len(r) and len(p) else np.zeros((len(r), len(p)), dtype=np.float32)
        hist = rows[b][np.ix_(q, r)] if len(r) else np.zeros((0, 0), dtype=np.float32)
        c = np.tril(hist, k=-1).sum(axis=1) if len(r) else np.zeros(0, dtype=np.float32)
        out.append((A.astype(np.float32), c.astype(np.float32)))
    return out


class BridgeScorer:
    """The default scorer: one JVP forward per batch (no per-token backward)."""

    name = "bridge"

    def __init__(self, ctx: ScoringContext):
        self.ctx = ctx
        model = ctx.model
        use_bridge_attention(model)
        self.decoder = decoder_of(model)
        names = list(ctx.direction)
        self.rel = relative_names(model, names)
        params = dict(model.named_parameters())
        self.primals = {self.rel[n]: params[n].detach() for n in names}
        self.tangents = {self.rel[n]: ctx.direction[n].to(device=params[n].device, dtype=params[n].dtype)
                         for n in names}
        tail_blocks = {int(n.split(".")[1]) for n in self.primals}  # "layers.<i>.…"
        self.math_layers = frozenset(tail_blocks)
        self.capture_layers = frozenset(tail_layer_indices(model, ctx.attention_layers))
        self.pad_id = ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else 0

    def _forward(self, batch: ScoreBatch):
        rows = batch.flat_rows()
        model = self.ctx.model

        def f(tail):
            r = Routing(math_layers=self.math_layers | self.capture_layers,
                        capture_layers=self.capture_layers, query_start=batch.query_start)
            with routing(r):
                out = torch.func.functional_call(
                    self.decoder, tail, args=(),
                    kwargs={"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False},
                    strict=False,
                )
            hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
            return _per_token_losses(model, hidden, batch, rows), r.rows

        return f

    @torch.no_grad()
    def score(self, examples: list[Example]) -> list[Scores]:
        batch = make_batch(examples, self.pad_id, self.ctx.device)
        f = self._forward(batch)
        losses, a, rows = torch.func.jvp(f, (self.primals,), (self.tangents,), has_aux=True)
        return self._pack(examples, batch, losses, a, rows)

    def _pack(self, examples, batch, losses, a, rows) -> list[Scores]:
        per_ex = split_rows(rows, batch, len(self.capture_layers))
        counts = [len(r) for r in batch.resp]
        a_np = a.float().cpu().numpy()
        l_np = losses.float().cpu().numpy()
        out = []
        start = 0
        for (A, c), n in zip(per_ex, counts):
            sl = slice(start, start + n)
            out.append(Scores(scorer=self.name, a=Array.of(a_np[sl]), c=Array.of(c), A=Array.of(A, "float16"),
                              loss=Array.of(l_np[sl])))
            start += n
        return out


class ExactScorer(BridgeScorer):
    """Diagnostic reference: a_j by one backward pass per response token (slow, exact)."""

    name = "exact"

    def score(self, examples: list[Example]) -> list[Scores]:
        batch = make_batch(examples, self.pad_id, self.ctx.device)
        f = self._forward(batch)
        primals = {k: v.clone().requires_grad_(True) for k, v in self.primals.items()}
        with torch.enable_grad():
            losses, rows = f(primals)
            keys = list(primals)
            a = torch.empty_like(losses)
            for j in range(losses.shape[0]):
                grads = torch.autograd.grad(losses[j], [primals[k] for k in keys], retain_graph=True,
                                            allow_unused=True)
                a[j] = sum((g * self.tangents[k]).sum() for g, k in zip(grads, keys) if g is not None)
        return self._pack(examples, batch, losses.detach(), a.detach(), rows.detach())
