from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..artifacts.warmup_run import DEFAULT_WARMUP_DIR
from ..training.config import SFTConfig
from .options import (ChatTemplate, Device, Limit, MaxLength, Model, PromptField, ResponseField, Seed, Split,
                      data_options)


def warmup(
    data: Annotated[str, typer.Argument(help="Warm split (JSONL/JSON/Parquet/save_to_disk), or the full data with --warm-fraction.")],
    val: Annotated[Optional[str], typer.Option(help="Validation data D_val for g_target.")] = None,
    output: Annotated[Path, typer.Option("--output", "-o", help="Run folder (score's default --from).")] = DEFAULT_WARMUP_DIR,
    model: Model = None,
    warm_fraction: Annotated[Optional[float], typer.Option(help="Warm up on this fraction of DATA; its ids are recorded so `score` leaves them out.")] = None,
    val_fraction: Annotated[Optional[float], typer.Option(help="Without --val: hold out this fraction of DATA as D_val.")] = None,
    direction_layers: Annotated[int, typer.Option(help="Final blocks whose parameters define v.")] = 4,
    lam: Annotated[float, typer.Option("--lambda", help="Weight of the anchor direction in v.")] = 0.2,
    epochs: Annotated[float, typer.Option(help="Warmup epochs over the warm split.")] = 1.0,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 2e-5,
    batch_size: Annotated[int, typer.Option(help="Rows per forward pass.")] = 8,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    max_steps: Annotated[Optional[int], typer.Option(help="Stop after this many optimizer steps.")] = None,
    seed: Seed = 42,
    device: Device = "auto",
    prompt_field: PromptField = None,
    response_field: ResponseField = None,
    chat_template: ChatTemplate = True,
    max_length: MaxLength = None,
    split: Split = None,
    limit: Limit = None,
):
    """Short standard SFT from theta_old on the warm split; then the scoring direction v."""
    from ..steps.warmup import WarmupOptions, run_warmup

    meta = run_warmup(WarmupOptions(
        data=data, val=val, out=output, model=model, warm_fraction=warm_fraction, val_fraction=val_fraction,
        direction_layers=direction_layers, lam=lam, device=device,
        sft=SFTConfig(epochs=epochs, lr=lr, batch_size=batch_size, grad_accum=grad_accum, max_steps=max_steps,
                      seed=seed),
        data_opts=data_options(prompt_field, response_field, chat_template, max_length, split, limit),
    ))
    typer.echo(f"warmup: {meta['warm_examples']} examples, {meta['steps']} steps, val loss {meta['val_loss']:.4f} "
               f"-> {output}", err=True)
