from __future__ import annotations

import os

import typer

from ..steps.options import TrainOptions
from .build import command


@command(TrainOptions)
def train(opts: TrainOptions) -> None:
    """SFT from theta_old: AdamW, cosine schedule, token-mean loss over the selected positions of each step.

    Full-parameter by default, LoRA with --lora. Several GPUs: torchrun --nproc-per-node N -m bridgecli train ...
    (or accelerate launch; FSDP through an accelerate config)."""
    from ..steps.train import run_train

    summary = run_train(opts)
    if os.environ.get("RANK", "0") == "0" and summary.get("written", True):  # one line, not one per process
        typer.echo(
            f"train: {summary['rows']} rows, {summary['steps']} steps, final loss "
            f"{summary['final_loss'] if summary['final_loss'] is not None else float('nan'):.4f} -> {opts.out}",
            err=True,
        )
