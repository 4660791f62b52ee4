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

The gated forward pass is the scoring pass too: at the kept state its a_j, losses and attention rows
are those of the ``bridge`` scorer, so a, A and c come from it and no other pass runs (with ``ig``
every pass is at a gated state, and one ``bridge`` pass gives them). What the reverse pass keeps is
modelled in :mod:`.gated_memory`; on a GPU the scorer sizes its passes to the free memory with it,
and recomputes each gated layer's L x L tensors in the reverse pass instead of keeping them where
passes would be small otherwise (``AttributionScorer._plan``).

With ``fast=1``, on Llama-family models (those ``dual_llama.supported`` accepts, ``fast_tail`` not off) the gated
pass runs by hand from the first gated or tail block on (gated_llama.py): fused matmuls, compiled
RMSNorm / RoPE / SwiGLU with their backward, the (primal, tangent) pairs of the bridge scorer's fast
tail in place of forward-mode AD op by op, and the same gated attention core. By default, on other
models, and with ``fast_tail=False``, HF's modules run under the key gate and forward-mode AD
(``_gated_generic``). The hand-written pass gives the same B to float32 rounding (tests/test_gated_llama.py);
it is opt-in because it compiles about 20 graphs before its first batch, which its faster batches
make up only on large inputs (docs/benchmarks.md, "The atp prompt scorer", has the measurements).

Integrated gradients of a key gate (``ig=K``). Write hiding as a gate g_k in [0, 1] on every layer's
unnormalised attention weight: scores ``s_qk + log g_k`` (g = 1 kept, g = 0 exactly hidden). The
exact effect of one key is a path integral, ``beta_i = M(1) - M(1 - e_i) = int_0^1 dM/dg_i dg_i``
along its own path, which costs K passes per key. The ``ig`` option takes instead the JOINT path
``g = 1 - t h`` on every eligible prompt key at once (h = ``ig_depth``) and, per pass, the gradient
for every key, in one of two rules:

- ``ig_rule=path`` (default): ``beta_i ~= h * mean_t dM/dg_i(1 - t_k h) + e_i(1 - h)``, with K
  midpoints t_k = (k + 1/2) / K and e_i(g) the key-gate (AtP*) estimate of hiding key i from the
  state g (the ``b_k / (1 - p_qk)`` bias with p the gated state's). Integrated gradients down to depth
  h, then the exact-softmax first-order jump to zero. It is exact where the joint path is key i's own
  path and the jump is first order (a one-token prompt; tests/test_attribution.py), h -> 0 gives back
  the one-pass estimate and h = 1 the plain joint integrated gradients (no jump). dM/dg_i is read from
  a zero plain bias on the scores (``attention.key_gate``'s ``plain``): its gradient is g_i dM/dg_i.
  Cost: K + 1 forward and reverse passes (K when h = 1).
- ``ig_rule=avg``: ``beta_i ~= mean_t e_i(1 - t_k h)``, the key-gate estimate of each key's full
  removal averaged over the K joint states. Cost: K passes. It has no exactness property; it smooths
  the linearisation point.

Neither rule is the single-removal path for a prompt of many keys: partially hiding every prompt key
renormalises each softmax row (the prompt's share of the row falls), a first-order change even in a
linear model, so a joint state is not a state of one key's path.

With ``debias=common`` (the bridge scorer's option, scoring.py) every pass scores a_j - beta u_j: the
constant beta d is added to the response rows' tangent before the LM head, so the reverse pass
differentiates the debiased a_j (u_j depends on the prompt through p_j) and B estimates the effect of
hiding a key on what ``select`` ranks.

How close each rule comes to the exact effects is measured in docs/diagnostics.md (both help a
little; neither closes the gap), and the sweep behind the defaults in ``IG_DEPTH`` is in
docs/benchmarks.md ("The ``ig`` defaults").
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from ..errors import UsageError
from ..format.records import Array, Example, Scores
from ..optionspec import switch
from .attention import Routing, key_gate, routing
from .gated_llama import GatedLlama, LayerGate, differentiable
from .gated_memory import GatedShape, pass_tokens
from .gated_memory import pass_bytes, token_bytes  # noqa: F401  (bench/score/bench_atp.py imports them from here)
from .gated_memory import free_bytes as _free_bytes
from .params import blocks_of
from .score_batch import ScoreBatch, make_batch, padded_length
from .scoring import BridgeScorer, ScoringContext, _cast_floats


#: the default ``ig_depth`` of each ``ig_rule``: the better of those measured (docs/benchmarks.md)
IG_DEPTH = {"path": 0.5, "avg": 1.0}


def _int_option(opts: dict, name: str, default: int, high: int | None = None) -> int:
    """Scorer option ``name`` as an integer >= 1 (and <= ``high``); a :class:`UsageError` otherwise."""
    try:
        value = int(opts.get(name, default))
    except ValueError:
        raise UsageError(f"{name} must be an integer, got {opts[name]!r}") from None
    if value < 1:
        raise UsageError(f"{name} must be >= 1, got {value}")
    if high is not None and value > high:
        raise UsageError(f"{name} must be <= {high} (the model's blocks), got {value}")
    return value


def _in_order_sum(parts: list[np.ndarray]) -> np.ndarray:
    """parts[0] + parts[1] + ..., added left to right."""
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


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


@contextlib.contextmanager
def _frozen(model: torch.nn.Module) -> Iterator[None]:
    """The model's parameters without ``requires_grad`` meanwhile: the reverse pass differentiates
    with respect to the key-gate biases only, so no op keeps its input for a weight gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


def _group_gradients(
    a: torch.Tensor | None,
    groups: list[np.ndarray],
    removal: list[torch.Tensor],
    plain: list[torch.Tensor],
    shape: tuple[int, int],
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per response group g, one reverse pass of M_g = sum_{j in g} a_j: its gradients with respect
    to the ``removal`` biases and to the ``plain`` ones, each summed over layers ([B, L] each; zeros
    where no tangent reached a, or no gradient reached a bias)."""
    B, L = shape
    k_max = max((int(g.max()) + 1 for g in groups if len(g)), default=0)
    flat_groups = torch.as_tensor(np.concatenate(groups) if groups else np.zeros(0), dtype=torch.long, device=device)
    leaves = removal + plain
    acc = torch.promote_types(dtype, torch.float32)
    totals: list[torch.Tensor] = []
    totals_plain: list[torch.Tensor] = []
    for g in range(k_max):
        if a is None:
            totals.append(torch.zeros(B, L, device=device, dtype=acc))
            totals_plain.append(torch.zeros(B, L, device=device, dtype=acc))
            continue
        M = (a.to(acc) * (flat_groups == g).to(acc)).sum()
        grads = torch.autograd.grad(M, leaves, retain_graph=g < k_max - 1, allow_unused=True)
        for part, out_list in ((grads[: len(removal)], totals), (grads[len(removal) :], totals_plain)):
            tot = sum(gr.to(acc) for gr in part if gr is not None)
            out_list.append(tot if isinstance(tot, torch.Tensor) else torch.zeros(B, L, device=device, dtype=acc))
    return totals, totals_plain


class AttributionScorer(BridgeScorer):
    """a_j, A, c as the ``bridge`` scorer computes them, plus ``B`` by key-gate attribution."""

    name = "atp"
    OPTIONS = ("chunks", "ig", "ig_depth", "ig_rule", "layers", "fast", "debias")
    #: the most padded tokens a command's batch gets by default on a GPU (the bridge scorer's)
    MAX_TOKENS = 32768
    #: ``atp_recompute=auto`` recomputes the L x L tensors only where passes would be smaller than this
    MIN_PASS = 4096

    def __init__(self, ctx: ScoringContext):
        super().__init__(ctx)
        if "lm_head_rows" not in ctx.options:
            # each LM-head chunk is recomputed in the reverse pass with its [rows, vocab] float32
            # tensors; smaller chunks keep that transient small
            self.row_chunk = 1024
        #: recompute each gated layer's L x L tensors in the reverse pass: "auto" (on a GPU, where passes
        #: without it would hold fewer than MIN_PASS tokens; see _plan), "always" or "never"
        self.recompute = str(ctx.options.get("atp_recompute", "auto"))
        if self.recompute not in ("auto", "always", "never"):
            raise ValueError(f"atp_recompute must be auto, always or never, got {self.recompute!r}")
        opts = dict(ctx.options.get("scorer_options") or {})
        self.chunks = _int_option(opts, "chunks", 1)
        self.ig: int | None = None
        if "ig" in opts:
            self.ig = _int_option(opts, "ig", 1)
        elif "ig_depth" in opts or "ig_rule" in opts:
            raise UsageError("ig_depth and ig_rule need ig=K")
        self.ig_rule = str(opts.get("ig_rule", "path"))
        if self.ig_rule not in IG_DEPTH:
            raise UsageError(f"ig_rule must be path or avg, got {self.ig_rule!r}")
        try:
            self.ig_depth = float(opts.get("ig_depth", IG_DEPTH[self.ig_rule]))
        except ValueError:
            raise UsageError(f"ig_depth must be a number, got {opts['ig_depth']!r}") from None
        if not 0.0 < self.ig_depth <= 1.0:
            raise UsageError(f"ig_depth must lie in (0, 1], got {self.ig_depth}")
        n_layers = len(self.tail.blocks)
        k = _int_option(opts, "layers", n_layers, high=n_layers)
        # hide keys in the final k blocks only (default: every block); the blocks before run their
        # fused attention and the reverse pass stops at the first gated block
        self.gate_layers = list(range(n_layers - k, n_layers))
        self.shape = GatedShape.of(ctx.model, len(self.tail.indices), k, self.tail_dtype)
        # ``fast=1``: Llama-family models get the hand-written gated pass where the bridge scorer has
        # its fast tail (``fast_tail``, on by default); otherwise HF's modules run (gated_llama.py).
        # Off by default: its first batch waits for its graphs to compile (docs/benchmarks.md; the
        # context option ``atp_fast`` sets the default, for tests and benchmarks)
        fast = switch(str(opts.get("fast", "1" if ctx.options.get("atp_fast") else "0")))
        if fast is None:
            raise UsageError(f"fast must be 0 or 1, got {opts['fast']!r}")
        self.gated_fast: GatedLlama | None = None
        #: a pass's length is padded to a multiple of this: on a GPU, the L x L matrix products of
        #: the gated attention (``p v``, and the reverse pass's) then get tensor-core kernels for
        #: aligned bf16 operands instead of a slower fallback; padding keys are masked, and no real
        #: query sees them (causal), so the scores are those of the unpadded batch
        self.pad_multiple = 8 if torch.device(ctx.device).type == "cuda" else 1
        if self.fast is not None and fast:
            self.gated_fast = GatedLlama(
                ctx.model, blocks_of(ctx.model), self.gate_layers, self.tail, self.fast, self.tail_dtype
            )

    def multiple_for(self, examples: list[Example]) -> int:
        """The length multiple a pass of ``examples`` is padded to: :attr:`pad_multiple`, unless the
        padded length would pass the model's position limit (learned position embeddings end there)."""
        limit = getattr(self.ctx.model.config, "max_position_embeddings", None)
        longest = max(len(ex.tokens.input_ids) for ex in examples)
        if limit is not None and padded_length(longest, self.pad_multiple) > limit:
            return 1
        return self.pad_multiple

    @property
    def startup_note(self) -> str | None:
        """What the user is told before the first batch: the hand-written pass compiles on a GPU
        (docs/benchmarks.md gives how long)."""
        if self.gated_fast is None or torch.device(self.ctx.device).type != "cuda":
            return None
        return (
            "atp fast=1: the gated pass compiles before the first batch (about half a minute, "
            "a minute or more on a machine's first run); it pays from about 10,000 GSM8K-sized examples"
        )

    @property
    def max_tokens_cuda(self) -> int:
        """Default padded tokens of a command's batch on a GPU (``bridge score --max-tokens``): a
        pass's worth of sequences of 512 tokens in the free memory now (:meth:`_plan`), at most
        :attr:`MAX_TOKENS`. A batch that does not fit is split into passes (:meth:`score`)."""
        free = _free_bytes(self.ctx.device)
        if free is None:
            return 4096
        return max(1, min(self.MAX_TOKENS, self._plan(free, 512)[0]))

    def _plan(self, free: int, seq_len: int) -> tuple[int, bool]:
        """(padded tokens per pass, recompute) for sequences of ``seq_len`` in ``free`` bytes:
        ``auto`` recomputes only where a pass without it would hold fewer than :attr:`MIN_PASS`
        tokens (recomputing costs about a forward of every gated layer's attention)."""
        plain = pass_tokens(self.shape, free, seq_len, self.row_chunk, recompute=False)
        if self.recompute == "never" or (self.recompute == "auto" and plain >= self.MIN_PASS):
            return plain, False
        return pass_tokens(self.shape, free, seq_len, self.row_chunk, recompute=True), True

    def score(self, examples: list[Example]) -> list[Scores]:
        out: list[Scores] = []
        for part in self._passes(examples, _free_bytes(self.ctx.device)):
            out.extend(self._score_pass(part))
        return out

    def _passes(self, examples: list[Example], free: int | None) -> list[list[Example]]:
        """``examples`` in consecutive runs, each one pass that fits in ``free`` bytes (:meth:`_plan`;
        at least one example a pass); all in one pass where ``free`` is None (off a GPU)."""
        if free is None:
            return [examples]
        out: list[list[Example]] = []
        cur: list[Example] = []
        longest = 0
        for ex in examples:
            size = padded_length(len(ex.tokens.input_ids), self.pad_multiple)
            top = max(longest, size)
            if cur and top * (len(cur) + 1) > self._plan(free, top)[0]:
                out.append(cur)
                cur, top = [], size
            cur.append(ex)
            longest = top
        if cur:
            out.append(cur)
        return out

    def _recompute(self, batch: ScoreBatch) -> bool:
        free = _free_bytes(self.ctx.device)
        if free is None:
            return self.recompute == "always"
        return self._plan(free, int(batch.input_ids.shape[1]))[1]

    def _score_pass(self, examples: list[Example]) -> list[Scores]:
        batch = make_batch(examples, self.pad_id, self.ctx.device, self.multiple_for(examples))
        groups = [chunk_ids(len(r), self.chunks) for r in batch.resp]
        if self.ig is None:
            # a, loss, A and c from the gated pass itself (at the kept state it is the bridge pass)
            removal, _, kept = self._gated(batch, groups, keep=True)
            assert kept is not None
            base = self._send(batch, *kept).result()
            effects = self._per_example(batch, groups, removal)
        else:
            # every ig pass is at a gated state: a, A, c come from one plain pass
            base = super().score(examples)
            effects = self.group_effects(batch, groups)  # per example [k, m]
        out = []
        for sc, g, eff in zip(base, groups, effects):
            B = spread(eff, g, sc.a.numpy(), sc.A.numpy())
            out.append(Scores(scorer=self.name, a=sc.a, c=sc.c, A=sc.A, loss=sc.loss, B=Array.of(B, "float32")))
        return out

    def group_effects(self, batch: ScoreBatch, groups: list[np.ndarray]) -> list[np.ndarray]:
        """Per example, [k, m]: the estimated drop of sum_{j in group g} a_j when each eligible
        prompt key is hidden at every layer (k = the number of groups)."""
        if self.ig is None:
            removal, _ = self.gated_grads(batch, groups)
            return self._per_example(batch, groups, removal)
        K, h = self.ig, self.ig_depth
        ts = (np.arange(K) + 0.5) / K  # midpoints of [0, 1]
        parts: list[np.ndarray] = []
        if self.ig_rule == "avg":
            # the AtP* removal estimate at K joint states, averaged
            for t in ts:
                removal, _ = self.gated_grads(batch, groups, self._state(batch, 1.0 - t * h))
                parts.append(removal)
            return self._per_example(batch, groups, _in_order_sum(parts) / K)
        # "path": h * mean_t dM/dg_i along the joint path g = 1 - t h, then AtP* from g = 1 - h
        for t in ts:
            g = 1.0 - t * h
            _, plain = self.gated_grads(batch, groups, self._state(batch, g), plain=True)
            assert plain is not None
            parts.append(plain * (h / (g * K)))  # plain = g dM/dg at every gated key
        if h < 1.0:
            removal, _ = self.gated_grads(batch, groups, self._state(batch, 1.0 - h))
            parts.append(removal)
        return self._per_example(batch, groups, _in_order_sum(parts))

    @staticmethod
    def _state(batch: ScoreBatch, g: float) -> torch.Tensor:
        """[B, L] log gates: log g at every eligible prompt key, 0 elsewhere."""
        B, L = batch.input_ids.shape
        out = torch.zeros(B, L, dtype=torch.float64)
        for b, p in enumerate(batch.prompt):
            out[b, torch.as_tensor(np.asarray(p, dtype=np.int64))] = float(np.log(g))
        return out.to(batch.input_ids.device)

    @staticmethod
    def _per_example(batch: ScoreBatch, groups: list[np.ndarray], stacked: np.ndarray) -> list[np.ndarray]:
        effects: list[np.ndarray] = []
        for b, (p, ids) in enumerate(zip(batch.prompt, groups)):
            k = int(ids.max()) + 1 if len(ids) else 0
            effects.append(stacked[b, :k][:, p].astype(np.float64))
        return effects

    def gated_grads(
        self, batch: ScoreBatch, groups: list[np.ndarray], log_gate: torch.Tensor | None = None, plain: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """One forward (the JVP) and one reverse pass per group, at the gated state ``log_gate``
        (None: every key kept). Returns [B, k, L] arrays: dM_g/db of the removal bias b / (1 - p),
        and, with ``plain``, dM_g/db of a plain bias (= g dM_g/dg), each summed over layers."""
        removal, plains, _ = self._gated(batch, groups, log_gate, plain)
        return removal, plains

    def _gated(
        self,
        batch: ScoreBatch,
        groups: list[np.ndarray],
        log_gate: torch.Tensor | None = None,
        plain: bool = False,
        keep: bool = False,
    ) -> tuple[np.ndarray, np.ndarray | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None]:
        """:meth:`gated_grads`, and with ``keep`` the pass's own per-token losses, a_j and routing
        rows (summed over the capture layers, from its attention probabilities), as the ``bridge``
        scorer's pass computes them."""
        B, L = batch.input_ids.shape
        dev = batch.input_ids.device
        dtype = self.tail_dtype
        recompute = self._recompute(batch)
        with torch.enable_grad(), _frozen(self.ctx.model), differentiable():
            biases = {i: torch.zeros(B, L, device=dev, dtype=dtype, requires_grad=True) for i in self.gate_layers}
            plains = (
                {i: torch.zeros(B, L, device=dev, dtype=dtype, requires_grad=True) for i in self.gate_layers}
                if plain
                else None
            )
            r = Routing(
                math_layers=frozenset(self.gate_layers) | self.tail_set,
                capture_layers=self.capture_layers if keep else frozenset(),
                query_start=batch.query_start,
                right_padded=True,
            )
            a: torch.Tensor | None
            if self.gated_fast is not None:
                gates = {
                    i: LayerGate(biases[i], plains[i] if plains is not None else None, log_gate, recompute)
                    for i in self.gate_layers
                }
                losses, a = self.gated_fast.losses(
                    batch.input_ids,
                    batch.attention_mask,
                    batch.flat_rows(),
                    gates,
                    r,
                    self.lm_head,
                    self.row_chunk,
                    padded=batch.padded,
                    shift=self.shift,
                )
            else:
                losses, a = self._gated_generic(batch, biases, plains, log_gate, recompute, r)
            kept = None
            if keep:
                a_kept = a.detach() if a is not None else torch.zeros_like(losses)
                kept = (losses.detach(), a_kept, r.rows.detach() if r.rows is not None else None)
            removal = [biases[i] for i in self.gate_layers]
            plain_leaves = [plains[i] for i in self.gate_layers] if plains is not None else []
            totals, totals_plain = _group_gradients(a, groups, removal, plain_leaves, (B, L), dtype, dev)

        def stack(ts: list[torch.Tensor]) -> np.ndarray:
            return torch.stack(ts, 1).detach().cpu().numpy() if ts else np.zeros((B, 0, L))  # [B, k, L]

        return stack(totals), (stack(totals_plain) if plain else None), kept

    def _gated_generic(
        self,
        batch: ScoreBatch,
        biases: dict,
        plains: dict | None,
        log_gate: torch.Tensor | None,
        recompute: bool,
        r: Routing,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The gated forward pass through HF's modules (key gate in the registered attention, the
        tail under forward-mode AD): per-token losses and a_j (None where no tangent reached them)."""
        dtype = self.tail_dtype
        with key_gate(biases, plains, log_gate, recompute=recompute), routing(r):
            hidden, calls = self.tail.prefix(batch.input_ids, batch.attention_mask, grad=True, padded=batch.padded)
            if hidden.dtype != dtype:
                hidden, calls = hidden.to(dtype), _cast_floats(calls, dtype)
            with fwAD.dual_level():
                dual = {
                    i: {k: fwAD.make_dual(p, self.tangents[i][k]) for k, p in ps.items()}
                    for i, ps in self.primals.items()
                }
                out = self._losses(dual, hidden, calls, batch.flat_rows())
                losses, a = fwAD.unpack_dual(out)
        return losses, a
