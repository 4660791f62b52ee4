from __future__ import annotations

from typing import Annotated

import typer

from ..steps.close import CloseOptions, run_close
from .options import InputArg, StreamOut


def close(
    input: InputArg = "-",
    output: StreamOut = "-",
    segmenter: Annotated[str, typer.Option(help="Segmenter: sentence, math, step, list, code, or a plugin's.")] = "sentence",
    alpha: Annotated[float, typer.Option(help="Length normalisation: q(u) = |u|^-alpha * sum of scores.")] = 0.0,
    workers: Annotated[int, typer.Option(
        "--workers", min=1, help="Processes for the per-example work (1: this process). Output is identical "
                                 "for any number; about one per core.")] = 1,
):
    """Project the response selection onto whole structural units (exact knapsack under b_r)."""
    run_close(CloseOptions(inp=input, out=output, segmenter=segmenter, alpha=alpha, workers=workers))
