"""A data file as ``bridge score`` reads it: twice, no more. The first pass over the bytes gives its
content digest (:func:`~bridgecli.data.examples.file_digest`'s, to recognise the file warmup read), the
number of records (the progress bar's total) and the check that it holds any (refused before a model
loads, unless ``--allow-empty``); data on stdin is copied to a temporary file in that pass. The second
pass reads and tokenises the examples (:meth:`DataSource.examples`).

One pass covers JSONL, plain or ``.gz``/``.bz2`` (a record is a non-blank line; the first one is decoded,
so a file that does not start with a JSON object is refused at once; a later bad line is refused where
the examples reach it). A JSON array, a Parquet file or a ``save_to_disk`` folder is digested and counted
in passes of its own (its records are counted by reading them).
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import hashlib
import io
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import msgspec

from ..errors import BridgeError, InputError
from ..format.records import Example
from ..io import reporting_write_errors
from .examples import CHOOSE_SPLIT, DataOptions, Report, file_digest, iter_examples, with_model_limit
from .sources import _not_utf8, read_records

#: bytes read at a time
CHUNK = 1 << 20
STDIN = "<stdin>"
_COMPRESSED = {".gz": gzip.GzipFile, ".bz2": bz2.BZ2File}


class _Hashing(io.RawIOBase):
    """The bytes read through it from ``fh`` go into ``digest`` (and, when given, are copied to ``copy``)."""

    def __init__(self, fh: BinaryIO, digest: Any, copy: BinaryIO | None = None):
        self.fh, self.digest, self.copy = fh, digest, copy

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.fh.read(len(buffer))
        self.digest.update(data)
        if self.copy is not None:
            self.copy.write(data)
        buffer[: len(data)] = data
        return len(data)


def _jsonl_scan(raw: BinaryIO, where: str) -> int:
    """Non-blank lines of a JSONL stream (decompressed); the first one decoded, an :class:`InputError`
    naming ``where`` and its line when it is not UTF-8 JSON holding an object."""
    count, lineno, rest = 0, 0, b""
    while chunk := raw.read(CHUNK):
        lines = (rest + chunk).split(b"\n")
        rest = lines.pop()
        for line in lines:
            lineno += 1
            if line.strip():
                count += 1
                if count == 1:
                    _check_first(line, where, lineno)
    if rest.strip():
        count += 1
        if count == 1:
            _check_first(rest, where, lineno + 1)
    return count


def _check_first(line: bytes, where: str, lineno: int) -> None:
    """The first record of a JSONL file holds a JSON object, as the reader requires of each."""
    try:
        record = msgspec.json.decode(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputError(_not_utf8(exc), file=where, record=f"line {lineno}") from None
    except msgspec.DecodeError as exc:
        raise InputError(f"invalid JSON ({exc})", file=where, record=f"line {lineno}") from None
    if not isinstance(record, dict):
        raise InputError(f"expected a JSON object, got {type(record).__name__}", file=where, record=f"line {lineno}")


@dataclass
class DataSource:
    """A data file scanned once (:meth:`scan`): its digest and records; its examples on demand."""

    #: the file read (a temporary copy for data on stdin)
    path: str
    #: how errors and the stream's header name it (``<stdin>`` for stdin)
    name: str
    digest: str
    #: records in the file, before ``--limit``
    records: int
    opts: DataOptions
    #: the examples scored: records up to ``--limit`` (before any is left out)
    total: int = 0
    #: what was left out, filled in as the examples are read
    report: Report = field(default_factory=Report)
    _copy: Any = None  # the temporary folder of stdin's copy (removed with this object, or at exit)

    @classmethod
    def scan(
        cls, path: str | None, opts: DataOptions, *, allow_empty: bool = False, name: str | None = None
    ) -> DataSource:
        """Read ``path`` (``-``/None: stdin, copied to a temporary file) once: its digest, its records and
        the check that it holds some (:class:`InputError`, one line, unless ``allow_empty``). ``name``: how
        errors name the data (default: the path, or ``<stdin>``)."""
        copy = None
        if path is None or str(path) == "-":
            copy = tempfile.TemporaryDirectory(prefix="bridge-stdin-")
            target = Path(copy.name) / "stdin.jsonl"
            given = STDIN
        else:
            target, given = Path(path), str(path)
        name = name or given
        try:
            digest, records = _first_pass(target, name, opts.split, copy is not None)
        except BaseException:
            if copy is not None:
                copy.cleanup()
            raise
        if records == 0 and not allow_empty:
            raise InputError("holds no records", file=name, hint="pass --allow-empty to accept an empty result")
        total = records if opts.limit is None else min(records, opts.limit)
        return cls(str(target), name, digest, records, opts, total, _copy=copy)

    def bound(self, model: Any = None, warmup: Any = None, *, shard: tuple[int, int] | None = None) -> DataSource:
        """This source with the options a scoring run resolves: ``--max-length`` from ``model``'s limit
        (:func:`~bridgecli.data.examples.with_model_limit`), the ids ``warmup`` (its
        :class:`~bridgecli.artifacts.warmup_run.WarmupMeta`) used when this is the data it read, this
        rank's ``shard``."""
        opts = with_model_limit(self.opts, model) if model is not None else self.opts
        exclude = (warmup.leave_out(self.digest) if warmup is not None else None) or frozenset()
        return dataclasses.replace(self, opts=dataclasses.replace(opts, exclude_ids=exclude, shard=shard))

    def examples(self, tokenizer, process: Any = None) -> Iterator[Example]:
        """The examples, tokenised (by the tokenising ``process`` once it is ready,
        :func:`~bridgecli.data.prefetch.handover`); what is left out goes into :attr:`report`. An error
        names the data as the user gave it."""
        if process is not None:
            from .prefetch import handover

            found = handover(self.path, tokenizer, self.opts, self.report, process)
        else:
            found = iter_examples(self.path, tokenizer, self.opts, self.report)
        try:
            yield from found
        except BridgeError as err:
            if err.file == self.path and self.name != self.path:
                err.file = self.name
                err.args = (err.render(),)
            raise


def _first_pass(path: Path, name: str, split: str | None, stdin: bool) -> tuple[str, int]:
    """(digest, records) of ``path``; for stdin, ``path`` is written from it on the way."""
    if stdin:
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no data: give a DATA file or pipe JSONL into stdin", file=name)
        digest = hashlib.sha256(path.name.encode())
        with reporting_write_errors(path), open(path, "wb") as copy:  # a full /tmp: one line naming the copy
            records = _jsonl_scan(_Hashing(sys.stdin.buffer, digest, copy), name)  # type: ignore[arg-type]
        return "sha256:" + digest.hexdigest(), records
    lower = path.name.lower()
    if path.is_file() and lower.endswith((".jsonl", ".ndjson", ".jsonl.gz", ".jsonl.bz2")):
        digest = hashlib.sha256(path.name.encode())
        with open(path, "rb") as fh:
            raw: Any = _Hashing(fh, digest)
            opener = _COMPRESSED.get(path.suffix)
            data = opener(fileobj=io.BufferedReader(raw)) if opener is not None else raw
            try:
                records = _jsonl_scan(data, name)
            except (OSError, EOFError) as exc:  # a broken .gz/.bz2
                raise InputError(f"cannot read it ({exc})", file=name) from None
            while raw.read(CHUNK):  # bytes after the compressed data: digested too
                pass
        return "sha256:" + digest.hexdigest(), records
    # another format (or a missing file: read_records names it): its own passes
    records = sum(1 for _ in read_records(path, split, choose=CHOOSE_SPLIT))
    return file_digest(path), records


__all__ = ["DataSource", "STDIN"]
