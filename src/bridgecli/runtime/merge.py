"""Merge streams written by shards of one run (e.g. ``torchrun`` ranks) into one ordered stream.

With ``workers`` > 1 the zstd frames of the output are compressed on a pool of processes: this process
puts the shards' records in index order, as with one, and hands out each output frame's records whole;
the frames come back compressed as the writer would have compressed them
(:func:`~bridgecli.format.writer.compress_frame`) and are written in order. Copying records as written
(``validate=False``), the workers also decompress and check the shards' frames, and this process reads a
shard itself only from the first frame they cannot take whole (its end record's, a damaged one). The
output is byte-identical for any number of workers, and so is an error (and what was written before it).
"""

from __future__ import annotations

import collections
import contextlib
import heapq
import multiprocessing
import os
from typing import Any, Iterator, Sequence

import msgspec

from ..errors import BridgeError, FormatError
from ..io import check_output
from ..format.reader import example_index, frame_payloads, open_reader
from ..format.records import Header
from ..format.spec import RECORDS_PER_FRAME
from ..format.writer import StreamWriter, compress_frame, encode_payload, frame_payload, open_writer
from ..optionspec import integer
from .pool import Pool, frames_on_pool, worker_signals


def _payloads(reader):
    """(index, payload) for each example of ``reader``, not decoded beyond its index (the reader still
    checks frames, CRCs and the count)."""
    for payload in reader.payloads():
        yield example_index(payload, reader.name), payload


def _as_is(reader):
    """(index, record bytes as written) for each example of ``reader`` (see :func:`_payloads`)."""
    for index, payload in _payloads(reader):
        yield index, frame_payload(payload)


def _compress_payloads(payloads: list[bytes]) -> bytes:
    """The zstd frame of these Example records' payloads, as the writer makes it (in a worker)."""
    return compress_frame([frame_payload(p) for p in payloads])


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
    workers: int = 1,
) -> int:
    """Interleave the examples of ``paths`` by their data index (each shard is already in index
    order) into ``out``. Refuses shards of different runs and duplicate examples. ``frame``: end a
    zstd frame after every ``frame`` examples and before the end record, as ``bridge score``'s
    windows do in one process (the merged file is then byte-identical to it after the header).
    ``validate=False`` copies each record's bytes as they are instead of decoding and validating it
    again (for shards this run's own ranks just wrote). ``workers`` > 1: compress the output's frames (and,
    with ``validate=False``, decompress the shards' frames) on as many processes; the same bytes (see
    :func:`_start_pool`)."""
    integer("--workers", workers)
    if not paths:
        raise FormatError("nothing to merge")
    check_output(out, inputs=paths)
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
        iters = [((ex.index, ex) for ex in r) for r in readers]
        if workers > 1:
            pool = _start_pool(workers)
            stack.callback(pool.join)
            stack.callback(pool.terminate)
            # frames end where one process ends them: every ``frame`` examples and before the end
            # record, or without ``frame`` every RECORDS_PER_FRAME, the last one holding the end record
            with open_writer(out, header, records_per_frame=frame or RECORDS_PER_FRAME) as writer:
                # payloads: the workers add each record's length and CRC-32 (the reader checked it)
                if validate:
                    payloads = (encode_payload(ex) for ex in _in_order(iters, readers))
                else:  # the shards' frames are decompressed by the workers too
                    payloads = _in_order([_read_pooled(r, str(p), pool) for r, p in zip(readers, paths)], readers)
                _write_pooled(writer, payloads, frame or RECORDS_PER_FRAME, workers, pool)
                if frame:
                    writer.flush()
                return writer.count
        records = _in_order(iters if validate else [_as_is(r) for r in readers], readers)
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


def _write_pooled(writer: StreamWriter, payloads: Iterator[bytes], per: int, workers: int, pool: Any) -> None:
    """Write the Example records of ``payloads`` through ``writer``: each whole frame of ``per`` compressed on
    ``pool`` (of ``workers`` processes; at most ``2 * workers + 2`` frames at a time), a last shorter one by
    ``writer``. An error in ``payloads`` is raised after the records before it were written, as one process
    writes them."""
    pending: collections.deque = collections.deque()  # (records, compressed frame to come) in order

    def write_one() -> None:
        n, frame = pending.popleft()
        written = writer.write_frame(frame.get(), n)
        assert written, "a whole frame, where the writer ends one"

    batch: list[bytes] = []
    try:
        for payload in payloads:
            batch.append(payload)
            if len(batch) == per:
                pending.append((per, pool.apply_async(_compress_payloads, (batch,))))
                batch = []
                if len(pending) >= 2 * workers + 2:
                    write_one()
        while pending:
            write_one()
    except BridgeError:  # a shard's (corrupt, out of order, duplicate): what came before it is written first
        while pending:
            write_one()
        for payload in batch:
            writer.write_encoded(frame_payload(payload))
        raise
    for payload in batch:
        writer.write_encoded(frame_payload(payload))


#: shard frames handed out ahead of the merge, per shard
READ_AHEAD = 2
#: the files a worker has open (by path), to read the shard frames it is given
_FILES: dict[str, int] = {}


def _read_frame(path: str, size: int, frame: bytes | int) -> list[tuple[int, bytes]] | None:
    """In a worker: ``(index, payload)`` of each record of one zstd frame of a shard (its bytes, or where
    they lie in ``path``). None when the frame holds anything but whole, sound Example records with an
    index: the merge then reads it itself, and reports what is wrong as one process does."""
    try:
        if isinstance(frame, int):
            if path not in _FILES:
                _FILES[path] = os.open(path, os.O_RDONLY)
            data = os.pread(_FILES[path], size, frame)
        else:
            data = frame
        payloads = frame_payloads(data) if len(data) == size else None
        if payloads is None:
            return None
        return [(example_index(p, path), bytes(p)) for p in payloads]
    except Exception:  # anything else too: the merge's own reading raises it where one process would
        return None


def _read_pooled(reader, path: str, pool: Any) -> Iterator[tuple[int, bytes]]:
    """:func:`_payloads` of ``reader`` (the shard at ``path``), its zstd frames decompressed and checked by
    ``pool``'s workers while they hold whole, sound Example records (the end record's frame never does);
    from the first that does not, this process reads on itself, as :func:`_payloads` does, so an error
    comes out as with one process (:mod:`.workers` hands out a step's input frames the same way)."""
    index = 0
    resume = None  # the offset of the first frame whose records are not all yielded, once one was handed out
    for offset, end, records in frames_on_pool(reader, pool, _read_frame, (path,), READ_AHEAD):
        if records is None:
            resume = offset
            break
        yield from records
        index += len(records)
        resume = end
        reader.release(end)
    if resume is not None:  # the frames handed out after it are read again
        reader.restart(resume, index)
    yield from _payloads(reader)


def _start_pool(workers: int) -> Any:
    """``workers`` processes forked by a fork server, itself started without the threads this process may
    hold (rank 0 of ``bridge score`` holds torch's and gloo's), that imports this module once for them all.
    As with spawned processes, each imports the main module of a Python program run from a file, so one
    that merges with ``workers`` > 1 needs the ``if __name__ == "__main__":`` idiom."""
    context: Any = multiprocessing.get_context("spawn")
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
    return Pool(workers, initializer=_worker_init, context=context)


def _worker_init() -> None:
    """A worker dies at once on the pool's SIGTERM (:func:`.pool.worker_signals` says why) and leaves Ctrl-C
    to this process, which stops the pool (a worker would print its own traceback)."""
    import signal

    worker_signals()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
