"""Training hyper-parameters (torch-free, so the CLI can build them without importing torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SFTConfig:
    epochs: float = 3.0
    lr: float = 2e-5
    batch_size: int = 8  # micro-batch (rows per forward)
    grad_accum: int = 8  # micro-batches per optimizer step (effective batch = batch_size * grad_accum)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    max_grad_norm: float = 1.0
    seed: int = 42
    max_steps: int | None = None
    bf16: bool = False


def config_dict(cfg: SFTConfig) -> dict:
    return asdict(cfg)
