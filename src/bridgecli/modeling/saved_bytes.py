"""Bytes the atp scorer's gated pass keeps for its reverse pass, measured.

``saved_bytes`` runs ``scorer.gated_grads`` under ``torch.autograd.graph.saved_tensors_hooks`` and
sums the storages the pass saves, by component (gated blocks before the tail, tail blocks with their
tangents, the L x L tensors of each, the LM head, the rest). It is the measurement the memory model
(``attribution.token_bytes``) was fit to: tests/test_attribution_cost.py checks that the model bounds
it, and ``bench/score/bench_atp.py --saved-bytes`` reports it for the real shapes (docs/benchmarks.md).
While it runs it relabels the gated blocks' ``__call__`` and ``scoring.token_ce_with_tangent``, and
restores them after: do not call it while another thread scores.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from bridgecli.modeling import gated_llama, scoring
from bridgecli.modeling.attribution import AttributionScorer
from bridgecli.modeling.params import blocks_of


def saved_bytes(scorer: AttributionScorer, batch, groups) -> dict[str, int]:
    """Bytes of the tensors the gated pass (``scorer.gated_grads``) saves for its reverse pass, by
    component: each storage counted once, the model's parameters, v and the fast path's fused weights
    left out, tensors saved while a reverse pass recomputes left out."""
    label = ["other"]
    blocks = blocks_of(scorer.ctx.model)
    handles = []
    for i, blk in enumerate(blocks):
        name = "tail" if i in scorer.tail_set else "prefix"
        handles.append(blk.register_forward_pre_hook(lambda m, a, name=name: label.__setitem__(0, name)))
        handles.append(blk.register_forward_hook(lambda m, a, o: label.__setitem__(0, "other")))
    # the hand-written gated pass (gated_llama.py) calls no HF block from its first gated block on
    block_calls = {cls: cls.__call__ for cls in (gated_llama.GatedBlock, gated_llama.GatedDualBlock)}

    def labelled(cls, name):
        def call(*args, **kwargs):
            label[0] = name
            try:
                return block_calls[cls](*args, **kwargs)
            finally:
                label[0] = "other"

        return call

    gated_llama.GatedBlock.__call__ = labelled(gated_llama.GatedBlock, "prefix")  # type: ignore[method-assign]
    gated_llama.GatedDualBlock.__call__ = labelled(gated_llama.GatedDualBlock, "tail")  # type: ignore[method-assign]
    head_fn = scoring.token_ce_with_tangent

    def head(*args, **kwargs):
        label[0] = "lm_head"
        try:
            return head_fn(*args, **kwargs)
        finally:
            label[0] = "other"

    def ptr(t: torch.Tensor) -> int:
        try:
            return t.untyped_storage().data_ptr()
        except RuntimeError:  # a few views of forward-AD tangents
            return t.data_ptr()

    own = {ptr(p) for p in scorer.ctx.model.parameters()}
    own |= {ptr(t) for d in (scorer.primals, scorer.tangents) for ps in d.values() for t in ps.values()}
    if scorer.gated_fast is not None:  # its fused weights, made once per scorer
        own |= {ptr(t) for t in scorer.gated_fast.weights()}
    L = batch.input_ids.shape[1]
    seen: dict[int, tuple[str, int]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() != -1:  # inside a reverse pass (recomputation)
            return t
        p = ptr(t)
        if p and p not in own and p not in seen:
            lxl = t.dim() >= 2 and t.shape[-1] == L and t.shape[-2] == L
            try:
                nbytes = t.untyped_storage().nbytes()
            except RuntimeError:
                nbytes = t.numel() * t.element_size()
            seen[p] = (label[0] + (" LxL" if lxl else ""), nbytes)
        return t

    scoring.token_ce_with_tangent = head
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            scorer.gated_grads(batch, groups)
    finally:
        scoring.token_ce_with_tangent = head_fn
        for cls, fn in block_calls.items():
            cls.__call__ = fn  # type: ignore[method-assign]
        for h in handles:
            h.remove()
    out: dict[str, int] = defaultdict(int)
    for comp, nbytes in seen.values():
        out[comp] += nbytes
    return dict(out)
