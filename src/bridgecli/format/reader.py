"""Read a bridge stream, checking every layer: magic, version, zstd checksums, record CRCs, order, count."""

from __future__ import annotations

import contextlib
import os
import zlib
from typing import BinaryIO, Iterator, Union, cast

import msgspec
import zstandard

from ..errors import FormatError
from ..io import describe, open_binary_input
from .records import End, Example, Header, Record
from .spec import MAJOR, MAGIC, MAX_RECORD_BYTES, PREAMBLE, RECORD_PREFIX
from .validate import Validator

_decoder = msgspec.msgpack.Decoder(Record)


class _HeaderTag(msgspec.Struct, tag="header"):
    pass


class _ExampleTag(msgspec.Struct, tag="example"):
    pass


#: which kind of record a payload holds, without decoding its fields (for :meth:`StreamReader.payloads`)
_kind_decoder = msgspec.msgpack.Decoder(Union[_HeaderTag, _ExampleTag, End])


def decode_example(payload: bytes, name: str, position: int) -> Record:
    """Decode one record's payload as :meth:`StreamReader.__iter__` does (same error)."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise FormatError(f"cannot decode record ({exc})", file=name, record=position) from None


def _looks_like_text(head: bytes) -> str | None:
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        return "it looks like JSON/JSONL data: run `bridge score` on it to make a stream"
    if head[:4] == b"\x28\xb5\x2f\xfd":
        return "it is a bare zstd file, not a bridge stream"
    if head[:4] == b"PAR1":
        return "it looks like Parquet data: run `bridge score` on it to make a stream"
    return None


class _Available:
    """Hand zstandard whatever bytes are available (``read1``) instead of letting a buffered pipe
    block until a whole ``read_size`` chunk (128 KiB) arrives: records stream as frames are flushed."""

    def __init__(self, fh: BinaryIO):
        self.read = getattr(fh, "read1", fh.read)


class StreamReader:
    """Iterate the Example records of a stream. ``header`` is read on construction; iteration
    raises :class:`FormatError` on truncation or corruption, after yielding every good record."""

    def __init__(self, fh: BinaryIO, name: str = "<stream>", *, validate: bool = True):
        self.name = name
        head = fh.read(PREAMBLE.size)
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
        self._z = zstandard.ZstdDecompressor().stream_reader(
            cast(BinaryIO, _Available(fh)), read_across_frames=True, closefd=False
        )
        self._index = 0
        first = self._next_record(expect="header")
        if not isinstance(first, Header):
            raise FormatError("the first record is not a header", file=name, record="header record")
        self.header: Header = first
        # every example's internal consistency (format/validate.py); off only to test the wire format
        self._validate = Validator(name, first) if validate else (lambda ex, position: None)
        self.count: int | None = None

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

    def _after_end(self) -> bool:
        """Whether anything follows the end record: more zstd content, or bytes that are no zstd frame."""
        try:
            return bool(self._z.read(1))
        except zstandard.ZstdError as exc:
            if "Unknown frame descriptor" in str(exc):  # trailing bytes that are not a zstd frame
                return True
            raise FormatError(f"corrupted compressed data ({exc})", file=self.name, record="end record") from None

    def _end(self, rec: End) -> None:
        if rec.count != self._index:
            raise FormatError(
                f"corrupted: end record counts {rec.count} examples but {self._index} were read",
                file=self.name,
            )
        if self._after_end():
            raise FormatError(
                "corrupted: data after the end record",
                file=self.name,
                hint="a bridge file holds exactly one stream; were two files concatenated?",
            )
        self.count = rec.count

    def __iter__(self) -> Iterator[Example]:
        while True:
            rec = self._next_record(expect="example")
            if isinstance(rec, End):
                self._end(rec)
                return
            if isinstance(rec, Header):
                raise FormatError("a second header inside the stream", file=self.name, record=self._index)
            self._validate(rec, self._index)
            yield rec
            self._index += 1

    def payloads(self) -> Iterator[bytes]:
        """The Example records' payloads, undecoded and unvalidated (checksums, order and count checked as
        in iteration): for a process pool that decodes them with :func:`decode_example` and checks them
        with ``Validator.check``; the pool's parent checks ids with ``Validator.seen``."""
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


@contextlib.contextmanager
def open_reader(path: str | os.PathLike | None) -> Iterator[StreamReader]:
    """Open ``path`` (``-``/None for stdin) as a bridge stream."""
    with open_binary_input(path) as fh:
        yield StreamReader(fh, describe(path))


def read_all(path: str | os.PathLike) -> tuple[Header, list[Example]]:
    with open_reader(path) as reader:
        return reader.header, list(reader)
