import typer

from ..steps.options import WarmupOptions
from .build import command


@command(WarmupOptions)
def run(opts: WarmupOptions) -> None:
    from ..steps.warmup import run_warmup

    meta = run_warmup(opts)
    typer.echo(
        f"warmup: {meta['warm_examples']} examples, {meta['steps']} steps, val loss {meta['val_loss']:.4f} "
        f"-> {opts.out}",
        err=True,
    )
