"""Read a bridge stream, checking every layer: magic, version, zstd checksums, record CRCs, order, count."""

from __future__ import annotations

import contextlib
import os
import zlib
from typing import BinaryIO, Iterator, cast

import msgspec
import zstandard

from ..errors import FormatError
from ..io import describe, open_binary_input
from .decoding import (  # noqa: F401  (decode_example, example_index, frame_payloads, frame_records: re-exported)
    _HeaderTag,
    _decoder,
    _kind_decoder,
    _one_record,
    decode_example,
    example_index,
    frame_payloads,
    frame_records,
)
from .records import End, Example, Header
from .spec import MAJOR, MAGIC, PREAMBLE, RECORD_PREFIX, MAX_RECORD_BYTES
from .tape import _READ_SIZE, _Tape
from .validate import Validator


def _looks_like_text(head: bytes) -> str | None:
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "it looks like JSON/JSONL data: run `bridge score` on it to make a stream"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "it is a bare zstd file, not a bridge stream"
    if head[:4] == b"PAR1":
        return "it looks like Parquet data: run `bridge score` on it to make a stream"
    return None


class StreamReader:
    """Iterate the Example records of a stream. ``header`` is read on construction; iteration
    raises :class:`FormatError` on truncation or corruption, after yielding every good record."""

    def __init__(self, fh: BinaryIO, name: str = "<stream>", *, validate: bool = True):
        self.name = name
        self._tape = _Tape(fh)
        head = self._tape.read(PREAMBLE.size)
        if len(head) < PREAMBLE.size:
            hint = _looks_like_text(head) if head else None
            raise FormatError(
                "empty or truncated file: no bridge preamble" if not hint else "not a bridge stream",
                file=name,
                hint=hint,
            )
        magic, major, minor = PREAMBLE.unpack(head)
        if magic != MAGIC:
            raise FormatError("not a bridge stream (bad magic bytes)", file=name, hint=_looks_like_text(head))
        if major > MAJOR:
            raise FormatError(
                f"written with stream format {major}.{minor}; this bridgecli reads format {MAJOR}.x",
                file=name,
                hint="upgrade bridgecli to read it",
            )
        if major < MAJOR:
            raise FormatError(
                f"stream format {major}.{minor} does not exist (this bridgecli reads format {MAJOR}.x)",
                file=name,
                hint="the file is damaged or was not written by bridgecli",
            )
        self.version = (major, minor)
        self._tape.walk_from(PREAMBLE.size)
        self._z = self._decompressor()
        self._index = 0
        first = self._next_record(expect="header")
        if not isinstance(first, Header):
            raise FormatError("the first record is not a header", file=name, record="header record")
        self.header: Header = first
        # every example's internal consistency (format/validate.py); off only to test the wire format
        self._validate = Validator(name, first) if validate else (lambda ex, position: None)
        self.count: int | None = None

    def _decompressor(self):
        return zstandard.ZstdDecompressor().stream_reader(
            cast(BinaryIO, self._tape), read_size=_READ_SIZE, read_across_frames=True, closefd=False
        )

    def _read_exact(self, n: int, what: str | int) -> bytes:
        chunks = []
        got = 0
        while got < n:
            try:
                chunk = self._z.read(n - got)
            except zstandard.ZstdError as exc:
                raise FormatError(f"corrupted compressed data ({exc})", file=self.name, record=what) from None
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _next_payload(self, expect: str) -> bytes:
        where: str | int = "header record" if expect == "header" else self._index
        prefix = self._read_exact(RECORD_PREFIX.size, where)
        if len(prefix) < RECORD_PREFIX.size:
            if expect == "header":
                raise FormatError("truncated: no header record", file=self.name)
            raise FormatError(
                f"truncated: the stream ends after {self._index} records without an end record",
                file=self.name,
                hint="the writer was interrupted; rerun the step that made it",
            )
        length, crc = RECORD_PREFIX.unpack(prefix)
        if length > MAX_RECORD_BYTES:
            raise FormatError(f"corrupted: record length {length} is implausible", file=self.name, record=where)
        payload = self._read_exact(length, where)
        if len(payload) < length:
            raise FormatError(
                f"truncated inside record {where} after {self._index} complete records",
                file=self.name,
                hint="the writer was interrupted; rerun the step that made it",
            )
        if zlib.crc32(payload) != crc:
            raise FormatError("corrupted: checksum mismatch", file=self.name, record=where)
        return payload

    def _next_record(self, expect: str):
        payload = self._next_payload(expect)
        where = "header record" if expect == "header" else self._index
        try:
            return _decoder.decode(payload)
        except msgspec.DecodeError as exc:
            raise FormatError(f"cannot decode record ({exc})", file=self.name, record=where) from None

    def _after_end(self) -> str | None:
        """What follows the end record, if anything does (the error's hint): more zstd content, bytes that are no
        zstd frame, or a frame cut short (which the decompressor passes over in silence: the walk of the
        frames sees it). Skippable frames and frames without content may follow."""
        concatenated = "a bridge file holds exactly one stream; were two files concatenated?"
        try:
            if self._z.read(1):
                return concatenated
        except zstandard.ZstdError as exc:
            if "Unknown frame descriptor" in str(exc):  # trailing bytes that are not a zstd frame
                return concatenated
            raise FormatError(f"corrupted compressed data ({exc})", file=self.name, record="end record") from None
        walk = self._tape.walk
        if walk is not None and not walk.whole:
            return "the file goes on with bytes that are no whole zstd frame: damaged, or cut short"
        return None

    def _end(self, rec: End) -> None:
        if rec.count != self._index:
            raise FormatError(
                f"corrupted: end record counts {rec.count} examples but {self._index} were read",
                file=self.name,
            )
        after = self._after_end()
        if after is not None:
            raise FormatError("corrupted: data after the end record", file=self.name, hint=after)
        self.count = rec.count

    def __iter__(self) -> Iterator[Example]:
        self._tape.release()
        while True:
            rec = self._next_record(expect="example")
            if isinstance(rec, End):
                self._end(rec)
                return
            if isinstance(rec, Header):
                raise FormatError("a second header inside the stream", file=self.name, record=self._index)
            self._validate(rec, self._index)
            self._index += 1  # counted before it is handed out: a caller may stop there (:meth:`check_rest`)
            yield rec

    def check_rest(self) -> None:
        """Read what is left of the stream after the examples iterated so far, as every step reads a whole
        stream: checksums, record order, the end record's count and what follows it (the same
        :class:`FormatError`), without decoding or validating the rest's examples. For a step that needs
        only one example (``bridge show``) and must not accept a stream the others refuse."""
        for _ in self.payloads():
            pass

    def payloads(self) -> Iterator[bytes]:
        """The Example records' payloads, undecoded and unvalidated (checksums, order and count checked as
        in iteration): for a process pool that decodes them with :func:`decode_example` and checks them
        with ``Validator.check``; the pool's parent checks ids with ``Validator.seen``."""
        self._tape.release()
        while True:
            payload = self._next_payload(expect="example")
            try:
                kind = _kind_decoder.decode(payload)
            except msgspec.DecodeError:
                kind = None  # the worker's full decode reports it, in order
            if isinstance(kind, End):
                self._end(kind)
                return
            if isinstance(kind, _HeaderTag):
                raise FormatError("a second header inside the stream", file=self.name, record=self._index)
            yield payload
            self._index += 1

    def frames(self, most: int) -> Iterator[tuple[int, int, bytes | int]]:
        """``(offset, size, frame)`` of each zstd frame after the header's, undecompressed, for a process pool
        that reads its records with :func:`frame_payloads`: ``frame`` is the frame's bytes or, from a regular
        file, their position in :attr:`fd` (to read with ``os.pread``: the bytes never pass through here).
        Nothing when the header's frame holds more than the header; they stop (nothing taken) at the first
        that :meth:`_Tape.frame_size` refuses (at most ``most`` bytes each) or at the input's end. Once one is
        handed out, the reader reads on only after :meth:`restart`; until then it keeps the bytes from each
        frame's offset on, up to :meth:`release`. Call it before iterating or :meth:`payloads`."""
        tape = self._tape
        after_header = tape.tell()
        tape.seek(PREAMBLE.size)
        size = tape.frame_size(most)
        head = tape._bytes(PREAMBLE.size, PREAMBLE.size + size) if size is not None else None
        taken = False
        if head is not None and _one_record(head):
            tape.seek(PREAMBLE.size + len(head))
            while True:
                offset = tape.tell()
                size = tape.frame_size(most)
                if size is None:
                    break
                taken = True
                yield offset, size, tape.take(size)
        if not taken:  # the reader goes on as if nothing was read
            tape.seek(after_header)

    @property
    def fd(self) -> int | None:
        """The input's file descriptor when it is a regular file (see :meth:`frames`), else None."""
        return self._tape.fd

    def release(self, upto: int) -> None:
        """Drop the input's bytes before offset ``upto`` (no :meth:`restart` will go back there)."""
        self._tape.release(upto)

    def restart(self, offset: int, index: int) -> None:
        """Read on from ``offset``, a frame's from :meth:`frames` (or where the last one ended), as if
        ``index`` examples had been read (errors name the records as reading the whole stream does)."""
        self._tape.seek(offset)
        self._tape.walk_from(offset)
        self._z = self._decompressor()
        self._index = index


@contextlib.contextmanager
def open_reader(path: str | os.PathLike | None) -> Iterator[StreamReader]:
    """Open ``path`` (``-``/None for stdin) as a bridge stream."""
    with open_binary_input(path) as fh:
        yield StreamReader(fh, describe(path))


def read_all(path: str | os.PathLike) -> tuple[Header, list[Example]]:
    with open_reader(path) as reader:
        return reader.header, list(reader)
