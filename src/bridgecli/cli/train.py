from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..training.config import SFTConfig
from .options import Device, Model, Seed


def train(
    data: Annotated[str, typer.Argument(help="JSONL rows with input_ids and labels (what `bridge compact` writes).")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the trained HF model.")] = Path("runs/final"),
    model: Model = None,
    epochs: Annotated[float, typer.Option(help="Epochs (paper: 3).")] = 3.0,
    lr: Annotated[float, typer.Option(help="Peak learning rate (paper: 2e-5).")] = 2e-5,
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass.")] = 8,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per step (paper: effective batch 64 = 8 x 8).")] = 8,
    warmup_ratio: Annotated[float, typer.Option(help="Linear warmup fraction before the cosine decay.")] = 0.03,
    weight_decay: Annotated[float, typer.Option(help="AdamW weight decay.")] = 0.0,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many optimizer steps.")] = None,
    seed: Seed = 42,
    device: Device = "auto",
):
    """Full-parameter SFT from theta_old: AdamW, cosine schedule, token-mean loss over selected positions."""
    from ..steps.train import TrainOptions, run_train

    summary = run_train(TrainOptions(
        data=data, out=output, model=model, device=device,
        sft=SFTConfig(epochs=epochs, lr=lr, batch_size=batch_size, grad_accum=grad_accum, warmup_ratio=warmup_ratio,
                      weight_decay=weight_decay, max_steps=max_steps, seed=seed),
    ))
    typer.echo(f"train: {summary['rows']} rows, {summary['steps']} steps, final loss "
               f"{summary['final_loss'] if summary['final_loss'] is not None else float('nan'):.4f} -> {output}", err=True)
