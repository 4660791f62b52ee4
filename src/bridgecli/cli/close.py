from __future__ import annotations

from ..steps.options import CloseOptions
from .build import command


@command(CloseOptions)
def close(opts: CloseOptions) -> None:
    """Project the response selection onto whole structural units (exact knapsack under b_r)."""
    from ..steps.close import run_close

    run_close(opts)
