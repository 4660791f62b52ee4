"""``common_direction.safetensors``: D_val's mean output residual d and the slope beta that
``bridge score --scorer-option debias=common`` uses (docs/method.md, "The common direction").

d is the mean over D_val's loss tokens (response tokens and the EOS, the tokens of g_target) of
``w_{y_t} - W^T p_t``: the target token's output embedding minus the expected one under theta_bar's
next-token distribution p_t, read through the LM head W from the final-normed hidden state. A token's
projection on it is ``u_j = d . (w_{y_j} - W^T p_j)``. beta is the least-squares slope (with an
intercept) of a_j on u_j over D_val's response tokens. The metadata (one JSON value per safetensors
metadata key, as in :mod:`.direction_file`) binds the file to its run: the direction v's norms and
lambda, the checkpoint's fingerprint and the LM head's shape, which a reader checks before use
(:meth:`CommonMeta.mismatch`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..errors import ModelError
from .direction_file import DirectionMeta

if TYPE_CHECKING:
    import torch

FILENAME = "common_direction.safetensors"
TENSOR = "mean_residual"


class CommonFit(msgspec.Struct, kw_only=True):
    """What the warm-up measured on D_val: the slope beta and intercept of a_j on u_j over
    ``fit_tokens`` response tokens of ``fit_examples`` examples, their Pearson correlation, and d's
    norm and number of tokens (``residual_tokens``: response tokens and EOS)."""

    beta: float
    intercept: float
    fit_tokens: int
    fit_examples: int
    fit_pearson: float | None = None
    residual_tokens: int
    residual_norm: float


class CommonMeta(msgspec.Struct, kw_only=True):
    """The fit, and what binds d to its run: the LM head's shape, the checkpoint's fingerprint
    (set when the run folder is written) and the direction v's metadata (lambda, norms, blocks)."""

    fit: CommonFit
    hidden_size: int
    vocab_size: int
    checkpoint_fingerprint: str | None = None
    direction: DirectionMeta

    def mismatch(
        self, *, direction: DirectionMeta, hidden_size: int, vocab_size: int, checkpoint_fingerprint: str
    ) -> str | None:
        """Why this d does not belong to a run whose v, LM head and checkpoint are those given; None
        when it does."""
        if (self.hidden_size, self.vocab_size) != (hidden_size, vocab_size):
            return (
                f"it was made for an LM head of {self.vocab_size} x {self.hidden_size}, the checkpoint's is "
                f"{vocab_size} x {hidden_size}"
            )
        if self.checkpoint_fingerprint is not None and self.checkpoint_fingerprint != checkpoint_fingerprint:
            return "it was made with another checkpoint (its fingerprint differs)"
        mine, theirs = msgspec.to_builtins(self.direction), msgspec.to_builtins(direction)
        for key in ("lambda", "g_target_norm", "g_anchor_norm", "v_norm", "layers"):
            if mine.get(key) != theirs.get(key):
                return f"it was made with another direction v ({key} {mine.get(key)} against {theirs.get(key)})"
        return None


@dataclass
class CommonDirection:
    """d (float32 [hidden]) and its metadata."""

    d: "torch.Tensor"
    meta: CommonMeta

    @property
    def beta(self) -> float:
        return self.meta.fit.beta


def common_path(folder: str | Path) -> Path:
    return Path(folder) / FILENAME


def save_common(common: CommonDirection, folder: str | Path) -> Path:
    """Write ``common`` into ``folder`` (the warmup writer's temporary folder)."""
    from safetensors.torch import save_file

    path = common_path(folder)
    meta = {k: json.dumps(v) for k, v in msgspec.to_builtins(common.meta).items()}
    save_file({TENSOR: common.d.detach().float().contiguous().cpu()}, str(path), metadata=meta)
    return path


def load_common(folder: str | Path) -> CommonDirection | None:
    """The file in ``folder``, or None when there is none (a run made before it existed); a damaged
    file is one :class:`ModelError` naming it."""
    from safetensors import safe_open

    path = common_path(folder)
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as fh:
            raw = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
            d = fh.get_tensor(TENSOR)
        meta = msgspec.convert(raw, CommonMeta)
    except msgspec.ValidationError as exc:
        raise ModelError(f"bad common-direction metadata: {exc}", file=str(path)) from None
    except Exception as exc:  # safetensors' own errors (a truncated file, no such tensor)
        raise ModelError(f"cannot read the common direction: {exc}", file=str(path)) from None
    if d.ndim != 1 or d.shape[0] != meta.hidden_size:
        raise ModelError(f"{TENSOR} has shape {list(d.shape)}, expected [{meta.hidden_size}]", file=str(path))
    return CommonDirection(d, meta)
