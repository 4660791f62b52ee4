"""Resumable stream output: ``<out>.partial`` plus an index of committed frame boundaries.

Frames end only at commits (a window of examples), and every commit appends ``{bytes, records,
position}`` to ``<out>.partial.idx`` after an fsync. After a crash (even ``kill -9``) a run with
``--resume`` cuts the partial file back to the last committed boundary, checks that it was made
with the same parameters, and appends from there; the finished file is byte-identical to an
uninterrupted run's (the original header is kept).

The partial files lie next to the real output (an output given as a symbolic link is written through
it, and two runs writing one file through different names share one lock). A run that fails before
its first commit of input (a full disk while writing the header, say) removes them.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import BinaryIO

import msgspec

from ..errors import UsageError
from ..format.reader import StreamReader
from ..io import lock_exclusively, real_path
from ..format.records import Header
from ..format.writer import StreamWriter


def header_key(h: Header) -> bytes:
    """A header without its timestamps: what must match for a run to resume another."""
    steps = [msgspec.structs.replace(s, time="") for s in h.steps]
    return msgspec.json.encode(msgspec.structs.replace(h, created="", steps=steps))


class ResumableOutput:
    def __init__(self, out: str | os.PathLike):
        self.out = Path(out)
        self.real = real_path(self.out)  # where the output, its partial file and its index lie
        self.partial = self.real.with_name(self.real.name + ".partial")
        self.index = self.real.with_name(self.real.name + ".partial.idx")
        self._fh: BinaryIO | None = None  # the partial file, open from open() until finish()
        self.position = 0  # input examples done at the last commit
        self.records = 0  # examples written at the last commit

    def _last_commit(self) -> dict | None:
        if not (self.partial.exists() and self.index.exists()):
            return None
        last = None
        for line in self.index.read_text().splitlines():
            try:
                last = json.loads(line)
            except json.JSONDecodeError:  # a torn last line: the commit before it stands
                break
        return last

    def open(self, header: Header, resume: bool) -> tuple[StreamWriter, int]:
        """Return a writer and the number of input examples already done."""
        commit = self._last_commit() if resume else None
        if commit is not None:
            with open(self.partial, "rb") as fh:
                old = StreamReader(fh, str(self.partial)).header
            if header_key(old) != header_key(header):
                raise UsageError(
                    "the partial output was made with other parameters or data",
                    file=str(self.partial),
                    hint="delete it, or rerun with the same flags",
                )
            self._fh = part = open(self.partial, "r+b")
            lock_exclusively(part, self.partial, "partial output")
            part.truncate(commit["bytes"])
            part.seek(commit["bytes"])
            self.position, self.records = commit["position"], commit["records"]
            return StreamWriter.append(part, commit["records"], records_per_frame=None), commit["position"]
        if resume:
            raise UsageError(f"nothing to resume: no {self.partial.name} with an index next to the output")
        self.real.parent.mkdir(parents=True, exist_ok=True)
        self._fh = fresh = open(self.partial, "ab")  # not "wb": a running writer's file stays intact until locked
        lock_exclusively(fresh, self.partial, "partial output")
        try:
            fresh.truncate(0)
            self.index.write_text("")
            writer = StreamWriter(fresh, header, records_per_frame=None)
            self.commit(writer, 0)
        except BaseException:
            self.abandon()  # nothing done yet: both files go
            raise
        return writer, 0

    def _file(self) -> BinaryIO:
        assert self._fh is not None, "the partial output is not open"
        return self._fh

    def commit(self, writer: StreamWriter, position: int) -> None:
        fh = self._file()
        writer.flush()
        fh.flush()
        os.fsync(fh.fileno())
        with open(self.index, "a") as idx:
            idx.write(json.dumps({"bytes": fh.tell(), "records": writer.count, "position": position}) + "\n")
            idx.flush()
            os.fsync(idx.fileno())
        self.position, self.records = position, writer.count

    def finish(self, writer: StreamWriter) -> None:
        fh = self._file()
        writer.close()
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        self._fh = None
        os.replace(self.partial, self.real)
        self.index.unlink(missing_ok=True)

    def leftover(self) -> bool:
        return self.partial.exists()

    def abandon(self) -> str | None:
        """After a failed run: remove the partial output when no input was done at its last commit (there
        is nothing to resume); otherwise keep it and return a line saying what it holds and how to go on."""
        if self._fh is not None:
            with contextlib.suppress(OSError):  # what a full disk kept buffered is lost, not raised again
                self._fh.close()  # the lock goes with it
            self._fh = None
        if self.position == 0:
            self.partial.unlink(missing_ok=True)
            self.index.unlink(missing_ok=True)
            return None
        return (
            f"kept {self.records} scored examples ({self.position} inputs done) in {self.partial}: "
            "rerun with --resume to continue (the same data and flags; other data starts afresh)"
        )
