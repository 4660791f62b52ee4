from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..modeling.loading import DTYPES
from .options import ChatTemplate, Device, Limit, MaxLength, PromptField, ResponseField, Split, StreamOut, data_options


def score(
    data: Annotated[str, typer.Argument(help="Data to score (JSONL/JSON/Parquet/save_to_disk folder).")],
    output: StreamOut = "-",
    from_: Annotated[Optional[Path], typer.Option("--from", help="Warmup run folder (default: runs/warmup).")] = None,
    scorer: Annotated[str, typer.Option(help="Scorer plugin (`bridge plugins` lists them).")] = "bridge",
    batch_size: Annotated[int, typer.Option(help="Examples per scoring pass.")] = 8,
    attention_layers: Annotated[int, typer.Option(help="Final blocks whose attention rows give A and c.")] = 4,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option(help=f"Model dtype for scoring: {', '.join(DTYPES)}.")] = "float32",
    prompt_field: PromptField = None,
    response_field: ResponseField = None,
    chat_template: ChatTemplate = True,
    max_length: MaxLength = None,
    split: Split = None,
    limit: Limit = None,
):
    """Score every example: a_j (one JVP along v), attention rows A and history mass c."""
    from ..steps.score import ScoreOptions, run_score

    if dtype not in DTYPES:
        raise typer.BadParameter(f"choose one of {', '.join(DTYPES)}", param_hint="--dtype")
    run_score(ScoreOptions(
        data=data, out=output, run=from_, scorer=scorer, batch_size=batch_size, attention_layers=attention_layers,
        device=device, dtype=dtype,
        data_opts=data_options(prompt_field, response_field, chat_template, max_length, split, limit),
    ))
