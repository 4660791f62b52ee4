from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..training.config import SFTConfig, lora_settings
from .options import AllowEmpty, Device, Model, Seed

_LORA = "LoRA (peft)"
_EFF = "Efficiency"
_RUN = "Checkpoints and resume"


def train(
    data: Annotated[str, typer.Argument(help="JSONL rows with input_ids and labels (what `bridge compact` writes).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Run folder: the trained HF model, metrics.jsonl, checkpoints/.")] = Path("runs/final"),
    model: Model = None,
    epochs: Annotated[float, typer.Option(help="Epochs (paper: 3).")] = 3.0,
    lr: Annotated[Optional[float], typer.Option(help="Peak learning rate (default: paper's 2e-5; 2e-4 with --lora).")] = None,
    batch_size: Annotated[int, typer.Option(help="Rows per micro-batch (without --max-tokens-per-batch).")] = 8,
    grad_accum: Annotated[int, typer.Option(help="Rows per optimizer step = batch-size x grad-accum (paper: 64 = 8 x 8).")] = 8,
    warmup_ratio: Annotated[float, typer.Option(help="Linear warmup fraction before the cosine decay.")] = 0.03,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    max_grad_norm: Annotated[float, typer.Option(help="Gradient clipping (total norm).")] = 1.0,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many optimizer steps.")] = None,
    seed: Seed = 42,
    device: Device = "auto",
    packing: Annotated[Optional[bool], typer.Option(
        "--packing/--no-packing", rich_help_panel=_EFF,
        help="Padding-free packing (position ids restart per row, no cross-row attention) or length bucketing. "
             "Default: pack when a packed forward matches separate forwards for this model.")] = None,
    max_tokens_per_batch: Annotated[Optional[int], typer.Option(
        rich_help_panel=_EFF, help="Cut micro-batches by computed tokens (lines x longest line) instead of --batch-size "
                                   "rows. The step keeps batch-size x grad-accum rows, so the loss does not change.")] = None,
    pack_length: Annotated[Optional[int], typer.Option(
        rich_help_panel=_EFF, help="Longest packed line (default: the longest row, rounded up to 64; one line per "
                                   "micro-batch with flash attention).")] = None,
    gradient_checkpointing: Annotated[bool, typer.Option(rich_help_panel=_EFF, help="Recompute activations in backward (less memory).")] = False,
    lora: Annotated[bool, typer.Option("--lora", rich_help_panel=_LORA, help="Train LoRA adapters instead of all parameters; saves OUT/adapter and the merged model in OUT.")] = False,
    lora_r: Annotated[int, typer.Option(rich_help_panel=_LORA, help="LoRA rank.")] = 16,
    lora_alpha: Annotated[int, typer.Option(rich_help_panel=_LORA, help="LoRA alpha (scale alpha / r).")] = 32,
    lora_dropout: Annotated[float, typer.Option(rich_help_panel=_LORA, help="Dropout on the LoRA input.")] = 0.05,
    lora_targets: Annotated[str, typer.Option(rich_help_panel=_LORA, help="Comma-separated module names (q_proj,k_proj,v_proj,o_proj,...) or all-linear.")] = "all-linear",
    save_every: Annotated[Optional[int], typer.Option(rich_help_panel=_RUN, help="Checkpoint every N optimizer steps into OUT/checkpoints/step-NNNNNN.")] = None,
    keep_checkpoints: Annotated[int, typer.Option(rich_help_panel=_RUN, help="Complete checkpoints kept (0: all).")] = 2,
    resume: Annotated[bool, typer.Option("--resume", rich_help_panel=_RUN, help="Continue from the latest complete checkpoint in OUT (start fresh when there is none).")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", rich_help_panel=_RUN, help="Start over in an OUT that holds checkpoints of another run.")] = False,
    allow_empty: AllowEmpty = False,
):
    """SFT from theta_old: AdamW, cosine schedule, token-mean loss over the selected positions of each step.

    Full-parameter by default, LoRA with --lora. Several GPUs: torchrun --nproc-per-node N -m bridgecli train ...
    (or accelerate launch; FSDP through an accelerate config)."""
    from ..errors import UsageError
    from ..steps.train import TrainOptions, run_train

    for name, value in (("--batch-size", batch_size), ("--grad-accum", grad_accum), ("--lora-r", lora_r)):
        if value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    for name, value in (("--max-tokens-per-batch", max_tokens_per_batch), ("--pack-length", pack_length)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, got {value}")
    if save_every is not None and save_every < 1:
        raise UsageError(f"--save-every must be at least 1, got {save_every}")
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    settings = lora_settings(lora_targets, r=lora_r, alpha=lora_alpha, dropout=lora_dropout) if lora else None
    summary = run_train(TrainOptions(
        data=data, out=output, model=model, device=device, resume=resume, overwrite=overwrite, allow_empty=allow_empty,
        sft=SFTConfig(epochs=epochs, lr=lr if lr is not None else (2e-4 if lora else 2e-5), batch_size=batch_size,
                      grad_accum=grad_accum, warmup_ratio=warmup_ratio, weight_decay=weight_decay,
                      max_grad_norm=max_grad_norm, max_steps=max_steps, seed=seed, packing=packing,
                      max_tokens_per_batch=max_tokens_per_batch, pack_length=pack_length,
                      gradient_checkpointing=gradient_checkpointing,
                      lora=settings, save_every=save_every, keep_checkpoints=keep_checkpoints or None),
    ))
    if os.environ.get("RANK", "0") == "0" and summary.get("written", True):  # one line, not one per process
        typer.echo(f"train: {summary['rows']} rows, {summary['steps']} steps, final loss "
                   f"{summary['final_loss'] if summary['final_loss'] is not None else float('nan'):.4f} -> {output}",
                   err=True)
