from __future__ import annotations

from ..steps.options import ShowOptions
from .build import command


@command(ShowOptions)
def show(opts: ShowOptions) -> None:
    """Show what a selection keeps: dropped prompt tokens struck through, supervised response tokens
    highlighted by score, closure units delimited by ⟦ ⟧.

    Without colour (piped, redirected to a file or a pager, or NO_COLOR set) the marks are
    characters: ~~dropped prompt~~, [[supervised response]], ⟦unit⟧."""
    import sys

    from rich.console import Console

    from ..analysis.render import render_plain, render_terminal
    from ..progress import note
    from ..steps.show import run_show

    view = run_show(opts)
    console = Console(highlight=False)
    if console.is_terminal and not console.no_color and console.color_system is not None:
        console.print(render_terminal(view))
    else:
        sys.stdout.write(render_plain(view))
        sys.stdout.flush()
    if opts.html:
        note(f"wrote {opts.html}")
