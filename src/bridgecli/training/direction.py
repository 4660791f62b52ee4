"""The scoring direction v (docs/method.md, "Warmup and the direction v"); the file it is
stored in is :mod:`bridgecli.artifacts.direction_file`.

v = (1 - lambda) g_target / (||g_target|| + eps) + lambda g_anchor / (||g_anchor|| + eps), over the
parameters of the final K blocks, where g_target is the gradient of the mean validation loss
(all response tokens of D_val) at theta_bar and g_anchor = theta_bar - theta_old.
"""

from __future__ import annotations

import functools
import operator
from typing import Sequence

import torch

from ..artifacts.direction_file import DirectionStats
from ..errors import ModelError
from .rows import Row
from .sft import accumulate


def flat_norm(tensors: dict[str, torch.Tensor]) -> float:
    return float(torch.sqrt(functools.reduce(operator.add, ((t.double() ** 2).sum() for t in tensors.values()))))


def validation_gradient(
    model, rows: Sequence[Row], names: Sequence[str], *, pad_id: int, device="cpu", batch_size: int = 8
) -> tuple[dict[str, torch.Tensor], float, int]:
    """Gradient of the token-mean validation loss w.r.t. the named parameters only.
    Returns (gradient, mean loss, number of loss tokens)."""
    params = dict(model.named_parameters())
    wanted = set(names)
    saved = {n: p.requires_grad for n, p in params.items()}
    for n, p in params.items():
        p.requires_grad_(n in wanted)
    model.eval()
    total_tokens = sum(r.supervised for r in rows)
    if total_tokens == 0:
        raise ModelError("the validation data has no response tokens")
    try:
        model.zero_grad(set_to_none=True)
        chunks = [rows[s : s + batch_size] for s in range(0, len(rows), batch_size)]
        loss_sum = accumulate(model, chunks, pad_id=pad_id, device=device)
        grad = {
            n: params[n].grad.detach().clone() if params[n].grad is not None else torch.zeros_like(params[n])
            for n in names
        }
    finally:
        model.zero_grad(set_to_none=True)
        for n, p in params.items():
            p.requires_grad_(saved[n])
    return grad, loss_sum, total_tokens


def combine(
    g_target: dict[str, torch.Tensor], g_anchor: dict[str, torch.Tensor], lam: float = 0.2, eps: float = 1e-8
) -> tuple[dict[str, torch.Tensor], DirectionStats]:
    nt, na = flat_norm(g_target), flat_norm(g_anchor)
    v = {
        n: ((1 - lam) * g_target[n].double() / (nt + eps) + lam * g_anchor[n].double() / (na + eps)).float()
        for n in g_target
    }
    return v, DirectionStats(lam=lam, eps=eps, g_target_norm=nt, g_anchor_norm=na, v_norm=flat_norm(v))
