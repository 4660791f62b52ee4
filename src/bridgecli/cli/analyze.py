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


def _report(options: type, name: str) -> Callable:
    """The command ``bridge analyze NAME``: ``steps.analyze.run_NAME`` on the options, its table printed."""

    def run(opts) -> None:
        from ..steps import analyze

        _print(getattr(analyze, f"{name}_table")(getattr(analyze, f"run_{name}")(opts)), opts.out)

    run.__name__ = name
    return command(options)(run)


REPORTS = {
    "fidelity": _report(FidelityOptions, "fidelity"),
    "shift": _report(ShiftOptions, "shift"),
    "robustness": _report(RobustnessOptions, "robustness"),
    "decompose": _report(DecomposeOptions, "decompose"),
}


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
    for name, text in ANALYZE:
        sub.command(name, cls=Command, help=escaped(text))(reporting(f"analyze {name}", REPORTS[name]))
    return sub
