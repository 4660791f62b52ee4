"""``bridge analyze``: a Typer sub-app (fidelity, shift, robustness, decompose)."""

from __future__ import annotations

from typing import Callable

import typer

from ..steps.catalog import ANALYZE, COMMANDS
from ..steps.options import DecomposeOptions, FidelityOptions, RobustnessOptions, ShiftOptions
from .build import Command, command, escaped


def _print(table, out: str | None) -> None:
    from rich.console import Console

    from ..io import is_stdio

    Console(stderr=out is not None and is_stdio(out), highlight=False).print(table)


@command(FidelityOptions)
def fidelity(opts: FidelityOptions) -> None:
    from ..steps.analyze import fidelity_table, run_fidelity

    _print(fidelity_table(run_fidelity(opts)), opts.out)


@command(ShiftOptions)
def shift(opts: ShiftOptions) -> None:
    from ..steps.analyze import run_shift, shift_table

    _print(shift_table(run_shift(opts)), opts.out)


@command(RobustnessOptions)
def robustness(opts: RobustnessOptions) -> None:
    from ..steps.analyze import robustness_table, run_robustness

    _print(robustness_table(run_robustness(opts)), opts.out)


@command(DecomposeOptions)
def decompose(opts: DecomposeOptions) -> None:
    from ..steps.analyze import decompose_table, run_decompose

    _print(decompose_table(run_decompose(opts)), opts.out)


def build(reporting: Callable[[str, Callable], Callable]) -> typer.Typer:
    """The sub-app; ``reporting(name, fn)`` wraps each command the way the top-level ones are."""
    from .app import Group

    sub = typer.Typer(
        cls=Group,
        name="analyze",
        help=escaped(dict(COMMANDS)["analyze"]),
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )
    commands = {"fidelity": fidelity, "shift": shift, "robustness": robustness, "decompose": decompose}
    for name, text in ANALYZE:
        sub.command(name, cls=Command, help=escaped(text))(reporting(f"analyze {name}", commands[name]))
    return sub
