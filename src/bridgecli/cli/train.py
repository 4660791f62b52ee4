from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ..steps.options import TrainOptions as T
from ..training.config import LoraSettings as L
from ..training.config import SFTConfig as C
from ..training.config import default_lr, lora_from_flags
from .options import arg, opt

_LORA = "LoRA (peft)"
_EFF = "Efficiency"
_RUN = "Checkpoints and resume"


def _lora(name: str):
    """A LoRA flag: None when not given (the step refuses one given without --lora), its default shown."""
    return opt(L, name, default=None, show_default=f"{getattr(L(), name)} with --lora", rich_help_panel=_LORA)


def train(
    data: str = arg(T, "data"),
    output: Path = opt(T, "out"),
    model: Optional[str] = opt(T, "model"),
    epochs: float = opt(C, "epochs"),
    lr: Optional[float] = opt(C, "lr", default=None),  # None: default_lr(--lora)
    batch_size: int = opt(C, "batch_size"),
    grad_accum: int = opt(C, "grad_accum"),
    warmup_ratio: float = opt(C, "warmup_ratio"),
    weight_decay: float = opt(C, "weight_decay"),
    max_grad_norm: float = opt(C, "max_grad_norm"),
    max_steps: Optional[int] = opt(C, "max_steps"),
    seed: int = opt(C, "seed"),
    device: str = opt(T, "device"),
    packing: Optional[bool] = opt(C, "packing", rich_help_panel=_EFF),
    max_tokens_per_batch: Optional[int] = opt(C, "max_tokens_per_batch", rich_help_panel=_EFF),
    pack_length: Optional[int] = opt(C, "pack_length", rich_help_panel=_EFF),
    gradient_checkpointing: bool = opt(C, "gradient_checkpointing", rich_help_panel=_EFF),
    lora: bool = opt(C, "lora", default=False, rich_help_panel=_LORA),
    lora_r: Optional[int] = _lora("r"),
    lora_alpha: Optional[int] = _lora("alpha"),
    lora_dropout: Optional[float] = _lora("dropout"),
    lora_targets: Optional[str] = _lora("targets"),
    save_every: Optional[int] = opt(C, "save_every", rich_help_panel=_RUN),
    keep_checkpoints: int = opt(C, "keep_checkpoints", rich_help_panel=_RUN),
    resume: bool = opt(T, "resume", rich_help_panel=_RUN),
    overwrite: bool = opt(T, "overwrite", rich_help_panel=_RUN),
    allow_empty: bool = opt(T, "allow_empty"),
    max_length: Optional[int] = opt(T, "max_length"),
    clip_long_rows: bool = opt(T, "clip_long_rows"),
):
    """SFT from theta_old: AdamW, cosine schedule, token-mean loss over the selected positions of each step.

    Full-parameter by default, LoRA with --lora. Several GPUs: torchrun --nproc-per-node N -m bridgecli train ...
    (or accelerate launch; FSDP through an accelerate config)."""
    from ..steps.train import run_train

    settings = lora_from_flags(lora, lora_targets, r=lora_r, alpha=lora_alpha, dropout=lora_dropout)
    summary = run_train(
        T(
            data=data,
            out=output,
            model=model,
            device=device,
            resume=resume,
            overwrite=overwrite,
            allow_empty=allow_empty,
            max_length=max_length,
            clip_long_rows=clip_long_rows,
            sft=C(
                epochs=epochs,
                lr=lr if lr is not None else default_lr(lora),
                batch_size=batch_size,
                grad_accum=grad_accum,
                warmup_ratio=warmup_ratio,
                weight_decay=weight_decay,
                max_grad_norm=max_grad_norm,
                max_steps=max_steps,
                seed=seed,
                packing=packing,
                max_tokens_per_batch=max_tokens_per_batch,
                pack_length=pack_length,
                gradient_checkpointing=gradient_checkpointing,
                lora=settings,
                save_every=save_every,
                keep_checkpoints=keep_checkpoints or None,
            ),
        )
    )
    if os.environ.get("RANK", "0") == "0" and summary.get("written", True):  # one line, not one per process
        typer.echo(
            f"train: {summary['rows']} rows, {summary['steps']} steps, final loss "
            f"{summary['final_loss'] if summary['final_loss'] is not None else float('nan'):.4f} -> {output}",
            err=True,
        )
