from __future__ import annotations

from typing import Annotated, Optional

import typer

from .options import InputArg


def show(
    input: InputArg = "-",
    index: Annotated[Optional[int], typer.Option(help="The example whose index (position in the input data) is K.",
                                                 metavar="K")] = None,
    id: Annotated[Optional[str], typer.Option("--id", help="The example with this id.")] = None,
    html: Annotated[Optional[str], typer.Option(help="Also write a self-contained HTML page (scores on hover).",
                                                metavar="OUT.html")] = None,
):
    """Show what a selection keeps: dropped prompt tokens struck through, supervised response tokens
    highlighted by score, closure units delimited by ⟦ ⟧.

    Without colour (piped, redirected to a file or a pager, or NO_COLOR set) the marks are
    characters: ~~dropped prompt~~, [[supervised response]], ⟦unit⟧."""
    import sys

    from rich.console import Console

    from ..analysis.render import render_plain, render_terminal
    from ..progress import note
    from ..steps.show import ShowOptions, run_show

    view = run_show(ShowOptions(inp=input, index=index, id=id, html=html))
    console = Console(highlight=False)
    if console.is_terminal and not console.no_color and console.color_system is not None:
        console.print(render_terminal(view))
    else:
        sys.stdout.write(render_plain(view))
        sys.stdout.flush()
    if html:
        note(f"wrote {html}")
