"""Write a bridge stream: preamble, then records framed with length + CRC-32, in zstd frames."""

from __future__ import annotations

import contextlib
import io
import os
import zlib
from typing import BinaryIO, Iterator

import msgspec
import zstandard

from ..io import open_binary_output
from .records import End, Example, Header
from .spec import MAJOR, MINOR, MAGIC, PREAMBLE, RECORD_PREFIX, RECORDS_PER_FRAME, ZSTD_LEVEL

_encoder = msgspec.msgpack.Encoder()


def encode_record(record: Header | Example | End) -> bytes:
    return frame_payload(_encoder.encode(record))


def encode_payload(record: Header | Example | End) -> bytes:
    """A record's msgpack payload, without its framing (:func:`frame_payload` adds it)."""
    return _encoder.encode(record)


def frame_payload(payload: bytes) -> bytes:
    """A record's bytes as written: its msgpack payload after its length and CRC-32."""
    return RECORD_PREFIX.pack(len(payload), zlib.crc32(payload)) + payload


def compress_frame(records: list[bytes]) -> bytes:
    """One zstd frame holding ``records`` (each from :func:`encode_record`), compressed exactly as
    :class:`StreamWriter` compresses a frame (same level, checksum, and one write per record)."""
    out = io.BytesIO()
    zw = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).stream_writer(
        out, closefd=False, write_return_read=True
    )
    for r in records:
        zw.write(r)
    zw.flush(zstandard.FLUSH_FRAME)
    return out.getvalue()


class StreamWriter:
    """Writes one stream to a binary file object. Call :meth:`close` (or use as a context manager)
    to write the end record; a stream without it reads as truncated."""

    def __init__(
        self, fh: BinaryIO, header: Header | None, *, records_per_frame: int | None = RECORDS_PER_FRAME, count: int = 0
    ):
        """``records_per_frame=None`` ends frames only on :meth:`flush` (deterministic frame
        boundaries, used for resumable output). ``header=None`` continues a stream whose preamble,
        header and ``count`` examples are already in ``fh`` (see :meth:`append`)."""
        self._fh = fh
        self._records_per_frame = records_per_frame
        self._pending = 0
        self.count = count
        self._closed = False
        if header is not None:
            fh.write(PREAMBLE.pack(MAGIC, MAJOR, MINOR))
        self._zw = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).stream_writer(
            fh, closefd=False, write_return_read=True
        )
        if header is not None:
            self._write(header)
            self.flush()

    @classmethod
    def append(cls, fh: BinaryIO, count: int, **kwargs) -> "StreamWriter":
        """Continue a stream cut at a frame boundary after ``count`` examples (``fh`` at its end)."""
        return cls(fh, None, count=count, **kwargs)

    def _write(self, record) -> None:
        self._zw.write(encode_record(record))
        self._pending += 1
        if self._records_per_frame is not None and self._pending >= self._records_per_frame:
            self.flush()

    def write_encoded(self, record: bytes) -> None:
        """Write one Example record already framed by :func:`encode_record`."""
        self._zw.write(record)
        self._pending += 1
        self.count += 1
        if self._records_per_frame is not None and self._pending >= self._records_per_frame:
            self.flush()

    def write_frame(self, frame: bytes, records: int) -> bool:
        """Write a whole zstd frame of ``records`` Example records made by :func:`compress_frame`, when it
        falls where this writer would end one (nothing pending, ``records`` a full frame): the file is then
        byte-identical to writing them one by one. False (nothing written) otherwise."""
        if self._pending or records != self._records_per_frame:
            return False
        self._fh.write(frame)
        self._fh.flush()
        self.count += records
        return True

    def write(self, example: Example) -> None:
        self._write(example)
        self.count += 1

    def flush(self) -> None:
        """End the current zstd frame so a reader on the other side of a pipe sees every record so far."""
        if self._pending:
            self._zw.flush(zstandard.FLUSH_FRAME)
            self._fh.flush()
            self._pending = 0

    def close(self) -> None:
        if self._closed:
            return
        self._write(End(count=self.count))
        self.flush()
        self._closed = True

    def __enter__(self) -> "StreamWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()


@contextlib.contextmanager
def open_writer(path: str | os.PathLike | None, header: Header, **kwargs) -> Iterator[StreamWriter]:
    """Open ``path`` (``-`` for stdout) and write a stream; the file appears only when complete."""
    with open_binary_output(path, what="a bridge stream") as fh:
        writer = StreamWriter(fh, header, **kwargs)
        yield writer
        writer.close()
