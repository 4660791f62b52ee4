"""``bridge merge``: the shard streams of one ``score`` run as one stream ordered by example index."""

from __future__ import annotations

from ..runtime import params
from ..runtime.merge import merge_streams
from ..runtime.pool import cap_workers
from .options import MergeOptions


def run_merge(opts: MergeOptions) -> int:
    """Merge ``opts.shards`` into ``opts.out``; returns the number of examples."""
    params.check(opts)  # --workers in its range before it is lowered to the CPUs there are
    return merge_streams(opts.shards, opts.out, workers=cap_workers(opts.workers))
