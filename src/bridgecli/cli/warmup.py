from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..data.examples import DataOptions as D
from ..steps.options import WARMUP_SFT, WARMUP_SFT_HELP
from ..steps.options import WarmupOptions as W
from ..training.config import SFTConfig
from .options import arg, data_options, opt


def _sft(name: str):
    """Warmup's own default (and, where it words it its own way, help) for an SFT setting."""
    return opt(SFTConfig, name, default=getattr(WARMUP_SFT, name), help=WARMUP_SFT_HELP.get(name))


def warmup(
    data: str = arg(W, "data"),
    val: Optional[str] = opt(W, "val"),
    output: Path = opt(W, "out"),
    model: Optional[str] = opt(W, "model"),
    warm_fraction: Optional[float] = opt(W, "warm_fraction"),
    val_fraction: Optional[float] = opt(W, "val_fraction"),
    direction_layers: int = opt(W, "direction_layers"),
    lam: float = opt(W, "lam"),
    epochs: float = _sft("epochs"),
    lr: float = _sft("lr"),
    batch_size: int = _sft("batch_size"),
    grad_accum: int = _sft("grad_accum"),
    max_steps: Optional[int] = _sft("max_steps"),
    seed: int = _sft("seed"),
    device: str = opt(W, "device"),
    prompt_field: Optional[str] = opt(D, "prompt_field"),
    response_field: Optional[str] = opt(D, "response_field"),
    chat_template: bool = opt(D, "chat_template"),
    max_length: Optional[int] = opt(D, "max_length"),
    split: Optional[str] = opt(D, "split"),
    limit: Optional[int] = opt(D, "limit"),
):
    """Short standard SFT from theta_old on the warm split; then the scoring direction v."""
    from ..steps.warmup import run_warmup

    meta = run_warmup(
        W(
            data=data,
            val=val,
            out=output,
            model=model,
            warm_fraction=warm_fraction,
            val_fraction=val_fraction,
            direction_layers=direction_layers,
            lam=lam,
            device=device,
            sft=SFTConfig(
                epochs=epochs, lr=lr, batch_size=batch_size, grad_accum=grad_accum, max_steps=max_steps, seed=seed
            ),
            data_opts=data_options(prompt_field, response_field, chat_template, max_length, split, limit),
        )
    )
    typer.echo(
        f"warmup: {meta['warm_examples']} examples, {meta['steps']} steps, val loss {meta['val_loss']:.4f} -> {output}",
        err=True,
    )
