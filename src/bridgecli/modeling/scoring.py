"""The BRIDGE scoring pass: a_j by one forward-mode JVP along v, and the routing rows A, c.

For a batch, the per-token losses l_j of every eligible response token are a function of the
tail-block parameters; forward-mode AD (``torch.autograd.forward_ad``, the parameters made dual
with tangent v) gives all a_j = v . grad l_j in one pass. The blocks before the tail run once
without tangents (tail.py). The
same forward pass captures the head-averaged attention rows of the routing layers for the
response query rows (see attention.py); A[j, i] are the columns of eligible prompt positions and
c_j the mass on earlier response tokens.

``--scorer-option debias=common`` scores a_j - beta u_j instead (docs/method.md, "The common
direction"), with u_j = d . (w_{y_j} - W^T p_j) and d, beta from the warm-up run
(``common_direction.safetensors``). Since the LM head's loss gradient with respect to the final hidden
state is (p_j - e_{y_j}) W = -(w_{y_j} - W^T p_j), a_j - beta u_j is the loss's tangent along the
final hidden state's tangent plus the constant beta d: every path (the fused Llama tail, forward-mode
AD, the ``atp`` scorer's gated passes) adds ``beta d`` to the response rows' tangent before the LM
head, in plain torch ops, and computes the rest as before. No extra pass, no extra LM-head product.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import msgspec
import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F

from ..artifacts.common_file import FILENAME as COMMON_FILE
from ..artifacts.common_file import CommonDirection
from ..artifacts.direction_file import Direction
from ..artifacts.warmup_run import WarmupMeta, WarmupRun
from ..format.records import Array, Example, Scores
from . import dual_llama, jvp_attention
from .ce_tangent import token_ce_with_tangent
from .attention import Routing, routing, use_bridge_attention
from .score_batch import ScoreBatch, make_batch
from .sdpa_backends import batch_backends
from ..errors import ModelError, UsageError
from .params import blocks_of, tail_layer_indices
from .tail import Tail

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


#: the values of ``--scorer-option debias=...``: a_j as the paper defines it, or a_j - beta u_j
DEBIAS = ("none", "common")


@dataclass
class ScoringCheckpoint:
    """A warmup run loaded for scoring: its record, the checkpoint (eval mode), its tokenizer and
    that tokenizer's fingerprint, and v."""

    run: WarmupRun
    meta: WarmupMeta
    tokenizer: PreTrainedTokenizerBase
    tokenizer_fingerprint: str
    model: PreTrainedModel
    direction: Direction

    def identity(self) -> dict[str, Any]:
        """What names this checkpoint in a scores stream: the base model and its fingerprint (warmup's, else
        computed), the tokenizer's fingerprint, the checkpoint's own fingerprint, v's blocks and lambda."""
        from .loading import fingerprint, resolve

        meta = self.meta
        return {
            "base_model": meta.base_model,
            "base_fingerprint": meta.base_fingerprint or fingerprint(resolve(meta.base_model)),
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "checkpoint_fingerprint": fingerprint(resolve(str(self.run.checkpoint))),
            "direction_layers": self.direction.meta.layers,
            "lambda": self.direction.meta.lam,
        }

    def context(self, attention_layers: int, device: str, options: dict | None = None) -> ScoringContext:
        """What a scorer gets from this checkpoint: its model, tokenizer and v, with the settings, and
        the run's common direction on demand."""
        return ScoringContext(
            model=self.model,
            tokenizer=self.tokenizer,
            direction=self.direction.v,
            attention_layers=attention_layers,
            device=device,
            options=options or {},
            common=self.common_direction,
        )

    def common_direction(self) -> CommonDirection:
        """The run's D_val mean residual d and beta, checked against this checkpoint and v; one
        :class:`ModelError` line when the run has none (made before warmup stored it) or when the
        file belongs to another run."""
        from .loading import fingerprint, resolve

        common = self.run.common_direction()
        path = str(self.run.common_path)
        if common is None:
            raise ModelError(
                f"{self.run.root} holds no {COMMON_FILE} (D_val's mean residual), which debias=common needs: "
                "the run was made before `bridge warmup` stored it",
                hint="rerun `bridge warmup`, whose run folder holds it; plain scoring from this run still works",
            )
        head = self.model.get_output_embeddings().weight
        why = common.meta.mismatch(
            direction=self.direction.meta,
            hidden_size=int(head.shape[1]),
            vocab_size=int(head.shape[0]),
            checkpoint_fingerprint=fingerprint(resolve(str(self.run.checkpoint))),
        )
        if why is not None:
            raise ModelError(f"not this run's common direction: {why}", file=path, hint="rerun `bridge warmup`")
        return common


def load_scoring_checkpoint(run: WarmupRun, dtype: str, device: str) -> ScoringCheckpoint:
    """A warmup run's checkpoint, tokenizer and v, checked against each other: the tokenizer warmup
    recorded, every direction parameter present in the model."""
    from .loading import load_model, load_tokenizer, tokenizer_fingerprint

    meta = run.meta()
    tokenizer = load_tokenizer(str(run.checkpoint))
    tok_fp = tokenizer_fingerprint(tokenizer)
    if meta.tokenizer_fingerprint and meta.tokenizer_fingerprint != tok_fp:
        raise ModelError("the checkpoint's tokenizer differs from the one warmup recorded", file=str(run.root))
    model = load_model(str(run.checkpoint), dtype=getattr(torch, dtype), device=device)
    model.eval()
    direction = run.direction()
    params = dict(model.named_parameters())
    missing = [n for n in direction.v if n not in params]
    if missing:
        raise ModelError(f"direction parameter {missing[0]} is not in the checkpoint", file=str(run.root))
    return ScoringCheckpoint(run, meta, tokenizer, tok_fp, model, direction)


@dataclass
class ScoringContext:
    """Everything a scorer needs: the scoring checkpoint, its tokenizer, the direction v."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    direction: dict[str, torch.Tensor]  # full parameter name -> v component
    attention_layers: int = 4
    device: str = "cpu"
    options: dict = field(default_factory=dict)
    #: the warm-up run's common direction, loaded and checked on demand (``debias=common``); None:
    #: the context has none (raised as one error line when asked for)
    common: Callable[[], CommonDirection] | None = None


def _rows_on_device(routing_rows: torch.Tensor, batch: ScoreBatch, n_layers: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every eligible response token's A row [N, m_max] (float16) and c [N] (float32), on the device."""
    rows = routing_rows[batch.b_idx, batch.q_pos - batch.query_start] / n_layers  # [N, L]
    A_all = rows.gather(1, batch.prompt_cols[batch.b_idx]).to(torch.float16)  # [N, m_max]
    hist = rows.gather(1, batch.resp_cols[batch.b_idx])  # [N, n_max]
    earlier = torch.arange(hist.shape[1], device=hist.device)[None, :] < batch.j_local[:, None]
    c_all = (hist * earlier).sum(1).float()
    return A_all, c_all


def _cut(A_host: np.ndarray, c_host: np.ndarray, batch: ScoreBatch) -> list[tuple[np.ndarray, np.ndarray]]:
    out, start = [], 0
    for p, r in zip(batch.prompt, batch.resp):
        n, m = len(r), len(p)
        out.append((A_host[start : start + n, :m], c_host[start : start + n]))
        start += n
    return out


def split_rows(routing_rows: torch.Tensor, batch: ScoreBatch, n_layers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """From summed captured rows [B, Lq', L] to per-example (A [n, m] float16, c [n] float32),
    gathered on the device and moved to the host in one transfer each."""
    A_all, c_all = _rows_on_device(routing_rows, batch, n_layers)
    return _cut(A_all.cpu().numpy(), c_all.cpu().numpy(), batch)


class PendingScores:
    """A batch's scores while the device still computes them: the results were gathered into a few
    tensors and their copies to (pinned) host memory queued behind the batch's kernels, so the host
    may prepare the next batch meanwhile. :meth:`result` waits for the copies and makes the records."""

    def __init__(self, name: str, batch: ScoreBatch, tensors: list[torch.Tensor]):
        self.name = name
        self.batch = batch
        self.event = None
        if tensors and tensors[0].is_cuda:
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
            for h, t in zip(host, tensors):
                h.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
            tensors = host
        self.tensors = tensors

    def result(self) -> list[Scores]:
        if self.event is not None:
            self.event.synchronize()
        A_host, c_host, a_np, l_np = (t.numpy() for t in self.tensors)
        out = []
        start = 0
        for A, c in _cut(A_host, c_host, self.batch):
            sl = slice(start, start + len(c))
            out.append(
                Scores(
                    scorer=self.name,
                    a=Array.of(a_np[sl]),
                    c=Array.of(c),
                    A=Array.of(A, "float16"),
                    loss=Array.of(l_np[sl]),
                )
            )
            start += len(c)
        return out


class DoneScores:
    """Scores already on the host (a scorer without a queued path)."""

    def __init__(self, scores: list[Scores]):
        self.scores = scores

    def result(self) -> list[Scores]:
        return self.scores


class BridgeScorer:
    """The default scorer: the first blocks once without tangents, then one JVP over the final
    blocks along v (no per-token backward); the LM head runs on response rows only."""

    name = "bridge"
    #: the keys this scorer takes from ``bridge score --scorer-option KEY=VALUE``
    OPTIONS: tuple[str, ...] = ("debias",)

    def __init__(self, ctx: ScoringContext):
        self.ctx = ctx
        unknown = sorted(set(ctx.options.get("scorer_options") or {}) - set(self.OPTIONS))
        if unknown:
            takes = ", ".join(f"{k}=..." for k in self.OPTIONS) or "none"
            raise UsageError(f"unknown option {unknown[0]!r} (scorer options: {takes})")
        #: called with every batch's final-normed response rows and their targets before the LM head
        #: (the warm-up's fit and ``analyze decompose`` read u_j there); the ``atp`` scorer's gated
        #: passes do not call it
        self.head_observer: Callable[[torch.Tensor, torch.Tensor], None] | None = None
        model = ctx.model
        use_bridge_attention(model)
        blocks = blocks_of(model)
        params = dict(model.named_parameters())
        prefix = _blocks_prefix(model, blocks)
        # precision policy: the prefix may run under autocast, the tail in its own dtype
        self.prefix_autocast = ctx.options.get("prefix_autocast")
        self.tail_dtype = ctx.options.get("tail_dtype") or next(model.parameters()).dtype
        self.primals: dict[int, dict[str, torch.Tensor]] = {}
        self.tangents: dict[int, dict[str, torch.Tensor]] = {}
        for full, vec in ctx.direction.items():
            if not full.startswith(prefix):
                raise ModelError(f"direction parameter {full} is not inside a transformer block")
            idx, rel = full[len(prefix) :].split(".", 1)
            p = params[full]
            self.primals.setdefault(int(idx), {})[rel] = p.detach().to(self.tail_dtype)
            self.tangents.setdefault(int(idx), {})[rel] = vec.to(device=p.device, dtype=self.tail_dtype)
        self.tail = Tail(model, sorted(self.primals))
        self.tail_set = frozenset(self.tail.indices)
        self.capture_layers = frozenset(tail_layer_indices(model, ctx.attention_layers))
        self.lm_head = model.get_output_embeddings()
        self.row_chunk = int(ctx.options.get("lm_head_rows", 4096))
        # a plain linear head (no logit soft-capping or scaling) gets the analytic CE tangent
        self.plain_head = (
            type(self.lm_head) is torch.nn.Linear
            and getattr(model.config, "final_logit_softcapping", None) is None
            and getattr(model.config, "logit_scale", None) is None
        )
        self.pad_id = ctx.tokenizer.pad_token_id if ctx.tokenizer.pad_token_id is not None else 0
        #: ``debias=common``: the run's common direction, and beta d added to the head rows' tangent
        self.common, self.shift = self._debias(dict(ctx.options.get("scorer_options") or {}))
        #: what ``bridge score`` records beside the scorer options: with ``debias=common``, beta and the fit
        #: it came from (a plain attribute, as the Scorer protocol declares it)
        self.header_params: dict[str, Any] | None = (
            None
            if self.common is None
            else {"debias": {"mode": "common", "file": COMMON_FILE, **msgspec.to_builtins(self.common.meta.fit)}}
        )
        # Llama-family tails get the hand-fused (primal, tangent) pass; others use forward-mode AD
        self.fast: dual_llama.DualLlamaTail | None = None
        if ctx.options.get("fast_tail", True) and self.plain_head and dual_llama.supported(model, blocks):
            self.fast = dual_llama.DualLlamaTail(blocks, self.tail.indices, self.primals, self.tangents, self.tail.norm)

    def _debias(self, opts: dict) -> tuple[CommonDirection | None, torch.Tensor | None]:
        mode = str(opts.get("debias", "none"))
        if mode not in DEBIAS:
            raise UsageError(f"debias must be one of {', '.join(DEBIAS)}, got {mode!r}")
        if mode == "none":
            return None, None
        if self.ctx.common is None:
            raise UsageError("debias=common needs a warm-up run's common direction, and this scorer was given none")
        common = self.ctx.common()
        dtype = torch.promote_types(self.tail_dtype, torch.float32)
        return common, (common.beta * common.d.double()).to(device=self.ctx.device, dtype=dtype)

    def _head_rows(self, h: torch.Tensor, dh: torch.Tensor | None, targets: torch.Tensor):
        """The response rows' hidden state and tangent as the LM head gets them: shown to the
        :attr:`head_observer`, and the tangent shifted by beta d under ``debias=common``."""
        if self.head_observer is not None:
            self.head_observer(h.detach(), targets)
        if self.shift is not None:
            dh = (dh if dh is not None else torch.zeros_like(h)).to(self.shift.dtype) + self.shift
        return h, dh

    def _routing(self, batch: ScoreBatch, layers: frozenset[int]) -> Routing:
        return Routing(
            math_layers=layers,
            capture_layers=self.capture_layers & layers,
            query_start=batch.query_start,
            right_padded=True,
        )

    def _prefix(self, batch: ScoreBatch):
        r = self._routing(batch, self.capture_layers - self.tail_set)
        dev = batch.input_ids.device.type
        with (
            routing(r),
            torch.autocast(dev, dtype=self.prefix_autocast or torch.bfloat16, enabled=self.prefix_autocast is not None),
        ):
            hidden, calls = self.tail.prefix(batch.input_ids, batch.attention_mask, padded=batch.padded)
        if hidden.dtype != self.tail_dtype:
            hidden, calls = hidden.to(self.tail_dtype), _cast_floats(calls, self.tail_dtype)
        return hidden, calls, r.rows

    def _losses(self, params, hidden, calls, rows) -> torch.Tensor:
        h = self.tail.run(params, hidden, calls)
        b_idx, q_pos, tgt = rows
        hr = h[b_idx, q_pos].to(self.tail_dtype)
        primal, tangent = fwAD.unpack_dual(hr)
        if self.head_observer is not None or self.shift is not None:
            primal, tangent = self._head_rows(primal, tangent, tgt)
            if tangent is not None and not self.plain_head:  # the head below under forward-mode AD
                hr = fwAD.make_dual(primal, tangent.to(primal.dtype))
        if tangent is not None and self.plain_head:
            weight, bias = self.lm_head.weight.to(self.tail_dtype), self.lm_head.bias
            bias = bias.to(self.tail_dtype) if bias is not None else None
            return fwAD.make_dual(*token_ce_with_tangent(primal, tangent, weight, bias, tgt, self.row_chunk))
        out = []
        for s in range(0, hr.shape[0], self.row_chunk):
            logits = self.lm_head(hr[s : s + self.row_chunk]).float()
            out.append(F.cross_entropy(logits, tgt[s : s + self.row_chunk], reduction="none"))
        return torch.cat(out) if out else hr.new_zeros(0, dtype=torch.float32)

    def _tail(self, batch: ScoreBatch, params, hidden, calls):
        """Per-token losses through the tail and the tail's captured routing rows."""
        r = self._routing(batch, self.tail_set)
        with routing(r):
            losses = self._losses(params, hidden, calls, batch.flat_rows())
        return losses, r.rows

    def _fast_tail(self, batch: ScoreBatch, hidden, calls):
        assert self.fast is not None  # score() takes this path only then
        r = self._routing(batch, self.tail_set)

        def on_rows(q, k, lse, scale):
            r.add(jvp_attention.routing_rows(q, k, lse, scale, r.query_start))

        h, dh = self.fast.run(hidden, calls, self.capture_layers, on_rows)
        b_idx, q_pos, tgt = batch.flat_rows()
        weight = self.lm_head.weight.to(self.tail_dtype)
        bias = self.lm_head.bias.to(self.tail_dtype) if self.lm_head.bias is not None else None
        hr, dhr = self._head_rows(h[b_idx, q_pos], dh[b_idx, q_pos], tgt)
        losses, a = token_ce_with_tangent(hr, dhr, weight, bias, tgt, self.row_chunk)
        return losses, a, r.rows

    def score(self, examples: list[Example]) -> list[Scores]:
        return self._launch(examples).result()

    def launch(self, examples: list[Example]) -> PendingScores | DoneScores:
        """Queue a batch's device work and return at once (on a GPU); ``.result()`` gives what
        :meth:`score` returns. A subclass that scores its own way (overrides :meth:`score`) is
        served by that, synchronously."""
        if type(self).score is not BridgeScorer.score:
            return DoneScores(self.score(examples))
        return self._launch(examples)

    @torch.no_grad()
    def _launch(self, examples: list[Example]) -> PendingScores:
        batch = make_batch(examples, self.pad_id, self.ctx.device)
        with batch_backends(int(batch.input_ids.shape[1])):
            return self._launch_batch(batch)

    def _launch_batch(self, batch: ScoreBatch) -> PendingScores:
        hidden, calls, prefix_rows = self._prefix(batch)
        if self.fast is not None:
            losses, a, tail_rows = self._fast_tail(batch, hidden, calls)
            return self._send(batch, losses, a, _sum_rows(prefix_rows, tail_rows))
        with fwAD.dual_level():
            dual = {
                i: {k: fwAD.make_dual(p, self.tangents[i][k]) for k, p in ps.items()} for i, ps in self.primals.items()
            }
            out, tail_rows = self._tail(batch, dual, hidden, calls)
            losses, a = fwAD.unpack_dual(out)
        if a is None:  # no tangent reached the losses (v is zero on every parameter in play)
            a = torch.zeros_like(losses)
        return self._send(batch, losses, a, _sum_rows(prefix_rows, tail_rows))

    def _send(self, batch, losses, a, rows) -> PendingScores:
        A_all, c_all = _rows_on_device(rows, batch, len(self.capture_layers))
        return PendingScores(self.name, batch, [A_all, c_all, a.float(), losses.float()])

    def _pack(self, batch, losses, a, rows) -> list[Scores]:
        return self._send(batch, losses, a, rows).result()


class ExactScorer(BridgeScorer):
    """Diagnostic reference: a_j by one backward pass per response token (slow, exact)."""

    name = "exact"
    #: a_j as the paper defines it, for the diagnostics (no ``debias``)
    OPTIONS: tuple[str, ...] = ()

    def score(self, examples: list[Example]) -> list[Scores]:
        batch = make_batch(examples, self.pad_id, self.ctx.device)
        with torch.no_grad():
            hidden, calls, prefix_rows = self._prefix(batch)
        params = {i: {k: v.clone().requires_grad_(True) for k, v in p.items()} for i, p in self.primals.items()}
        flat = [(i, k) for i, p in params.items() for k in p]
        with torch.enable_grad():
            losses, tail_rows = self._tail(batch, params, hidden, calls)
            a = torch.empty_like(losses)
            for j in range(losses.shape[0]):
                grads = torch.autograd.grad(
                    losses[j], [params[i][k] for i, k in flat], retain_graph=True, allow_unused=True
                )
                a[j] = sum((g * self.tangents[i][k]).sum() for g, (i, k) in zip(grads, flat) if g is not None)
        rows = _sum_rows(prefix_rows, tail_rows.detach() if tail_rows is not None else None)
        return self._pack(batch, losses.detach(), a.detach(), rows)


def _cast_floats(obj, dtype):
    """Cast every floating tensor inside (nested) tuples/lists/dicts/TailCalls to ``dtype``."""
    from dataclasses import is_dataclass, replace

    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_floats(x, dtype) for x in obj)
    if isinstance(obj, dict):
        return {k: _cast_floats(v, dtype) for k, v in obj.items()}
    if is_dataclass(obj):
        return replace(obj, args=_cast_floats(obj.args, dtype), kwargs=_cast_floats(obj.kwargs, dtype))
    return obj


def _sum_rows(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def _blocks_prefix(model, blocks) -> str:
    for name, mod in model.named_modules():
        if mod is blocks:
            return name + "."
    raise ModelError("cannot locate the transformer blocks")
