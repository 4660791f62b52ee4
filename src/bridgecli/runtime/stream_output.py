"""Where a step writes what it makes, in one object (:class:`StreamOutput`): standard output, a file that
appears only when complete (a temporary file renamed over it), or for ``bridge score`` a resumable file
(``<out>.partial`` and its index of committed frames, :mod:`.resumable`), with several ranks this rank's
shard, which rank 0 merges into the output once every rank has finished its own.

It owns every decision about the output: the checks before anything is read (a folder, a place that
cannot be written, binary data on a terminal, ``--resume`` or several ranks without a file), resuming
(the partial file checked against this run's header and cut back to its last commit; a rank's shard
finished before another rank stopped), each commit, and what a run that fails leaves:

- a file: the earlier file is kept, and the temporary one removed; a resumable file keeps the windows
  committed before the error, and says how to go on;
- stopped by SIGINT or SIGTERM, a resumable file whose records are its inputs one for one (score) keeps
  every record written so far, the partial window too, committed, and says how to resume;
- standard output: nothing goes out before the first commit (or the first :data:`HOLD` bytes), so a run
  that fails early leaves no valid-looking prefix; after that, the error says the output is incomplete.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator, cast

from ..errors import BridgeError, UsageError
from ..format.reader import open_reader
from ..format.records import Header
from ..format.spec import RECORDS_PER_FRAME
from ..format.writer import StreamWriter
from ..io import check_stream_output, open_binary_output, open_text_output, reporting_write_errors
from ..progress import note
from . import ranks
from .ranks import Dist
from .resumable import ResumableOutput, header_key

#: bytes of standard output held back until the first commit (past them the stream goes out as it comes)
HOLD = 1 << 20


class _HeldBack:
    """A binary stream that keeps what is written to it until :meth:`release` (or until ``limit`` bytes),
    then writes it through; ``sent`` counts the bytes that went out."""

    def __init__(self, fh: Any, limit: int = HOLD):
        self.fh, self.limit = fh, limit
        self.held: list[bytes] | None = []
        self.size = self.sent = 0

    def write(self, data) -> int:
        if self.held is None:
            self.fh.write(data)
            self.sent += len(data)
        else:
            self.held.append(bytes(data))
            self.size += len(data)
            if self.size >= self.limit:
                self.release()
        return len(data)

    def release(self) -> None:
        if self.held is not None:
            data, self.held = b"".join(self.held), None
            self.fh.write(data)
            self.sent += len(data)
            self.fh.flush()

    def flush(self) -> None:
        if self.held is None:
            self.fh.flush()


class _Text:
    """Text written to a :class:`_HeldBack` as UTF-8."""

    def __init__(self, held: _HeldBack):
        self.held = held

    def write(self, text: str) -> int:
        self.held.write(text.encode("utf-8"))
        return len(text)


class StreamOutput:
    """The output ``out`` of one step (``-``/None: standard output). ``resumable``: a file committed
    window by window that ``resume`` continues, this rank's shard under ``torchrun`` (the ranks'
    shards merged into frames of ``frame`` records); ``inputs_one_for_one``: the stream's records are
    its inputs one for one, so an interrupted run keeps every record written. ``what``: how errors name
    what is written; ``binary``: refused on a terminal (text, :meth:`text`, is not); ``inputs``: the
    files it must not replace (:func:`bridgecli.io.check_output`)."""

    def __init__(
        self,
        out: str | os.PathLike | None,
        *,
        resumable: bool = False,
        resume: bool = False,
        frame: int | None = None,
        inputs_one_for_one: bool = False,
        what: str = "a bridge stream",
        binary: bool = True,
        inputs: Iterable[str | os.PathLike | None] = (),
    ):
        # one line before anything is read: what it would replace (an input, through links too), a terminal
        self.out, self.stdout = out, check_stream_output(out, inputs=inputs, what=what, binary=binary)
        self.dist = Dist.from_env() if resumable else Dist()
        self.resumable, self.resume, self.frame, self.one_for_one = resumable, resume, frame, inputs_one_for_one
        if self.stdout and self.dist.world > 1:
            raise UsageError("several ranks need an output file: pass -o FILE")
        if self.stdout and resume:
            raise UsageError("--resume needs an output file (-o FILE)")
        #: inputs done by the interrupted run that this one resumes
        self.skip = 0
        #: this rank's records when its shard was finished before another rank stopped (nothing to do)
        self.finished: int | None = None
        self._held: _HeldBack | None = None
        self._partial: ResumableOutput | None = None

    # -- a bridge stream ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def writing(self, header: Header) -> Iterator[StreamWriter | None]:
        """The stream's writer, for the block; the output complete (renamed, merged) when it ends, what a
        failure leaves as the module says. None: this rank has nothing to write (:attr:`finished`)."""
        frames = None if self.resumable else RECORDS_PER_FRAME  # a resumable stream's frames end at commits
        if self.resumable and not self.stdout:
            with self._resumable(header) as kept:
                yield kept
            return
        with self._standard_output() if self.stdout else open_binary_output(self.out) as fh:
            writer = StreamWriter(cast(BinaryIO, fh), header, records_per_frame=frames)
            yield writer
            writer.close()

    def commit(self, writer: StreamWriter, position: int) -> None:
        """End the frame written so far; with a resumable file, make it what a resumed run continues from,
        ``position`` inputs on. Standard output: the first commit lets what was held back go out."""
        if self._partial is not None:
            self._partial.commit(writer, position)
            return
        writer.flush()
        if self._held is not None:
            self._held.release()

    # -- text (bridge compact's rows) ------------------------------------------------------------------

    @contextlib.contextmanager
    def text(self) -> Iterator[Any]:
        """A text file for the block: the output file, appearing whole at the end, or standard output, held
        back as a stream is (:meth:`commit` lets it go)."""
        if not self.stdout:
            with open_text_output(self.out) as fh:
                yield fh
            return
        with self._standard_output() as held:
            yield _Text(held)

    # -- where the bytes go ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _standard_output(self) -> Iterator[_HeldBack]:
        with open_binary_output(None, what="text", refuse=False) as stdout:
            self._held = held = _HeldBack(stdout, 0 if sys.stdout.isatty() else HOLD)  # a terminal: at once
            try:
                yield held
                held.release()
            except BaseException as exc:
                if held.sent:
                    _incomplete(exc, held.sent)
                raise

    @contextlib.contextmanager
    def _resumable(self, header: Header) -> Iterator[StreamWriter | None]:
        dist = self.dist
        target = self.target()
        self.finished = self.finished_shard(header)
        if self.finished is not None:  # --resume: written whole before another rank stopped
            note(f"rank {dist.rank}: its shard was finished ({self.finished} examples)")
            yield None
            self._merge()
            return
        partial = self._partial = ResumableOutput(target)
        if not self.resume and partial.leftover():
            note(f"replacing {partial.partial.name} left by an interrupted run (pass --resume to continue it)")
        try:
            with reporting_write_errors(target):  # a full disk: one line naming the output
                # a partial file this run cannot continue stays as it was (open's own errors)
                writer, self.skip = partial.open(header, self.resume)
                if self.skip:
                    note(f"resuming after {self.skip} examples ({writer.count} written)")
                try:
                    yield writer
                    partial.finish(writer)
                except BaseException as exc:
                    self._abandon(exc, writer)
                    raise
        finally:
            self._partial = None
        self._merge()

    def target(self) -> Path:
        """Where this rank writes: its shard next to the output with several ranks, else the output."""
        return self.dist.shard_path(self.out) if self.dist.world > 1 else Path(self.out)  # type: ignore[arg-type]

    def finished_shard(self, header: Header) -> int | None:
        """With ``--resume`` on several ranks: the records of this rank's shard when the interrupted run had
        finished it, so this rank has nothing to score; None when there is a shard to (re)write. A finished
        shard made with other parameters is refused, as a partial one is."""
        shard = self.target()
        if self.dist.world == 1 or not self.resume or not shard.exists() or ResumableOutput(shard).leftover():
            return None
        with open_reader(shard) as reader:
            if header_key(reader.header) != header_key(header):
                raise UsageError(
                    "the finished shard was made with other parameters or data",
                    file=str(shard),
                    hint="delete it, or rerun with the same flags",
                )
            return sum(1 for _ in reader.payloads())

    def _abandon(self, exc: BaseException, writer: StreamWriter) -> None:
        """After a failure: what the partial file keeps, said. Interrupted (SIGINT, SIGTERM), a stream whose
        records are its inputs keeps every record written (the partial window too) as a commit."""
        partial = self._partial
        assert partial is not None
        interrupted = isinstance(exc, (KeyboardInterrupt, SystemExit))
        if interrupted and self.one_for_one and writer.count > partial.records:
            with contextlib.suppress(Exception):  # a commit that fails too keeps the one before
                partial.commit(writer, writer.count)
        kept = partial.abandon()
        if kept:
            note(("interrupted: " if interrupted else "") + kept)
        elif interrupted:
            note(f"interrupted before any example was written: nothing kept in {partial.partial.name}")

    def _merge(self) -> None:
        """Several ranks: once every rank has its shard, rank 0 merges them into the output."""
        dist = self.dist
        if dist.world == 1:
            return
        ranks.gather(None)  # every shard is complete
        merged = ranks.merge_shards(dist, self.out, frame=self.frame)  # type: ignore[arg-type]
        if dist.rank == 0:
            note(f"merged {dist.world} shards: {merged} examples")


def _incomplete(exc: BaseException, sent: int) -> None:
    """A run that fails after ``sent`` bytes went to standard output: its error says the output there is
    incomplete (a one-line error gets it appended; anything else is preceded by a line of its own)."""
    what = f"the output on stdout is incomplete ({sent:,} bytes went out before this)"
    if isinstance(exc, BridgeError):
        exc.message = f"{exc.message}; {what}"
        exc.args = (exc.render(),)
    elif not isinstance(exc, BrokenPipeError):  # nobody reads them
        sys.stderr.write(f"bridge: {what}\n")


__all__ = ["HOLD", "StreamOutput"]
