"""Merge streams written by shards of one run (e.g. ``torchrun`` ranks) into one ordered stream."""

from __future__ import annotations

import contextlib
import heapq
import os
import zlib
from typing import Sequence

import msgspec

from ..errors import FormatError
from .reader import open_reader
from .records import Header
from .spec import RECORD_PREFIX
from .writer import open_writer


class _Indexed(msgspec.Struct, tag="example"):
    index: int


_index_decoder = msgspec.msgpack.Decoder(_Indexed)


def _as_is(reader):
    """(index, record bytes as written) for each example of ``reader``, not decoded beyond its index
    (the reader still checks frames, CRCs and the count)."""
    for payload in reader.payloads():
        try:
            index = _index_decoder.decode(payload).index
        except msgspec.DecodeError as exc:
            raise FormatError(f"cannot decode record ({exc})", file=reader.name) from None
        yield index, RECORD_PREFIX.pack(len(payload), zlib.crc32(payload)) + payload


def _comparable(h: Header) -> tuple:
    """What must agree between shards: stage, model, and every step's parameters except the shard's own."""
    steps = []
    for s in h.steps:
        params = {k: v for k, v in s.params.items() if k not in ("shard", "shards")}
        steps.append((s.step, msgspec.json.encode(params)))
    return (h.stage, h.model.fingerprint, h.model.tokenizer_fingerprint, tuple(steps))


def _in_order(iters, readers):
    """The items of every shard's ``(index, item)`` iterator, interleaved by index; refuses an index
    seen twice and a shard out of order."""
    heap = []
    for k, it in enumerate(iters):
        item = next(it, None)
        if item is not None:
            heap.append((item[0], k, item[1]))
    heapq.heapify(heap)
    previous = None
    while heap:
        index, k, ex = heapq.heappop(heap)
        if index == previous:
            raise FormatError(f"example index {index} appears in two shards", file=readers[k].name)
        previous = index
        yield ex
        nxt = next(iters[k], None)
        if nxt is not None:
            if nxt[0] <= index:
                raise FormatError("shard is not in index order", file=readers[k].name, record=nxt[0])
            heapq.heappush(heap, (nxt[0], k, nxt[1]))


def merge_streams(
    paths: Sequence[str | os.PathLike],
    out: str | os.PathLike | None,
    *,
    frame: int | None = None,
    validate: bool = True,
) -> int:
    """Interleave the examples of ``paths`` by their data index (each shard is already in index
    order) into ``out``. Refuses shards of different runs and duplicate examples. ``frame``: end a
    zstd frame after every ``frame`` examples and before the end record, as ``bridge score``'s
    windows do in one process (the merged file is then byte-identical to it after the header).
    ``validate=False`` copies each record's bytes as they are instead of decoding and validating it
    again (for shards this run's own ranks just wrote)."""
    if not paths:
        raise FormatError("nothing to merge")
    with contextlib.ExitStack() as stack:
        readers = [stack.enter_context(open_reader(p)) for p in paths]
        first = readers[0].header
        for r in readers[1:]:
            if _comparable(r.header) != _comparable(first):
                raise FormatError(
                    "this shard comes from a different run (header differs)",
                    file=r.name,
                    hint=f"compare with `bridge inspect {readers[0].name}`",
                )
        last = first.steps[-1]
        params = {k: v for k, v in last.params.items() if k != "shard"}
        params["shards"] = len(paths)
        header = msgspec.structs.replace(first, steps=[*first.steps[:-1], msgspec.structs.replace(last, params=params)])
        if validate:
            iters = [((ex.index, ex) for ex in r) for r in readers]
        else:
            iters = [_as_is(r) for r in readers]
        records = _in_order(iters, readers)
        framing = {"records_per_frame": None} if frame else {}
        with open_writer(out, header, **framing) as writer:
            put = writer.write if validate else writer.write_encoded
            for ex in records:
                put(ex)
                if frame and writer.count % frame == 0:
                    writer.flush()
            if frame:
                writer.flush()
            return writer.count
