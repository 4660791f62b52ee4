import dataclasses

from ..steps.options import EvalCommand
from .build import command
from .compare import print_comparison


@command(EvalCommand)
def run(opts: EvalCommand) -> None:
    if opts.compare:  # the older spelling of `bridge compare`
        print_comparison(dataclasses.replace(opts.table, runs=opts.model), title="bridge eval --compare")
        return
    from rich.console import Console

    from ..steps.eval import one_model, render_table, run_eval

    results = run_eval(dataclasses.replace(opts.run, model=one_model(opts.model)))
    Console(stderr=False).print(render_table(results))
