"""Training hyper-parameters (torch-free, so the CLI can build them without importing torch)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

#: LoRA target modules when --lora-targets is not given: every linear layer but the output head.
ALL_LINEAR = "all-linear"


@dataclass
class LoraSettings:
    """LoRA through peft (``bridge train --lora``)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: list[str] | str = ALL_LINEAR


@dataclass
class SFTConfig:
    epochs: float = 3.0
    lr: float = 2e-5
    #: rows per micro-batch when ``max_tokens_per_batch`` is not set
    batch_size: int = 8
    #: the optimizer step takes ``batch_size * grad_accum`` rows (paper: 64 = 8 x 8)
    grad_accum: int = 8
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    max_grad_norm: float = 1.0
    seed: int = 42
    max_steps: int | None = None
    bf16: bool = False
    #: padding-free packing (True), length bucketing (False), or packing where verified (None)
    packing: bool | None = None
    #: cap micro-batches by tokens (packed: sum of lengths; bucketed: rows x longest) instead of rows
    max_tokens_per_batch: int | None = None
    #: longest packed line (None: the longest row, rounded up to 64; one line with flash attention)
    pack_length: int | None = None
    gradient_checkpointing: bool = False
    lora: LoraSettings | None = None
    #: checkpoint every N optimizer steps into OUT/checkpoints/step-NNNNNN (0/None: never)
    save_every: int | None = None
    #: complete checkpoints kept (oldest removed first; None keeps all)
    keep_checkpoints: int | None = 2

    @property
    def rows_per_step(self) -> int:
        return self.batch_size * self.grad_accum


#: Settings that may change between a checkpoint and ``--resume``: they change how a step is cut
#: into micro-batches or how often it is saved, not what the step computes.
RESUMABLE_CHANGES = ("packing", "max_tokens_per_batch", "pack_length", "gradient_checkpointing", "save_every",
                     "keep_checkpoints")


def config_dict(cfg: SFTConfig) -> dict:
    return asdict(cfg)


def lora_settings(targets: str | None = None, **kw) -> LoraSettings:
    """Build :class:`LoraSettings` from CLI strings (``q_proj,v_proj`` or ``all-linear``)."""
    if targets is None or targets.strip() in ("", ALL_LINEAR):
        return LoraSettings(targets=ALL_LINEAR, **kw)
    return LoraSettings(targets=[t.strip() for t in targets.split(",") if t.strip()], **kw)


__all__ = ["ALL_LINEAR", "LoraSettings", "RESUMABLE_CHANGES", "SFTConfig", "config_dict", "lora_settings"]
