"""``--workers N``: a step's per-example work on a pool of processes, in stream order, with output
byte-identical to one process.

The parent hands out the input's zstd frames whole, still compressed: it only walks each frame's block
headers to find where it ends, and from a regular file it hands out only where the frame lies (the worker
reads it itself: the input's bytes never pass through the parent). Each worker decompresses a frame, checks its records (length, checksum,
kind), decodes, validates and processes them, and sends back, per batch of
:data:`~bridgecli.format.spec.RECORDS_PER_FRAME`: for a stream-to-stream step, the batch's records already
compressed into the zstd frame the writer would have made (so compression runs in the workers too); for
``compact``, the rows. The parent writes the results in input order and checks ids for duplicates across
the stream. From the first frame that a worker cannot take whole (one that holds the end record, an error
of any kind, records cut by the frame's end, or a number of records that is not a whole number of batches),
the parent reads the records itself, as one process does (checksums, order and count checked as always),
and hands out batches of their undecoded payloads. So an error in record k is raised after every record
before it was written, with the message one process gives.

The workers are forked, so a step's function (a closure over its options) needs no pickling. A
stream-to-stream step runs here through :func:`bridgecli.steps.common.map_stream_parallel`.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
from typing import Any, Callable, Generator, Iterator, Sequence, cast

from ..errors import BridgeError
from ..format.reader import decode_example, frame_payloads
from ..format.records import Example
from ..format.spec import RECORDS_PER_FRAME
from ..format.validate import Validator
from .pool import Pool, cap_workers, frames_on_pool, worker_signals

#: what a forked worker runs: set in the parent just before the pool starts
_JOB: dict[str, Any] = {}


def _error(err: BridgeError) -> tuple:
    return (type(err), err.message, err.file, err.record, err.field, err.hint)


def _raise(spec: tuple) -> None:
    cls, message, file, record, field, hint = spec
    raise cls(message, file=file, record=record, field=field, hint=hint)


def _work(
    start: int, payloads: Sequence[bytes | memoryview]
) -> tuple[Any, list[tuple[str, int]], tuple | None, tuple[str, int] | None]:
    """Decode, check and process one batch. Returns (packed results, [(id, record)] of the examples that
    passed their checks, the error of the first one that failed or None, and whether that one's id still
    needs the duplicate check before its error is raised ('fn': it failed in the step itself))."""
    job = _JOB
    name, validator, work = job["name"], job["validator"], job["work"]
    results: list[Any] = []
    ids: list[tuple[str, int]] = []
    for k, payload in enumerate(payloads):
        position = start + k
        try:
            ex = cast(Example, decode_example(payload, name, position))  # the parent hands out examples only
            validator.check(ex, position)
        except BridgeError as err:
            return job["pack"](results), ids, _error(err), None
        record = ex.index if isinstance(ex.index, int) and ex.index >= 0 else position
        try:
            results.append(work(ex))
        except BridgeError as err:
            return job["pack"](results), ids, _error(err), (ex.id, record)
        ids.append((ex.id, record))
    return job["pack"](results), ids, None, None


def validator_of(reader) -> Validator:
    """The :class:`Validator` of a stream reader (the steps always read with validation on)."""
    validator = reader._validate
    assert isinstance(validator, Validator), "--workers needs a reader that validates"
    return validator


def start_pool(reader, validator: Validator, work: Callable[[Example], Any], pack: Callable[[list], Any], workers: int):
    """Fork ``workers`` processes that run ``work`` on each example and ``pack`` on each batch's results.
    Start it before any thread (a progress bar's) so that no lock is copied held."""
    from ..errors import UsageError

    if "fork" not in multiprocessing.get_all_start_methods():
        raise UsageError("--workers needs processes started by fork (Linux, macOS); use --workers 1 here")
    _JOB.clear()
    _JOB.update(name=reader.name, validator=validator, work=work, pack=pack, fd=reader.fd)
    return Pool(workers, initializer=worker_signals, context=multiprocessing.get_context("fork"))


def _work_frame(size: int, frame: bytes | int) -> list[tuple[int, Any, list[tuple[str, int]]]] | None:
    """Decompress one zstd frame of the input (its bytes, or where they lie in the input file), then decode,
    check and process its records in batches of :data:`RECORDS_PER_FRAME`: ``[(examples, packed results,
    [(id, record)])]`` per batch. None when the frame holds anything but whole, sound Example records, or a
    record fails: the parent then reads the frame itself, and reports what is wrong as one process does."""
    try:
        data = frame if isinstance(frame, bytes) else os.pread(_JOB["fd"], size, frame)
        payloads = frame_payloads(data) if len(data) == size else None
        if payloads is None:
            return None
        out = []
        for at in range(0, len(payloads), RECORDS_PER_FRAME):
            batch = payloads[at : at + RECORDS_PER_FRAME]
            # a position only names a record in an error, and an error sends the frame back: 0 will do
            packed, ids, err, _ = _work(0, batch)
            if err is not None:
                return None
            out.append((len(batch), packed, ids))
        return out
    except Exception:  # anything else too: the parent's reading raises it where one process would
        return None


def _batches(payloads: Iterator[bytes], size: int, first: int) -> Iterator[list[bytes]]:
    """``payloads`` in lists of ``first``, then ``size`` each."""
    batch: list[bytes] = []
    for p in payloads:
        batch.append(p)
        if len(batch) == first:
            yield batch
            batch, first = [], size
    if batch:
        yield batch


def run_pool(
    reader, validator: Validator, work: Callable[[Example], Any], pack: Callable[[list], Any], workers: int, pool=None
) -> Iterator[tuple[int, Any]]:
    """Yield ``(examples read, packed results)`` per batch of ``reader``'s examples, in order (on ``pool``
    from :func:`start_pool`, or a new one). Each worker gets whole zstd frames of the input, still
    compressed, while they hold whole, sound example records in whole batches (the parent only finds where
    each frame ends); from the first frame that does not, or holds an error, or the end record, the parent
    reads the records itself and hands out their payloads."""
    if pool is None:
        workers = cap_workers(workers)
        pool = start_pool(reader, validator, work, pack, workers)
    with pool:
        start = yield from _frames_pooled(reader, validator, pool, 2 * workers + 2)
        yield from _payloads_pooled(reader, validator, pool, 3 * workers, start)


def _frames_pooled(reader, validator: Validator, pool, most: int) -> Generator[tuple[int, Any], None, int]:
    """The batches of the frames that the workers read whole (at most ``most`` frames handed out at a time).
    Returns the number of examples in them, with the reader restarted after them (left where it was when
    there were none)."""
    index = 0
    resume = None  # the offset of the first frame whose results are not taken, once one was handed out
    for offset, end, batches in frames_on_pool(reader, pool, _work_frame, (), most):
        if batches is None:
            resume = offset
            break
        for n, packed, ids in batches:
            for id_, record in ids:
                validator.seen(id_, record)
            yield n, packed
            index += n
        resume = end
        reader.release(end)
        if index % RECORDS_PER_FRAME:  # frames of another size: batches would straddle the output's frames
            break
    if resume is not None:  # the frames handed out after it are read again
        reader.restart(resume, index)
    return index


def _payloads_pooled(reader, validator: Validator, pool, most: int, start: int) -> Iterator[tuple[int, Any]]:
    """The batches of the records the parent reads, from example ``start`` on (at most ``most`` batches
    handed out at a time)."""
    pending: collections.deque = collections.deque()

    def drain_one():
        n, res = pending.popleft()
        packed, ids, err, failed = res.get()
        for id_, record in ids:
            validator.seen(id_, record)
        if err is not None:
            if failed is not None:
                validator.seen(*failed)
            _raise(err)
        return n, packed

    try:
        # the first batch ends where the one-process writer ends a frame
        for batch in _batches(reader.payloads(), RECORDS_PER_FRAME, RECORDS_PER_FRAME - start % RECORDS_PER_FRAME):
            pending.append((len(batch), pool.apply_async(_work, (start, batch))))
            start += len(batch)
            while len(pending) >= most:
                yield drain_one()
    except BridgeError:
        while pending:  # an error in an earlier record comes first
            yield drain_one()
        raise
    while pending:
        yield drain_one()
