"""Prompt-side attribution by key-gate patching (AtP* for keys): the ``atp`` scorer.

The exact prompt-side reference of ``bridge analyze fidelity`` is, for prompt token i,
``beta_i(S_r) = sum_{j in S_r} [a_j(P) - a_j(P with i's key hidden from every query at every layer)]``.
Hiding key i turns each attention row q of each layer and head into ``p'_k = p_k / (1 - p_i)``
(k != i), ``p'_i = 0``. With ``M = sum_j w_j a_j`` and ``G = dM/dp`` that change moves M by, to
first order in everything downstream of the softmax and exactly in the softmax itself,

    dM_i = sum_{layers, heads, q} G_q . (p'_q - p_q) = - sum_{layers, heads, q} (dM/ds_qi) / (1 - p_qi)

(s the pre-softmax scores), so ``beta_i ~= -dM_i``. One reverse pass through the scorer's JVP
computation (a_j is a forward-mode derivative along v; autograd differentiates through it) gives
this for every key at once: each layer adds a zero key-gate bias ``b_k / (1 - p_qk)`` to its scores
(attention.key_gate), and ``dM/db_i`` summed over layers is the estimate.

The state S_r of the selection is not known when scoring. The scorer splits each example's response
into ``chunks`` contiguous groups, takes one reverse pass per group (``w`` = the group's indicator;
the forward pass is shared), and spreads a group's effect on key i over its tokens j in proportion
to ``|a_j| A[j, i]``. The result is an interaction matrix ``B[j, i]`` ([n, m], stored as
``Scores.B``) with ``sum_{j in group} B[j, i]`` equal to the group's estimate, used by ``select`` in
place of the paper's ``A[j, i] a_j``: Delta_p(i | S_r) = sum_{j in S_r} B[j, i], and, with
gamma_j = a_j - sum_i B[j, i], Delta_r(j | S_p) = a_j - sum_{i not in S_p} B[j, i], the first-order
estimate of a_j under the reduced prompt. ``chunks = 1`` costs one reverse pass per batch.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from ..format.records import Array, Example, Scores
from .attention import Routing, key_gate, routing
from .score_batch import ScoreBatch, make_batch
from .scoring import BridgeScorer, ScoringContext


def chunk_ids(n: int, chunks: int) -> np.ndarray:
    """The group of each of ``n`` response tokens: ``chunks`` contiguous groups of near-equal size
    (fewer when n < chunks)."""
    k = max(1, min(int(chunks), n))
    return (np.arange(n) * k) // max(n, 1)


def spread(effects: np.ndarray, groups: np.ndarray, a: np.ndarray, A: np.ndarray) -> np.ndarray:
    """B [n, m] from group effects ``effects`` [k, m]: group g's effect on key i is shared among its
    tokens j in proportion to |a_j| A[j, i] (uniformly where those weights are all zero)."""
    n, m = A.shape
    B = np.zeros((n, m), dtype=np.float64)
    w = np.abs(np.asarray(a, dtype=np.float64))[:, None] * np.asarray(A, dtype=np.float64)
    for g in range(effects.shape[0]):
        rows = np.flatnonzero(groups == g)
        if len(rows) == 0:
            continue
        wg = w[rows]
        tot = wg.sum(axis=0)
        share = np.where(tot > 0, wg / np.where(tot > 0, tot, 1.0), 1.0 / len(rows))
        B[rows] = share * effects[g][None, :]
    return B


class AttributionScorer(BridgeScorer):
    """a_j, A, c as the ``bridge`` scorer computes them, plus ``B`` by key-gate attribution."""

    name = "atp"
    OPTIONS = ("chunks",)
    #: default padded tokens per pass on a GPU (`bridge score --max-tokens`): the reverse pass keeps every
    #: layer's attention probabilities, so passes are smaller than the bridge scorer's 32768
    max_tokens_cuda = 4096

    def __init__(self, ctx: ScoringContext):
        super().__init__(ctx)
        opts = dict(ctx.options.get("scorer_options") or {})
        try:
            self.chunks = int(opts.get("chunks", 1))
        except ValueError:
            raise ValueError(f"chunks must be an integer, got {opts['chunks']!r}") from None
        if self.chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {self.chunks}")
        n_layers = len(self.tail.blocks)
        self.gate_layers = list(range(n_layers))

    def score(self, examples: list[Example]) -> list[Scores]:
        base = super().score(examples)
        batch = make_batch(examples, self.pad_id, self.ctx.device)
        groups = [chunk_ids(len(r), self.chunks) for r in batch.resp]
        effects = self.group_effects(batch, groups)  # per example [k, m]
        out = []
        for sc, g, eff in zip(base, groups, effects):
            B = spread(eff, g, sc.a.numpy(), sc.A.numpy())
            out.append(Scores(scorer=self.name, a=sc.a, c=sc.c, A=sc.A, loss=sc.loss, B=Array.of(B, "float32")))
        return out

    def group_effects(self, batch: ScoreBatch, groups: list[np.ndarray]) -> list[np.ndarray]:
        """Per example, [k, m]: the estimated drop of sum_{j in group g} a_j when each eligible
        prompt key is hidden at every layer (k = the number of groups)."""
        B, L = batch.input_ids.shape
        dev = batch.input_ids.device
        dtype = self.tail_dtype
        with torch.enable_grad():
            biases = {i: torch.zeros(B, L, device=dev, dtype=dtype, requires_grad=True) for i in self.gate_layers}
            r = Routing(
                math_layers=frozenset(self.gate_layers),
                capture_layers=frozenset(),
                query_start=batch.query_start,
                right_padded=True,
            )
            with key_gate(biases), routing(r):
                hidden, calls = self.tail.prefix(batch.input_ids, batch.attention_mask, grad=True)
                if hidden.dtype != dtype:
                    hidden = hidden.to(dtype)
                with fwAD.dual_level():
                    dual = {
                        i: {k: fwAD.make_dual(p, self.tangents[i][k]) for k, p in ps.items()}
                        for i, ps in self.primals.items()
                    }
                    out = self._losses(dual, hidden, calls, batch.flat_rows())
                    _, a = fwAD.unpack_dual(out)
            k_max = max((int(g.max()) + 1 for g in groups if len(g)), default=0)
            flat_groups = torch.as_tensor(
                np.concatenate(groups) if groups else np.zeros(0), dtype=torch.long, device=dev
            )
            leaves = [biases[i] for i in self.gate_layers]
            acc = torch.promote_types(dtype, torch.float32)
            totals: list[torch.Tensor] = []
            for g in range(k_max):
                if a is None:
                    totals.append(torch.zeros(B, L, device=dev, dtype=acc))
                    continue
                M = (a.to(acc) * (flat_groups == g).to(acc)).sum()
                grads = torch.autograd.grad(M, leaves, retain_graph=g < k_max - 1, allow_unused=True)
                tot = sum(gr.to(acc) for gr in grads if gr is not None)
                totals.append(tot if isinstance(tot, torch.Tensor) else torch.zeros(B, L, device=dev, dtype=acc))
        stacked = torch.stack(totals, 1).detach().cpu().numpy() if totals else np.zeros((B, 0, L))  # [B, k, L]
        effects: list[np.ndarray] = []
        for b, (p, ids) in enumerate(zip(batch.prompt, groups)):
            k = int(ids.max()) + 1 if len(ids) else 0
            effects.append(stacked[b, :k][:, p].astype(np.float64))
        return effects
