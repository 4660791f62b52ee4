from __future__ import annotations

from ..steps.close import CloseOptions as C
from ..steps.close import run_close
from .options import InputArg, StreamOut, opt, shown_range


def close(
    input: InputArg = "-",
    output: StreamOut = "-",
    segmenter: str = opt(C, "segmenter"),
    alpha: float = opt(C, "alpha"),
    fill: bool = opt(C, "fill", "--fill/--no-fill"),
    workers: int = opt(C, "workers", "--workers", **shown_range(C, "workers")),
):
    """Project the response selection onto whole structural units (exact knapsack under b_r)."""
    run_close(C(inp=input, out=output, segmenter=segmenter, alpha=alpha, fill=fill, workers=workers))
