import json

import typer


def run() -> None:
    from ..steps.plugins import run_plugins

    typer.echo(json.dumps(run_plugins(), indent=2))
