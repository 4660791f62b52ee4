"""``direction.safetensors``: the scoring direction v over the final K blocks, with its metadata
(one JSON value per safetensors metadata key)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from ..errors import ModelError

if TYPE_CHECKING:
    import torch

FILENAME = "direction.safetensors"


class DirectionStats(msgspec.Struct, kw_only=True):
    """lambda, eps and the norms behind v, as :func:`bridgecli.training.direction.combine` returns them."""

    lam: float = msgspec.field(name="lambda")
    eps: float
    g_target_norm: float
    g_anchor_norm: float
    v_norm: float


class DirectionMeta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How v was made: lambda, eps and the norms of g_target, g_anchor and v
    (:func:`bridgecli.training.direction.combine`), the number of blocks and the base model. Every
    field is optional: a file that records fewer still reads."""

    lam: float | None = msgspec.field(default=None, name="lambda")
    eps: float | None = None
    g_target_norm: float | None = None
    g_anchor_norm: float | None = None
    v_norm: float | None = None
    layers: int | None = None
    base_model: str | None = None

    @classmethod
    def of(cls, stats: DirectionStats, *, layers: int, base_model: str) -> "DirectionMeta":
        return cls(
            lam=stats.lam,
            eps=stats.eps,
            g_target_norm=stats.g_target_norm,
            g_anchor_norm=stats.g_anchor_norm,
            v_norm=stats.v_norm,
            layers=layers,
            base_model=base_model,
        )


@dataclass
class Direction:
    v: dict[str, "torch.Tensor"]
    meta: DirectionMeta


def direction_path(folder: str | Path) -> Path:
    return Path(folder) / FILENAME


def save_direction(direction: Direction, folder: str | Path) -> Path:
    """Write ``direction`` into ``folder`` (the warmup writer's temporary folder)."""
    from safetensors.torch import save_file

    path = direction_path(folder)
    meta = {k: json.dumps(v) for k, v in msgspec.to_builtins(direction.meta).items()}
    save_file({k: t.contiguous().cpu() for k, t in direction.v.items()}, str(path), metadata=meta)
    return path


def load_direction(folder: str | Path) -> Direction:
    from safetensors import safe_open

    path = direction_path(folder)
    if not path.exists():
        raise ModelError(f"{path} not found", hint="run `bridge warmup` to make it")
    tensors = {}
    with safe_open(str(path), framework="pt") as fh:
        raw = {k: json.loads(v) for k, v in (fh.metadata() or {}).items()}
        for k in fh.keys():
            tensors[k] = fh.get_tensor(k)
    try:
        meta = msgspec.convert(raw, DirectionMeta)
    except msgspec.ValidationError as exc:
        raise ModelError(f"bad direction metadata: {exc}", file=str(path)) from None
    return Direction(tensors, meta)
