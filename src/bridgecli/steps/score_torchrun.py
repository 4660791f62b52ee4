"""``bridge score`` under ``torchrun`` (one node or several): what each rank does besides scoring.

Each rank scores the records whose index is congruent to its global rank, on ``cuda:LOCAL_RANK``; its
output (:class:`~bridgecli.runtime.stream_output.StreamOutput`) writes its shard next to the output, and
rank 0 merges the shards. The run's report is the sum of the ranks' (:mod:`bridgecli.runtime.ranks`). With
one process, :func:`session` only claims the device.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from ..data.examples import Report
from ..errors import UsageError
from ..runtime import ranks
from ..runtime.ranks import Dist


def check_data(dist: Dist, data: str | None) -> None:
    """Several ranks cannot share stdin."""
    if dist.world > 1 and (data is None or str(data) == "-"):
        raise UsageError("several ranks need the data in a file: pass its path instead of -")


@contextlib.contextmanager
def session(dist: Dist, device: str, out: str | os.PathLike | None) -> Iterator[str]:
    """The device this rank scores on (``--device``, resolved), inside the ranks' process group: every rank
    has checked that rank 0 sees the folder of ``out`` before any model loads. One process: the device,
    claimed."""
    from ..modeling.loading import claim_device, resolve_device

    if dist.world == 1:
        yield claim_device(device)
        return
    device = resolve_device(device)
    if device.startswith("cuda"):
        import torch

        device = f"cuda:{dist.local_rank}"  # the GPU on this node; the shard goes by the global rank
        torch.cuda.set_device(dist.local_rank)
    ranks.init(dist)
    try:
        assert out is not None  # stdout is refused with several ranks (StreamOutput)
        ranks.check_shared_folder(dist, out)
        yield device
    finally:
        ranks.close()


def finish(dist: Dist, report: Report, done: int) -> tuple[Report, int]:
    """After this rank's scoring (and rank 0's merge): the run's report and count, the sums of the ranks'.
    One process: ``(report, done)``."""
    if dist.world == 1:
        return report, done
    per_rank = ranks.gather((report, done))
    return ranks.merge_reports([r for r, _ in per_rank]), sum(n for _, n in per_rank)
