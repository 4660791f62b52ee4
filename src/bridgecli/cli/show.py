import sys

from ..progress import note
from ..steps.options import ShowOptions
from .build import command


@command(ShowOptions)
def run(opts: ShowOptions) -> None:
    from rich.console import Console

    from ..steps.show import render_plain, render_terminal, run_show

    view = run_show(opts)
    console = Console(highlight=False)
    if console.is_terminal and not console.no_color and console.color_system is not None:
        console.print(render_terminal(view))
    else:
        sys.stdout.write(render_plain(view))
        sys.stdout.flush()
    if opts.html:
        note(f"wrote {opts.html}")
