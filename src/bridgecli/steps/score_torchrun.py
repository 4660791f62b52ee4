"""``bridge score`` under ``torchrun`` (one node or several): what each rank does besides scoring.

Each rank scores the records whose index is congruent to its global rank, on ``cuda:LOCAL_RANK``,
and writes a shard next to the output; once every rank is done, rank 0 merges the shards into the
output and the run's report is the sum of the ranks' (:mod:`bridgecli.runtime.ranks`). With one
process, :func:`session` only claims the device.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from ..data.examples import Report
from ..errors import UsageError
from ..io import is_stdio
from ..progress import note
from ..runtime import ranks
from ..runtime.ranks import Dist


def check_options(dist: Dist, out: str | None) -> None:
    """Several ranks need an output file: each writes a shard next to it."""
    if dist.world > 1 and is_stdio(out):
        raise UsageError("several ranks need an output file: pass -o FILE")


def check_stdin(dist: Dist) -> None:
    """Several ranks cannot share stdin."""
    if dist.world > 1:
        raise UsageError("several ranks need the data in a file: pass its path instead of -")


@contextlib.contextmanager
def session(dist: Dist, device: str, out: str | os.PathLike | None) -> Iterator[str]:
    """The device this rank scores on, inside the ranks' process group: every rank has checked that
    rank 0 sees the folder of ``out`` before any model loads. One process: ``device``, claimed."""
    from ..modeling.loading import claim_device

    if dist.world == 1:
        claim_device(device)
        yield device
        return
    if device.startswith("cuda"):
        import torch

        device = f"cuda:{dist.local_rank}"  # the GPU on this node; the shard goes by the global rank
        torch.cuda.set_device(dist.local_rank)
    ranks.init(dist)
    try:
        assert out is not None  # stdout is refused with several ranks (check_options)
        ranks.check_shared_folder(dist, out)
        yield device
    finally:
        ranks.close()


def target(dist: Dist, out: str | os.PathLike) -> Path:
    """Where this rank writes: its shard with several ranks, else the output."""
    return dist.shard_path(out) if dist.world > 1 else Path(out)


def finish(dist: Dist, out: str | os.PathLike | None, report: Report, done: int, frame: int) -> tuple[Report, int]:
    """After this rank's scoring: with several ranks, wait for every shard and merge them (frames of
    ``frame`` examples, as one process writes them); returns the run's report and count, the sums of the
    ranks'. One process: ``(report, done)``."""
    if dist.world == 1:
        return report, done
    per_rank = ranks.gather((report, done))
    total = sum(n for _, n in per_rank)
    assert out is not None  # stdout is refused with several ranks (check_options)
    merged = ranks.merge_shards(dist, out, frame=frame)
    if dist.rank == 0:
        note(f"merged {dist.world} shards: {merged} examples")
    return ranks.merge_reports([r for r, _ in per_rank]), total
