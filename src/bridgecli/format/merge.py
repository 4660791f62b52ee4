"""Merge streams written by shards of one run (e.g. ``torchrun`` ranks) into one ordered stream."""

from __future__ import annotations

import contextlib
import heapq
import os

import msgspec

from ..errors import FormatError
from .reader import open_reader
from .records import Header
from .writer import open_writer


def _comparable(h: Header) -> tuple:
    """What must agree between shards: stage, model, and every step's parameters except the shard's own."""
    steps = []
    for s in h.steps:
        params = {k: v for k, v in s.params.items() if k not in ("shard", "shards")}
        steps.append((s.step, msgspec.json.encode(params)))
    return (h.stage, h.model.fingerprint, h.model.tokenizer_fingerprint, tuple(steps))


def merge_streams(paths: list[str | os.PathLike], out: str | os.PathLike | None, *, frame: int | None = None) -> int:
    """Interleave the examples of ``paths`` by their data index (each shard is already in index
    order) into ``out``. Refuses shards of different runs and duplicate examples. ``frame``: end a
    zstd frame after every ``frame`` examples and before the end record, as ``bridge score``'s
    windows do in one process (the merged file is then byte-identical to it after the header)."""
    if not paths:
        raise FormatError("nothing to merge")
    with contextlib.ExitStack() as stack:
        readers = [stack.enter_context(open_reader(p)) for p in paths]
        first = readers[0].header
        for r in readers[1:]:
            if _comparable(r.header) != _comparable(first):
                raise FormatError("this shard comes from a different run (header differs)", file=r.name,
                                  hint=f"compare with `bridge inspect {readers[0].name}`")
        last = first.steps[-1]
        params = {k: v for k, v in last.params.items() if k != "shard"}
        params["shards"] = len(paths)
        header = msgspec.structs.replace(first, steps=[*first.steps[:-1], msgspec.structs.replace(last, params=params)])
        iters = [iter(r) for r in readers]
        heap = []
        for k, it in enumerate(iters):
            ex = next(it, None)
            if ex is not None:
                heap.append((ex.index, k, ex))
        heapq.heapify(heap)
        previous = None
        framing = {"records_per_frame": None} if frame else {}
        with open_writer(out, header, **framing) as writer:
            while heap:
                index, k, ex = heapq.heappop(heap)
                if index == previous:
                    raise FormatError(f"example index {index} appears in two shards", file=readers[k].name)
                previous = index
                writer.write(ex)
                if frame and writer.count % frame == 0:
                    writer.flush()
                nxt = next(iters[k], None)
                if nxt is not None:
                    if nxt.index <= index:
                        raise FormatError("shard is not in index order", file=readers[k].name, record=nxt.index)
                    heapq.heappush(heap, (nxt.index, k, nxt))
            if frame:
                writer.flush()
            return writer.count
