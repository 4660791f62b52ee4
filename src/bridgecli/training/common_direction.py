"""The common direction of a_j (docs/method.md, "The common direction"): D_val's mean output residual
d, each token's projection u_j on it, and the slope beta of a_j on u_j that ``debias=common``
removes.

g_target is a mean over D_val's tokens of per-token gradients, and each of them enters the model
through the LM head as (p_t - e_{y_t}) W at the final hidden state. Their mean,
-d = mean_t (p_t - e_{y_t}) W, is the one direction in which shifting every final hidden state
lowers the D_val loss; it does not depend on context. A token j whose own output residual
w_{y_j} - W^T p_j lines up with d gets a large a_j whatever its context: u_j = d . (w_{y_j} - W^T p_j)
explains a_j at Pearson 0.83 on the default model (docs/results.md, "Why BRIDGE's selection loses").

The warm-up computes d over D_val's loss tokens (response tokens and the EOS, the tokens of g_target)
by one forward pass without gradients, then a_j and u_j of D_val's response tokens by one scoring
pass, and fits beta by least squares (:func:`bridgecli.analysis.decompose.slope`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ..core.fit import pearson, slope
from ..artifacts.common_file import CommonDirection, CommonFit, CommonMeta
from ..artifacts.direction_file import DirectionMeta
from ..errors import ModelError
from ..modeling.ce_tangent import loss_and_residual, residual_projection
from ..modeling.params import decoder_of

if TYPE_CHECKING:
    from ..format.records import Example
    from .rows import Row


@torch.no_grad()
def mean_residual(
    model, rows: Sequence[Row], *, pad_id: int, device: str, batch_size: int = 8, chunk: int = 1024
) -> tuple[torch.Tensor, int]:
    """(d, tokens): the mean of w_{y_t} - W^T p_t over every loss position of ``rows`` (float64
    accumulation, returned as float32 on the host), p_t the model's next-token distribution read
    from the final-normed hidden state through its LM head."""
    from .batching import collate_padded

    head = model.get_output_embeddings()
    total = torch.zeros(head.weight.shape[1], dtype=torch.float64, device=device)
    n = 0
    was_training = model.training
    model.eval()
    try:
        for s in range(0, len(rows), batch_size):
            mb = collate_padded(rows[s : s + batch_size], pad_id).to(device)
            out = decoder_of(model)(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False)
            assert mb.keep is not None and mb.target is not None  # set by MicroBatch itself
            hk = out.last_hidden_state[mb.keep]
            weight = head.weight.to(hk.dtype)
            bias = head.bias.to(hk.dtype) if getattr(head, "bias", None) is not None else None
            for c in range(0, hk.shape[0], chunk):
                _, qw = loss_and_residual(hk[c : c + chunk], weight, bias, mb.target[c : c + chunk])
                total -= qw.double().sum(0)  # qw = (p - onehot) W = -(w_y - W^T p)
            n += int(hk.shape[0])
    finally:
        model.train(was_training)
    if n == 0:
        raise ModelError("the validation data has no loss tokens")
    return (total / n).float().cpu(), n


class Projections:
    """A :attr:`BridgeScorer.head_observer <bridgecli.modeling.scoring.BridgeScorer.head_observer>`
    collecting u_j = d . (w_{y_j} - W^T p_j) of every response row the scorer's LM head sees, in the
    scorer's row order (example by example, the eligible response tokens in order)."""

    def __init__(self, model, d: torch.Tensor, chunk: int = 1024):
        head = model.get_output_embeddings()
        self.weight = head.weight
        self.bias = getattr(head, "bias", None)
        self.d = d
        self.chunk = chunk
        self.parts: list[np.ndarray] = []

    def __call__(self, h: torch.Tensor, targets: torch.Tensor) -> None:
        w = self.weight.to(h.dtype)
        b = self.bias.to(h.dtype) if self.bias is not None else None
        u = residual_projection(h, w, b, targets, self.d, self.chunk)
        self.parts.append(u.double().cpu().numpy())

    def take(self) -> np.ndarray:
        """Every u collected since the last call, in order."""
        out = np.concatenate(self.parts) if self.parts else np.zeros(0)
        self.parts = []
        return out


def fit(
    model,
    tokenizer,
    v: dict[str, torch.Tensor],
    direction: DirectionMeta,
    val: Sequence[Example],
    val_rows: Sequence[Row],
    *,
    device: str,
    batch_size: int = 8,
    on_batch=None,
) -> CommonDirection:
    """d over ``val_rows``' loss tokens, then a_j (along ``v``) and u_j of ``val``'s response tokens
    by the bridge scorer, and beta by least squares. The model's attention implementation is the
    scorer's meanwhile and restored after. ``on_batch(n)`` after each scoring pass of n examples."""
    from ..modeling.scoring import BridgeScorer, ScoringContext

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    d, n_res = mean_residual(model, list(val_rows), pad_id=pad, device=device, batch_size=batch_size)
    attn = model.config._attn_implementation
    was_training = model.training
    model.eval()
    try:
        # attention rows are not needed: capture one layer's, the fewest there are
        ctx = ScoringContext(model=model, tokenizer=tokenizer, direction=v, attention_layers=1, device=device)
        scorer = BridgeScorer(ctx)
        probe = Projections(model, d.to(device))
        scorer.head_observer = probe
        a_parts = []
        for s in range(0, len(val), batch_size):
            batch = list(val[s : s + batch_size])
            a_parts += [sc.a.numpy().astype(np.float64) for sc in scorer.score(batch)]
            if on_batch is not None:
                on_batch(len(batch))
        a = np.concatenate(a_parts) if a_parts else np.zeros(0)
        u = probe.take()
    finally:
        if attn is not None and hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(attn)
        model.train(was_training)
    if len(a) != len(u):  # pragma: no cover - the observer sees every scored row
        raise ModelError(f"internal: {len(a)} a_j against {len(u)} u_j on D_val")
    beta, intercept = slope(a, u)
    head = model.get_output_embeddings().weight
    meta = CommonMeta(
        fit=CommonFit(
            beta=beta,
            intercept=intercept,
            fit_tokens=int(len(a)),
            fit_examples=len(val),
            fit_pearson=pearson(a, u),
            residual_tokens=n_res,
            residual_norm=float(d.double().norm()),
        ),
        hidden_size=int(head.shape[1]),
        vocab_size=int(head.shape[0]),
        direction=direction,
    )
    return CommonDirection(d, meta)
