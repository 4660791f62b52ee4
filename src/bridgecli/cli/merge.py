from __future__ import annotations

from ..steps.options import MergeOptions
from .build import command


@command(MergeOptions)
def merge(opts: MergeOptions) -> None:
    """Merge shard streams of one run into one stream ordered by example index."""
    from ..progress import note
    from ..runtime import params
    from ..runtime.merge import merge_streams
    from ..runtime.pool import cap_workers

    params.check(opts)  # --workers in its range before it is lowered to the CPUs there are
    note(f"merged {merge_streams(opts.shards, opts.out, workers=cap_workers(opts.workers))} examples")
