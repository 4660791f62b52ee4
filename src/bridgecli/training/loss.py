"""The loss of one micro-batch: the sum of next-token cross-entropies over its supervised positions,
each times its loss weight when the rows carry weights (sft.py normalises it by Z_r).

Memory: the float32 logits of every supervised position at once (n x vocabulary: 1,000 positions of
SmolLM2's 49,152-token vocabulary are 197 MB, and the cross-entropy keeps a second copy for its
backward, a third comes with the gradient) were the largest block of a CPU step after the weights and
AdamW's state. Where the model's forward ends in a plain output head (``logits = lm_head(hidden)``;
:data:`PLAIN_HEAD`), the head runs inside the loss instead, a chunk of positions at a time
(:class:`LinearCrossEntropy`): no more than one chunk's logits (:data:`CHUNK_ELEMENTS`) exist at once,
and the gradients of the hidden states and of the head's weight are made in the same pass, so the
backward computes no logits again. The head is swapped for :class:`_LossHead` only while the forward
runs, inside the model's own forward (and so under accelerate's autocast and DDP's forward, as the head
was). Other models (a head with a bias or LoRA on it, logit soft-capping or scaling, FSDP-sharded
weights) keep the head: it runs on the supervised positions only (a boolean ``logits_to_keep``), or,
for a model whose forward rejects one, on every position."""

from __future__ import annotations

import contextlib
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

from ..modeling.sdpa_backends import training_backends
from .batching import MicroBatch, collate
from .rows import Row

#: architectures whose causal-LM forward ends in ``logits = lm_head(hidden_states[slice])``, with nothing
#: applied to the logits after (tests/test_training_loss.py checks each against the plain loss)
PLAIN_HEAD = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})
#: float32 logits per chunk of :class:`LinearCrossEntropy` (64 MB): 341 positions of a 49,152-token vocabulary
CHUNK_ELEMENTS = 1 << 24

#: models (by id) whose forward rejected a boolean ``logits_to_keep``: full logits for them
_FULL_HEAD: set[int] = set()


class LinearCrossEntropy(torch.autograd.Function):
    """``sum_i w_i * CE(hidden_i @ weight^T, target_i)`` (``w`` all 1 when None), a chunk of ``rows``
    positions at a time: the matmuls in the dtype autocast gives them (as the head's own would run), the
    softmax in float32 (float64 for a float64 model), as the plain path upcasts half-precision logits.
    ``grads``: (of ``hidden``, of ``weight``): the gradients asked for are computed in the same pass
    (softmax - one-hot, times w) and kept for the backward."""

    @staticmethod
    def forward(ctx, hidden, weight, target, target_weight, rows: int, grads: tuple[bool, bool]):
        n = hidden.shape[0]
        wide = torch.float64 if torch.float64 in (hidden.dtype, weight.dtype) else torch.float32
        total = torch.zeros((), dtype=wide, device=hidden.device)
        grad_h = torch.empty_like(hidden) if grads[0] else None
        grad_w = torch.zeros(weight.shape, dtype=wide, device=weight.device) if grads[1] else None
        for s in range(0, n, rows):
            h = hidden[s : s + rows]
            t = target[s : s + rows]
            products = h @ weight.t()
            logits = products.to(wide)
            lse = torch.logsumexp(logits, dim=-1)
            losses = lse - logits.gather(1, t[:, None]).squeeze(1)
            w = None if target_weight is None else target_weight[s : s + rows].to(wide)
            total += (losses * w).sum() if w is not None else losses.sum()
            if grad_h is None and grad_w is None:
                continue
            g = logits.sub_(lse[:, None]).exp_()  # softmax, in the logits' place
            g[torch.arange(len(t), device=g.device), t] -= 1.0
            if w is not None:
                g.mul_(w[:, None])
            g = g.to(products.dtype)
            if grad_h is not None:
                grad_h[s : s + rows] = (g @ weight).to(hidden.dtype)
            if grad_w is None:
                pass
            elif g.dtype == h.dtype == grad_w.dtype and not torch.is_autocast_enabled(g.device.type):
                grad_w.addmm_(g.t(), h)
            else:
                grad_w += (g.t() @ h).to(wide)
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.asked = grads
        return total

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        wanted = ctx.needs_input_grad[:2]
        if any(w and not a for w, a in zip(wanted, ctx.asked)):
            raise RuntimeError("LinearCrossEntropy was not asked for this gradient in its forward (grads)")
        return (
            grad_h * grad_out if wanted[0] else None,
            (grad_w * grad_out).to(ctx.weight_dtype) if wanted[1] else None,
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, target_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """The summed (weighted) cross-entropy of ``hidden @ weight^T`` against ``target``
    (:class:`LinearCrossEntropy`, chunks of :data:`CHUNK_ELEMENTS` logits)."""
    rows = max(1, CHUNK_ELEMENTS // weight.shape[0])
    on = torch.is_grad_enabled()
    return LinearCrossEntropy.apply(
        hidden, weight, target, target_weight, rows, (on and hidden.requires_grad, on and weight.requires_grad)
    )


class _LossHead(torch.nn.Module):
    """Stands in for the output head during one forward: takes the hidden states the head would get
    and returns the micro-batch's loss (shape ``(1, 1)``, where the logits were)."""

    head: torch.nn.Linear
    mb: MicroBatch

    def __init__(self, head: torch.nn.Linear, mb: MicroBatch):
        super().__init__()
        object.__setattr__(self, "head", head)  # not a submodule: the model's parameters stay as they are
        object.__setattr__(self, "mb", mb)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        mb = self.mb
        assert mb.keep is not None and mb.target is not None  # set by MicroBatch.__post_init__
        if hidden.dim() == 3:  # the model sliced no positions: all of them
            hidden = hidden[mb.keep]
        return linear_cross_entropy(hidden, self.head.weight, mb.target, mb.target_weight).reshape(1, 1)


def _unwrapped(model):
    """The model inside a DDP wrapper (accelerate's on several processes), else the model."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) and type(model).__name__ == "DistributedDataParallel" else model


def plain_head(model) -> torch.nn.Linear | None:
    """The model's output head where the loss may run it itself (see the module docstring), else None."""
    inner = _unwrapped(model)
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD or not hasattr(inner, "get_output_embeddings"):
        return None
    if any("FullyShardedDataParallel" in type(m).__name__ for m in (model, inner)):
        return None
    head = inner.get_output_embeddings()
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    weight = head.weight
    if type(weight) is not torch.nn.Parameter or hasattr(weight, "device_mesh") or weight.dim() != 2:
        return None  # a sharded (DTensor) weight: the head's own forward gathers it
    return head


@contextlib.contextmanager
def _head_replaced(model, head: torch.nn.Linear, mb: MicroBatch) -> Iterator[None]:
    inner = _unwrapped(model)
    inner.set_output_embeddings(_LossHead(head, mb))
    try:
        yield
    finally:
        inner.set_output_embeddings(head)


def token_loss_sum(model, mb: MicroBatch) -> torch.Tensor:
    """Sum of next-token cross-entropies over the positions whose (unshifted) label is not -100, each
    times its loss weight when the rows carry weights (see the module docstring for how)."""
    keep, target = mb.keep, mb.target
    assert keep is not None and target is not None  # set by MicroBatch.__post_init__
    kwargs = {"input_ids": mb.input_ids, "use_cache": False}
    if mb.attention_mask is not None:
        kwargs["attention_mask"] = mb.attention_mask
    if mb.position_ids is not None:
        kwargs["position_ids"] = mb.position_ids
    head = plain_head(model)
    if head is not None:
        with _head_replaced(model, head, mb):
            return model(**kwargs).logits.reshape(())
    if id(model) not in _FULL_HEAD:
        try:
            logits = model(**kwargs, logits_to_keep=keep).logits
        except (TypeError, IndexError, ValueError):
            logits = None
        if logits is not None and logits.dim() == 2 and logits.shape[0] == target.shape[0]:
            return weighted_ce(_upcast(logits), target, mb.target_weight)
        _FULL_HEAD.add(id(model))
    logits = model(**kwargs).logits
    return weighted_ce(_upcast(logits[keep]), target, mb.target_weight)


def weighted_ce(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """The summed cross-entropy of ``logits`` (n x vocabulary), each position's times its ``weight``."""
    if weight is None:
        return F.cross_entropy(logits, target, reduction="sum")
    return (F.cross_entropy(logits, target, reduction="none") * weight.to(logits.dtype)).sum()


def _upcast(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits to float32 for the loss; float32/float64 stay as they are."""
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


def dummy_loss(model, mb: MicroBatch) -> torch.Tensor:
    """Zero, but through the whole model: joins a gradient synchronisation with no contribution."""
    return model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits.float().sum() * 0.0


def accumulate(
    model,
    micro_batches: Sequence[Sequence[Row]],
    *,
    pad_id: int,
    device="cpu",
    bf16: bool = False,
    packing: bool = False,
) -> float:
    """Backward over the micro-batches of one optimizer step with the loss normalised by the
    step's total supervised tokens (Z_r), so gradients do not depend on how rows are grouped.
    Returns the step's token-mean loss. (Single process, no accelerate: used for g_target.)"""
    z = max(1, sum(r.supervised for mb in micro_batches for r in mb))
    total = torch.zeros((), dtype=torch.float64)
    with training_backends():
        for rows in micro_batches:
            mb = collate([list(rows)] if packing else [[r] for r in rows], pad_id, packing=packing).to(device)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
                loss = token_loss_sum(model, mb) / z
            loss.backward()
            total += loss.detach().double().cpu()
    return float(total)


__all__ = [
    "CHUNK_ELEMENTS",
    "LinearCrossEntropy",
    "PLAIN_HEAD",
    "accumulate",
    "dummy_loss",
    "linear_cross_entropy",
    "plain_head",
    "token_loss_sum",
    "weighted_ce",
]
