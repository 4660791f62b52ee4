import json

import typer

from ..steps.inspect import run_stats, summarize, summary_tables
from ..steps.options import InspectOptions
from .build import command


@command(InspectOptions)
def run(opts: InspectOptions) -> None:
    if opts.stats or opts.png:
        run_stats(opts.inp, as_json=opts.as_json, png=opts.png)
        return
    info = summarize(opts.inp)
    if opts.as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    from rich.console import Console

    console = Console(emoji=False)  # :name: in the data stays as it is
    for table in summary_tables(info):
        console.print(table)
