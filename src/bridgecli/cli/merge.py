from __future__ import annotations

from typing import Annotated

import typer

from .options import StreamOut

WORKERS_HELP = (
    "Processes compressing the merged stream (1: this process). Output is identical for any number; about one "
    "per core (more than the CPUs this process may use is lowered to that)."
)


def merge(
    shards: Annotated[list[str], typer.Argument(help="Shard streams of one run (e.g. OUT.shard-00000-of-00002 ...).")],
    output: StreamOut = "-",
    workers: Annotated[int, typer.Option("--workers", min=1, help=WORKERS_HELP)] = 1,
):
    """Merge shard streams of one run into one stream ordered by example index."""
    from ..progress import note
    from ..runtime.merge import merge_streams
    from ..runtime.pool import cap_workers

    note(f"merged {merge_streams(shards, output, workers=cap_workers(workers))} examples")
