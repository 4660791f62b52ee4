import sys

from ..steps.options import CompareOptions
from .build import command


def print_comparison(opts: CompareOptions, title: str) -> None:
    from rich.console import Console

    from ..steps.eval import render_comparison, run_compare, run_paired

    comparison = run_compare(opts)
    differences = run_paired(opts) if opts.paired else None
    # a pipe or file gets the whole table, however many columns
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    for table in render_comparison(comparison, differences, title):
        console.print(table)


@command(CompareOptions)
def run(opts: CompareOptions) -> None:
    print_comparison(opts, title="bridge compare")
