import os

import typer

from ..steps.options import TrainOptions
from .build import command


@command(TrainOptions)
def run(opts: TrainOptions) -> None:
    from ..steps.train import run_train

    summary = run_train(opts)
    if os.environ.get("RANK", "0") == "0" and summary.get("written", True):  # one line, not one per process
        loss = summary["final_loss"] if summary["final_loss"] is not None else float("nan")
        typer.echo(
            f"train: {summary['rows']} rows, {summary['steps']} steps, final loss {loss:.4f} -> {opts.out}", err=True
        )
