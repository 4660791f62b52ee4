"""``bridge eval`` and ``bridge compare``: parse, call steps/eval.py, print the table."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

from rich.console import Console

from ..optionspec import group, option
from ..steps.options import CompareOptions, EvalRunOptions
from .build import command


@dataclass
class EvalCommand:
    """``bridge eval``: the evaluation's options, and `bridge compare`'s older spelling (``--compare``)."""

    model: list[str] = option(
        help="Model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'; with --compare, run "
        "folders (or eval-*.json files).",
        argument=True,
    )
    #: its model is the one MODEL (set below)
    run: EvalRunOptions = group(EvalRunOptions, defaults={"model": ""})
    compare: bool = option(
        False,
        "Don't evaluate: print the paper's Table 1 for the given run folders (and their held-out losses with "
        "intervals).",
        "--compare",
    )
    #: its runs are the MODEL arguments
    table: CompareOptions = group(CompareOptions, defaults={"runs": []}, exclude=("runs",), prefix="--compare: ")


def _print_comparison(opts: CompareOptions, title: str) -> None:
    from ..evaluation.compare import render, render_paired
    from ..steps.eval import run_compare, run_paired

    comparison = run_compare(opts)
    differences = run_paired(opts) if opts.paired else None
    # a pipe or file gets the whole table, however many columns
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    console.print(render(comparison, title=title))
    if differences is not None:
        console.print(render_paired(differences, comparison.rows[0]["name"], title=title))


@command(EvalCommand)
def evaluate(opts: EvalCommand) -> None:
    """Evaluate a model on tasks from local files (one model load; eval-TASK.json each), or compare runs."""
    if opts.compare:  # the older spelling of `bridge compare`
        _print_comparison(dataclasses.replace(opts.table, runs=opts.model), title="bridge eval --compare")
        return
    from ..evaluation.run import render_table
    from ..steps.eval import one_model, run_eval

    results = run_eval(dataclasses.replace(opts.run, model=one_model(opts.model)))
    Console(stderr=False).print(render_table(results))


@command(CompareOptions)
def compare(opts: CompareOptions) -> None:
    """The paper's Table 1 for finished runs: each run folder's eval-*.json results (and held-out losses with
    intervals) side by side; with --paired, each run's differences from the first with paired intervals.
    Also spelled `bridge eval --compare`."""
    _print_comparison(opts, title="bridge compare")
