"""Which parameters are "in play": those of the final K transformer blocks."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import ModelError


def decoder_of(model: nn.Module) -> nn.Module:
    get = getattr(model, "get_decoder", None)
    dec = get() if callable(get) else None
    if dec is None:
        dec = getattr(model, "model", None)
    if dec is None:
        raise ModelError(f"cannot find the decoder stack of {type(model).__name__}")
    return dec


def blocks_of(model: nn.Module) -> nn.ModuleList:
    dec = decoder_of(model)
    layers = getattr(dec, "layers", None)
    if isinstance(layers, nn.ModuleList):
        return layers
    n = getattr(model.config, "num_hidden_layers", None)
    for mod in dec.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            return mod
    raise ModelError(f"cannot find the transformer blocks of {type(model).__name__}")


def num_blocks(model: nn.Module) -> int:
    return len(blocks_of(model))


def tail_layer_indices(model: nn.Module, k: int, flag: str = "--attention-layers") -> list[int]:
    """The indices of the final ``k`` blocks; ``flag``: the option that gave ``k``, for the error."""
    n = num_blocks(model)
    if not 1 <= k <= n:
        raise ModelError(f"{flag} must lie in 1..{n} for this model, got {k}")
    return list(range(n - k, n))


def _prefix(model: nn.Module, target: nn.Module) -> str:
    for name, mod in model.named_modules():
        if mod is target:
            return name + "." if name else ""
    raise ModelError("module not found in model")


def tail_parameters(model: nn.Module, k: int) -> dict[str, torch.Tensor]:
    """The parameters of the final ``k`` blocks (``--direction-layers``), keyed by their full names in ``model``."""
    blocks = blocks_of(model)
    prefix = _prefix(model, blocks)
    out: dict[str, torch.Tensor] = {}
    for i in tail_layer_indices(model, k, "--direction-layers"):
        for name, p in blocks[i].named_parameters():
            out[f"{prefix}{i}.{name}"] = p
    return out
