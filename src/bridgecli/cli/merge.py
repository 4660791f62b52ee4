from __future__ import annotations

from typing import Annotated

import typer

from .options import StreamOut


def merge(
    shards: Annotated[list[str], typer.Argument(help="Shard streams of one run (e.g. OUT.shard-00000-of-00002 ...).")],
    output: StreamOut = "-",
):
    """Merge shard streams of one run into one stream ordered by example index."""
    from ..format.merge import merge_streams
    from ..progress import note

    note(f"merged {merge_streams(shards, output)} examples")
