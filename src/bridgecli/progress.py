"""Rich progress on stderr (stdout stays clean for piping)."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

stderr = Console(stderr=True)


def enabled() -> bool:
    return stderr.is_terminal and os.environ.get("BRIDGE_NO_PROGRESS") is None


@contextlib.contextmanager
def progress_bar(show: bool | None = None) -> Iterator[Progress]:
    show = enabled() if show is None else show
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TimeRemainingColumn(), console=stderr, disable=not show, transient=False,
    )
    with bar:
        yield bar


def note(message: str) -> None:
    """A one-line status message on stderr."""
    stderr.print(message, highlight=False, soft_wrap=True)
