"""The ranks of one ``bridge score`` run under ``torchrun``, on one node or several.

Every rank scores the records whose index is congruent to its global rank (``RANK``; the GPU is
``cuda:LOCAL_RANK``) and writes its shard next to the output; rank 0 then merges the shards. So
the output must be on a folder every rank can see: with ``--nnodes`` > 1, a shared file system.
:func:`check_shared_folder` makes sure of that before any model loads.

The ranks talk only to wait for each other and to pass small Python objects, never tensors, so
the process group is gloo on CPU and GPU alike (no NCCL communicator, no GPU memory for it).
Ranks wait for the slowest rank and for rank 0's merge, which at scale takes hours, so the group's
timeout is long; a rank that dies still fails the others' waits at once (gloo sees its sockets
close), and they stop with one line.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BridgeError, UsageError

if TYPE_CHECKING:
    from ..data.examples import Report

#: how long a rank waits for the others (the slowest rank's scoring, rank 0's merge)
TIMEOUT = timedelta(days=7)
#: how long rank 0 looks for another rank's probe file (a network file system may show it late)
PROBE_WAIT_S = 2.0
#: the most processes compressing rank 0's merge (its one reading process feeds a few; more only take memory)
MERGE_WORKERS_MAX = 16


class RankError(BridgeError):
    """Another rank stopped, so this one cannot finish (that rank's own error says why)."""

    exit_code = 1


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> "Dist":
        return cls(
            int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))
        )

    def shard_path(self, out: str | os.PathLike) -> Path:
        """This rank's shard, next to the real output (every name of it gives the same shards and locks)."""
        from ..io import real_path

        return Path(f"{real_path(out)}.shard-{self.rank:05d}-of-{self.world:05d}")

    def probe_path(self, out: str | os.PathLike) -> Path:
        return Path(f"{out}.probe-{self.rank:05d}-of-{self.world:05d}")


def init(dist: Dist) -> None:
    import torch.distributed as tdist

    tdist.init_process_group(backend="gloo", timeout=TIMEOUT)


def close() -> None:
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()


def _collective(fn, *args, **kwargs):
    """Run a collective; a peer that died (or a broken connection) becomes one line, not a traceback."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exc:  # gloo's errors, DistBackendError included
        raise RankError(
            f"another rank of this run stopped ({_first_sentence(exc)})",
            hint="its own error, above or on its node, says why",
        ) from None


def _first_sentence(exc: Exception) -> str:
    """gloo's message without its source location: "[.../pair.cc:553] Connection closed by peer
    [127.0.0.1]:25009. This is typically ..." -> "Connection closed by peer [127.0.0.1]:25009"."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". ", 1)[0].rstrip(".")


def gather(obj) -> list:
    """``obj`` from every rank, in rank order, on every rank (also a barrier)."""
    import torch.distributed as tdist

    out = [None] * tdist.get_world_size()
    _collective(tdist.all_gather_object, out, obj)
    return out


def from_rank0(obj):
    """Rank 0's ``obj`` on every rank (others pass anything)."""
    import torch.distributed as tdist

    box = [obj]
    _collective(tdist.broadcast_object_list, box, src=0)
    return box[0]


def check_shared_folder(dist: Dist, out: str | os.PathLike) -> None:
    """Stop every rank with one line unless rank 0 sees a file each rank writes next to ``out``
    (rank 0 reads every shard there to merge them). Each probe holds a fresh token, so files left
    by an earlier run do not count."""
    probe = dist.probe_path(out)
    token = f"{socket.gethostname()} {os.getpid()} {secrets.token_hex(8)}"
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
    except OSError as exc:
        raise UsageError(f"{probe.parent}: cannot write here ({exc.strerror or exc})") from None
    try:
        tokens = gather(token)
        problem = None
        if dist.rank == 0:
            problem = _missing_probe(out, tokens)
        problem = from_rank0(problem)
    finally:
        probe.unlink(missing_ok=True)
    if problem is not None:
        rank, host = problem
        raise UsageError(
            f"rank 0 cannot see the files that rank {rank} (on {host}) writes next to the output",
            file=str(out),
            hint="with several nodes, -o must be on a folder every rank can see "
            "(a shared file system): rank 0 merges the shards there",
        )


def _missing_probe(out, tokens: list[str]) -> tuple[int, str] | None:
    """(rank, host) of the first rank whose probe rank 0 does not see with its token, or None."""
    deadline = time.monotonic() + PROBE_WAIT_S
    for rank, token in enumerate(tokens):
        path = Dist(rank, len(tokens)).probe_path(out)
        while True:
            try:
                if path.read_text() == token:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                return rank, token.split()[0]
            time.sleep(0.2)
    return None


def merge_reports(reports: list[Report]) -> Report:
    """One :class:`~bridgecli.data.examples.Report` for the whole run from each rank's: counts
    summed, lists joined in rank order, settings (``max_length``: the same on every rank) kept."""
    total = type(reports[0])()
    for r in reports:
        total.add(r)
    return total


def merge_shards(dist: Dist, out: str | os.PathLike, frame: int | None, workers: int | None = None) -> int | None:
    """Once every rank has written its shard: rank 0 merges them into ``out`` (frames of ``frame``
    examples, as one process writes them) and removes them; every rank learns whether that worked.
    The merged frames are compressed on ``workers`` processes (default: one per core rank 0 may use, at
    most :data:`MERGE_WORKERS_MAX`: the ranks only wait for it). Returns the merged count on rank 0, None
    on the others."""
    from .merge import merge_streams
    from .pool import default_workers

    outcome: tuple[str, int | str] | None = None
    if dist.rank == 0:
        shards = [Dist(r, dist.world).shard_path(out) for r in range(dist.world)]
        try:
            # the shards are this run's own: copy their records as written (CRCs still checked)
            n = workers if workers is not None else min(default_workers(), MERGE_WORKERS_MAX)
            outcome = ("ok", merge_streams(shards, out, frame=frame, validate=False, workers=n))
        except Exception as exc:  # the other ranks learn of it, then rank 0 reports it as it is
            outcome = ("error", str(exc) or type(exc).__name__)
            from_rank0(outcome)
            raise
        for s in shards:
            s.unlink()
    outcome = from_rank0(outcome)
    if outcome[0] == "error":
        raise RankError(f"rank 0 could not merge the shards: {outcome[1]}", file=str(out))
    if dist.rank != 0:
        return None
    merged = outcome[1]
    assert isinstance(merged, int)  # ("ok", count)
    return merged
