"""``bridge score``'s pipelined loop: score window after window and write each in input order.

Inside a window, examples are bucketed by length under a padded-token budget (``max_tokens``, at most
``batch_size`` rows). The GPU work of one batch is queued (the scorer's ``launch``) before the results
of the batch before are collected; between the two the host reads and tokenises ahead into the next
window (:class:`Ahead`), and finished examples go to a writer thread (:class:`WriterThread`), which
compresses a window's frame while its later batches still compute. The bytes are those of scoring and
writing one batch after another (:func:`score_window`, the serial form).

Every batch's scores are checked before anything of it is written (:func:`check_batch`): a NaN, an
infinity or a value the stream format does not allow (a diverged warmup checkpoint, a broken scorer)
stops the run with one line naming the data file, the record and the field, and the windows committed
before it stay resumable.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections import deque
from itertools import islice
from typing import Any, Callable, Iterator

import msgspec

from ..core.buckets import bucket
from ..errors import ModelError
from ..format.records import Example
from ..format.validate import first_bad_scores
from ..format.writer import StreamWriter
from ..progress import note, progress_bar
from ..timings import mark


def windows(examples: Iterator[Example], size: int) -> Iterator[list[Example]]:
    """Examples ``size`` at a time."""
    while True:
        chunk = list(islice(examples, size))
        if not chunk:
            return
        yield chunk


def check_batch(batch: list[Example], results: list, source: str, hint: str | None = None) -> None:
    """Refuse a scorer's ``results`` for ``batch`` when one holds a NaN, an infinity or another number the
    stream format does not allow (:func:`bridgecli.format.validate.first_bad_scores`, one numpy pass over
    the batch): :class:`ModelError` naming ``source`` (the data file), the record, its id and the field."""
    bad = first_bad_scores(results)
    if bad is None:
        return
    k, field, message = bad
    ex = batch[k]
    raise ModelError(message, file=source, record=f"record {ex.index} (id {ex.id})", field=field, hint=hint)


def score_window(
    scorer, window: list[Example], max_tokens: int, max_rows: int, on_batch=None, source: str = "<data>"
) -> list[Example]:
    """Score a window in length buckets, one batch after another; return its examples, in input
    order, with scores (the serial form of :func:`run_windows`), each batch checked (:func:`check_batch`;
    ``source`` names the data). ``on_batch(n)`` is called after every scoring pass of ``n`` examples
    (progress)."""
    scored: dict[int, Example] = {}
    for group in bucket([len(ex.tokens.input_ids) for ex in window], max_tokens, max_rows):
        batch = [window[i] for i in group]
        results = scorer.score(batch)
        check_batch(batch, results, source)
        for i, sc in zip(group, results):
            scored[i] = msgspec.structs.replace(window[i], scores=sc)
        if on_batch is not None:
            on_batch(len(group))
    return [scored[i] for i in range(len(window))]


class Ahead:
    """Examples read and tokenised ahead of the scoring loop, a few at a time: the loop asks for
    some between two batches, while the GPU computes, instead of a whole window at once while the
    GPU waits."""

    def __init__(self, examples: Iterator[Example], most: int):
        self.examples = examples
        self.most = most  # never hold more than this many
        self.buf: deque[Example] = deque()
        self.exhausted = False

    def fill(self, n: int) -> None:
        """Read up to ``n`` more examples (fewer at the end of the data or at ``most``)."""
        while n > 0 and not self.exhausted and len(self.buf) < self.most:
            ex = next(self.examples, None)
            if ex is None:
                self.exhausted = True
            else:
                self.buf.append(ex)
                n -= 1

    def take(self, n: int) -> list[Example]:
        self.fill(n - len(self.buf))
        return [self.buf.popleft() for _ in range(min(n, len(self.buf)))]


class WriterThread:
    """Encodes, compresses, writes and commits scored examples in input order on a thread of its own
    (zstd releases the GIL), so the loop goes on queueing GPU work. The loop hands over each run of a
    window's examples as soon as every example before it is scored (:meth:`put`) and the window's end
    once it is complete (:meth:`commit`): a window's frame is compressed while its later batches are
    still computed, so little is left to write when the last batch is done (zstd's output does not
    depend on how its input is cut, so the bytes are those of writing the window at once). At most
    ``depth`` windows' worth of examples wait."""

    def __init__(self, writer: StreamWriter, commit, window: int, depth: int = 2):
        self.writer = writer
        self.commit_fn = commit
        self.most = max(1, depth * window)  # examples queued before put() waits
        self.queue: queue.Queue = queue.Queue()
        self.queued = 0
        self.room = threading.Condition()
        self.error: BaseException | None = None
        self.first: float | None = None  # when the first window was committed
        self.thread = threading.Thread(target=self._run, name="bridge-score-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            kind, value = item
            try:
                if self.error is None:
                    if kind == "examples":
                        for ex in value:
                            self.writer.write(ex)
                    else:
                        self.commit_fn(self.writer, value)
                        if self.first is None:
                            self.first = time.perf_counter()
            except BaseException as exc:  # re-raised on the main thread
                self.error = exc
            finally:  # drained either way: the main thread stops at its next call
                if kind == "examples":
                    with self.room:
                        self.queued -= len(value)
                        self.room.notify_all()

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def put(self, examples: list[Example]) -> None:
        """Write ``examples`` next (the stream's next records, in order)."""
        with self.room:
            while self.queued > 0 and self.queued + len(examples) > self.most:
                self._check()
                self.room.wait(timeout=0.1)
            self._check()
            self.queued += len(examples)
        self.queue.put(("examples", examples))

    def commit(self, position: int) -> None:
        """End the window written so far (a committed, resumable frame after ``position`` inputs)."""
        self._check()
        self.queue.put(("commit", position))

    def close(self) -> None:
        """Wait until everything queued is written; raise what the thread raised."""
        self.queue.put(None)
        self.thread.join()
        self._check()


class Window:
    """A window in the loop: its examples, their scored copies so far, how many of them (in input
    order) went to the writer, and the input position after it. ``first``: how many of its first examples
    an interrupted run already wrote (they are scored again with their batches, not written)."""

    def __init__(self, examples: list[Example], end: int, first: int = 0):
        self.examples = examples
        self.scored: dict[int, Example] = {}
        self.sent = self.first = first
        self.end = end

    def ready(self) -> list[Example]:
        """The scored examples that follow those already sent, in input order, up to the first gap."""
        start = self.sent
        while self.sent < len(self.examples) and self.sent in self.scored:
            self.sent += 1
        return [self.scored[i] for i in range(start, self.sent)]

    @property
    def complete(self) -> bool:
        return self.sent == len(self.examples)


class _Loop:
    """The state of one :func:`run_windows`: the batch whose device work is queued, what was written."""

    def __init__(self, out: WriterThread, bar, task, source: str, hint: str | None):
        self.out = out
        self.source = source  # the data file, for check_batch's errors
        self.hint = hint
        self.bar = bar
        self.task = task
        self.pending: tuple[Window, list[int], Any] | None = None  # (its window, its indices there, handle)
        self.tokens = 0
        self.first_tokens: int | None = None  # tokens in the first scored window
        self.phases: set[str] = set()

    def reached(self, phase: str) -> None:
        """Mark ``phase`` (``BRIDGE_TIMINGS``, :mod:`bridgecli.timings`) the first time the loop reaches it."""
        if phase not in self.phases:
            self.phases.add(phase)
            mark(phase)

    def collect(self) -> None:
        """Wait for the pending batch; hand what is ready to the writer, and a window's end once complete."""
        assert self.pending is not None
        win, group, handle = self.pending
        self.pending = None
        results = handle.result()
        check_batch([win.examples[i] for i in group], results, self.source, self.hint)
        self.reached("first batch done")
        for i, sc in zip(group, results):
            if i >= win.first:
                win.scored[i] = msgspec.structs.replace(win.examples[i], scores=sc)
        self.bar.update(self.task, advance=sum(i >= win.first for i in group))
        ready = win.ready()  # written as soon as every example before them is scored
        if ready:
            self.out.put(ready)
            self.tokens += sum(len(ex.tokens.input_ids) for ex in ready)
        if win.complete:
            if self.first_tokens is None:
                self.first_tokens = self.tokens
            self.reached("first window scored")
            self.out.commit(win.end)

    def score(
        self, window: list[Example], end: int, launch, ahead: Ahead, max_tokens: int, batch_size: int, first: int = 0
    ) -> None:
        """Queue each batch of ``window``, collecting the one before it and reading ahead in between. The
        batches are always the whole window's (the scores are those of an uninterrupted run); a batch of
        only the ``first`` examples, which an interrupted run wrote, is left out."""
        self.reached("first window read and tokenised")
        win = Window(window, end, first)
        groups = bucket([len(ex.tokens.input_ids) for ex in window], max_tokens, batch_size)
        groups = [group for group in groups if max(group) >= first]
        step = -(-ahead.most // max(1, len(groups)))  # read the next window over this window's batches
        for group in groups:
            handle = launch([window[i] for i in group])
            self.reached("first batch queued")
            if self.pending is not None:
                self.collect()
            self.pending = (win, group, handle)
            ahead.fill(step)


def run_windows(
    scorer,
    examples: Iterator[Example],
    writer: StreamWriter,
    *,
    window: int,
    batch_size: int,
    max_tokens: int,
    total: int,
    skip: int,
    commit: Callable[[StreamWriter, int], None],
    rank: int | None = None,
    source: str = "<data>",
    hint: str | None = None,
) -> int:
    """Score window after window of ``window`` examples and write each in input order through ``writer``,
    ``commit(writer, position)`` after each; the first ``skip`` inputs were committed by an interrupted run
    (which may have stopped inside a window: that window is scored in its own batches again, and only
    its examples after ``skip`` are written).
    The GPU work of one batch is queued before the results of the one before are collected
    (``scorer.launch``, else ``score`` at once), and between the two the host reads ahead into the next
    window; finished windows go to a writer thread. Each batch's scores are checked before any is written
    (:func:`check_batch`: ``source`` names the data file, ``hint`` ends the error). Returns the number of
    examples written."""
    from .scoring import DoneScores

    launch = scorer.launch or (lambda batch: DoneScores(scorer.score(batch)))
    ahead = Ahead(examples, most=window)
    out = WriterThread(writer, commit, window)
    t0 = time.perf_counter()
    position = 0
    try:
        with progress_bar() as bar:
            task = bar.add_task("scoring", total=total, unit="ex")
            loop = _Loop(out, bar, task, source, hint)
            loop.reached("scoring loop starts")
            while chunk := ahead.take(window):
                start, position = position, position + len(chunk)
                if position <= skip:  # already committed by the interrupted run
                    bar.update(task, completed=position, _start=position)  # the rate counts this run's work only
                    continue
                if start < skip:  # the window an interrupted run stopped in: its first examples are written
                    bar.update(task, completed=skip, _start=skip)
                loop.score(chunk, position, launch, ahead, max_tokens, batch_size, first=max(0, skip - start))
            if loop.pending is not None:
                loop.collect()
            out.close()
            loop.reached("last window written")
    finally:
        if out.thread.is_alive():  # an error in the loop: stop the writer after what it holds
            with contextlib.suppress(BaseException):
                out.close()
    _rate_note(loop.tokens, loop.first_tokens, t0, time.perf_counter() - t0, out.first, rank)
    return writer.count


def _rate_note(tokens: int, first_tokens: int | None, t0: float, elapsed: float, first: float | None, rank) -> None:
    """How fast scoring went; the first window carries one-time work (kernel compilation and autotuning,
    allocator growth), so the rate after it, the steady one, is given too."""
    if not tokens:
        return
    after = ""
    if first is not None and first_tokens is not None and tokens > first_tokens and t0 + elapsed > first:
        steady = (tokens - first_tokens) / (t0 + elapsed - first)
        after = f"; {steady:,.0f} tokens/s after the first window, which took {first - t0:.1f} s"
    note(
        f"scoring took {elapsed:.1f} s for {tokens} tokens ({tokens / elapsed:,.0f} tokens/s"
        + (f", rank {rank}" if rank is not None else "")
        + after
        + ")"
    )
