from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from ..modeling.loading import DTYPES
from .options import AllowEmpty, ChatTemplate, Device, Limit, MaxLength, PromptField, ResponseField, Split, StreamOut, data_options


def score(
    data: Annotated[str, typer.Argument(help="Data to score (JSONL/JSON/Parquet/save_to_disk folder).")],
    output: StreamOut = "-",
    from_: Annotated[Optional[Path], typer.Option("--from", help="Warmup run folder (default: runs/warmup).")] = None,
    scorer: Annotated[str, typer.Option(help="Scorer plugin (`bridge plugins` lists them).")] = "bridge",
    scorer_option: Annotated[Optional[list[str]], typer.Option(
        "--scorer-option", help="KEY=VALUE passed to the scorer (repeatable), e.g. chunks=4 for atp.")] = None,
    batch_size: Annotated[int, typer.Option(help="At most this many examples per scoring pass.")] = 64,
    max_tokens: Annotated[Optional[int], typer.Option(
        help="Padded tokens per scoring pass (length-bucketed); default 32768 on a GPU, 4096 on CPU.")] = None,
    window: Annotated[int, typer.Option(help="Examples per bucketing window and per committed (resumable) frame.")] = 256,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an interrupted run into the same -o FILE.")] = False,
    attention_layers: Annotated[int, typer.Option(help="Final blocks whose attention rows give A and c.")] = 4,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option(
        help=f"Scoring dtype: auto (bfloat16 on a GPU, float32 on CPU), {', '.join(DTYPES)}. "
             "See docs/benchmarks.md for the speed/accuracy trade-off.")] = "auto",
    tf32: Annotated[bool, typer.Option("--tf32/--no-tf32", help="float32 on a GPU: TensorFloat-32 matmuls.")] = True,
    prompt_field: PromptField = None,
    response_field: ResponseField = None,
    chat_template: ChatTemplate = True,
    max_length: MaxLength = None,
    split: Split = None,
    limit: Limit = None,
    allow_empty: AllowEmpty = False,
):
    """Score every example: a_j (one JVP along v), attention rows A and history mass c.

    Several GPUs: torchrun --nproc-per-node N -m bridgecli score DATA -o OUT (ranks shard the
    examples; rank 0 merges the shards into OUT)."""
    from ..steps.common import key_values
    from ..steps.score import ScoreOptions, run_score

    if dtype != "auto" and dtype not in DTYPES:
        raise typer.BadParameter(f"choose one of {', '.join(DTYPES)}", param_hint="--dtype")
    run_score(ScoreOptions(
        data=data, out=output, run=from_, scorer=scorer,
        scorer_options=key_values(scorer_option, "--scorer-option"), batch_size=batch_size, max_tokens=max_tokens, window=window,
        resume=resume, attention_layers=attention_layers, allow_empty=allow_empty,
        device=device, dtype=dtype, tf32=tf32,
        data_opts=data_options(prompt_field, response_field, chat_template, max_length, split, limit),
    ))
