"""``bridge analyze``: a Typer sub-app (fidelity, shift, robustness)."""

from __future__ import annotations

from typing import Callable

import typer

from ..steps.options import FidelityOptions, RobustnessOptions, ShiftOptions
from .build import command
from .labels import Command

HELP = (
    "Check BRIDGE's claims on your own checkpoint and data: surrogate fidelity (paper Table 2), "
    "ranking shift (Finding 2), full-state selection robustness (Theorem 1)."
)


def _print(table, out: str | None) -> None:
    from rich.console import Console

    from ..io import is_stdio

    Console(stderr=out is not None and is_stdio(out), highlight=False).print(table)


@command(FidelityOptions)
def fidelity(opts: FidelityOptions) -> None:
    """Surrogate vs exact state-conditioned scores at the selected states (paper Table 2)."""
    from ..analysis.tables import fidelity_table
    from ..steps.analyze import run_fidelity

    _print(fidelity_table(run_fidelity(opts)), opts.out)


@command(ShiftOptions)
def shift(opts: ShiftOptions) -> None:
    """Ranking shift (1 - Spearman with full retention) as the opposite side's retention falls (Finding 2)."""
    from ..analysis.tables import shift_table
    from ..steps.analyze import run_shift

    _print(shift_table(run_shift(opts)), opts.out)


@command(RobustnessOptions)
def robustness(opts: RobustnessOptions) -> None:
    """kappa_q (q = 1..n) of each example's full-state top-b selection, per side (Theorem 1), from a scores stream."""
    from ..analysis.tables import robustness_table
    from ..steps.analyze import run_robustness

    _print(robustness_table(run_robustness(opts)), opts.out)


def build(reporting: Callable[[str, Callable], Callable]) -> typer.Typer:
    """The sub-app; ``reporting(name, fn)`` wraps each command the way the top-level ones are."""
    sub = typer.Typer(
        name="analyze",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )
    for name, fn in (("fidelity", fidelity), ("shift", shift), ("robustness", robustness)):
        sub.command(name, cls=Command)(reporting(f"analyze {name}", fn))
    return sub
