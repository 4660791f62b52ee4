"""a_j in its two parts, for ``bridge analyze decompose`` (docs/diagnostics.md).

v = (1 - lambda) g_target / |g_target| + lambda g_anchor / |g_anchor| is stored whole; its anchor
term is rebuilt from the checkpoint theta_bar and the base model theta_old (g_anchor = theta_bar -
theta_old over v's parameters, as ``bridge warmup`` made it), checked against the norm the warm-up
recorded, and the target term is v minus it. One forward-mode JVP along each term gives the target
part t_j and the anchor part n_j of every response token (a_j = t_j + n_j, by linearity, to float
rounding); u_j = d . (w_{y_j} - W^T p_j) is read from the target pass's LM-head rows when the run holds
its common direction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from ..errors import ModelError
from ..training.direction import flat_norm

if TYPE_CHECKING:
    from ..artifacts.warmup_run import WarmupMeta
    from ..format.records import Example
    from ..modeling.scoring import ScoringContext

#: |g_anchor| rebuilt from theta_old must match the warm-up's record to this relative difference
ANCHOR_TOLERANCE = 1e-4


@dataclass
class SplitDirection:
    """v's two terms over its parameters: ``target`` = (1 - lambda) g_target / |g_target| (v minus
    the anchor term) and ``anchor`` = lambda g_anchor / |g_anchor|; and |g_anchor| as rebuilt."""

    target: dict[str, torch.Tensor]
    anchor: dict[str, torch.Tensor]
    lam: float
    anchor_norm: float


def split_direction(
    v: dict[str, torch.Tensor], g_anchor: dict[str, torch.Tensor], lam: float, eps: float
) -> SplitDirection:
    """The anchor term lambda g_anchor / (|g_anchor| + eps) (in float64, as warmup formed v), and v
    minus it."""
    na = flat_norm(g_anchor)
    anchor = {n: lam * g_anchor[n].double() / (na + eps) for n in v}
    target = {n: (v[n].double() - anchor[n]).float() for n in v}
    return SplitDirection(target, {n: t.float() for n, t in anchor.items()}, lam, na)


def anchor_of(meta: WarmupMeta, theta_bar: dict[str, torch.Tensor], base: str | None = None) -> dict[str, torch.Tensor]:
    """g_anchor = theta_bar - theta_old over ``theta_bar``'s parameters, theta_old loaded from ``base``
    (default: the base model the warm-up recorded), on the host. One :class:`ModelError` line when
    that model is not the warm-up's (its fingerprint, or |g_anchor| against the recorded norm)."""
    from ..modeling.loading import fingerprint, load_model, resolve

    spec = base or meta.base_model
    ref = resolve(spec)
    hint = "pass --base-model with the model the warm-up started from"
    if meta.base_fingerprint and fingerprint(ref) != meta.base_fingerprint:
        raise ModelError(
            f"the base model {spec} is not the one the warm-up started from (its fingerprint differs)", hint=hint
        )
    model = load_model(ref, device="cpu")
    params = dict(model.named_parameters())
    missing = [n for n in theta_bar if n not in params]
    if missing:
        raise ModelError(f"the base model {spec} has no parameter {missing[0]}", hint=hint)
    g = {n: theta_bar[n].detach().float().cpu() - params[n].detach().float() for n in theta_bar}
    del model, params
    recorded = meta.direction.g_anchor_norm if meta.direction is not None else None
    if recorded is not None:
        rebuilt = flat_norm(g)
        if abs(rebuilt - recorded) > ANCHOR_TOLERANCE * max(abs(recorded), 1e-12):
            raise ModelError(
                f"|theta_bar - theta_old| is {rebuilt:.6g} with the base model {spec}, the warm-up recorded {recorded:.6g}",
                hint=hint,
            )
    return g


@dataclass
class Parts:
    """One example's response tokens: the target and anchor parts of a_j, the loss at theta_bar,
    and u_j (None without a common direction)."""

    target: np.ndarray
    anchor: np.ndarray
    loss: np.ndarray
    u: np.ndarray | None


def score_parts(
    ctx: ScoringContext,
    split: SplitDirection,
    examples: Sequence[Example],
    *,
    d: torch.Tensor | None = None,
    batch_size: int = 16,
    on_batch: Callable[[int], None] | None = None,
) -> list[Parts]:
    """The parts of every example's a_j: one bridge-scorer JVP along each term of v (``ctx``'s own
    direction is not used), and u_j on ``d`` from the target pass when ``d`` is given."""
    import dataclasses

    from ..training.common_direction import Projections
    from ..modeling.scoring import BridgeScorer

    plain = {k: v for k, v in ctx.options.items() if k != "scorer_options"}
    # a_j as the paper defines it (no scorer options), and no attention rows beyond one layer's
    on_target = BridgeScorer(dataclasses.replace(ctx, direction=split.target, options=plain, attention_layers=1))
    on_anchor = BridgeScorer(dataclasses.replace(ctx, direction=split.anchor, options=plain, attention_layers=1))
    probe = Projections(ctx.model, d.to(ctx.device)) if d is not None else None
    on_target.head_observer = probe
    out: list[Parts] = []
    for s in range(0, len(examples), batch_size):
        batch = list(examples[s : s + batch_size])
        ts, ns = on_target.score(batch), on_anchor.score(batch)
        u = probe.take() if probe is not None else None
        start = 0
        for t, n in zip(ts, ns):
            assert t.loss is not None  # the bridge scorer stores every token's loss
            k = len(t.a.numpy())
            out.append(
                Parts(
                    target=t.a.numpy().astype(np.float64),
                    anchor=n.a.numpy().astype(np.float64),
                    loss=t.loss.numpy().astype(np.float64),
                    u=u[start : start + k] if u is not None else None,
                )
            )
            start += k
        if on_batch is not None:
            on_batch(len(batch))
    return out
