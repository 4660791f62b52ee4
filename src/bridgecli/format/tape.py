"""A stream's bytes as its reader reads them, and its zstd frame structure, walked without decompressing.

:class:`_Tape` is the source that :class:`~bridgecli.format.reader.StreamReader`'s zstd reader reads from:
it keeps what it read until released, so a reader can restart at an earlier frame boundary, and it finds
where each frame ends from its block headers alone (for the process pool that reads frames itself).
:class:`_FrameWalk` follows the frame structure of the bytes the decompressor is given, to tell a stream
that ends on a whole frame from one that goes on with a frame cut short.
"""

from __future__ import annotations

import bisect
import os
import stat
from typing import BinaryIO

import zstandard

#: what a zstd stream reader asks its source for at a time (zstandard's default ``read_size``)
_READ_SIZE = zstandard.DECOMPRESSION_RECOMMENDED_INPUT_SIZE

_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: skippable frames' magic numbers: 0x184D2A50 to 0x184D2A5F (little endian)
_SKIPPABLE = range(0x184D2A50, 0x184D2A60)


class _FrameWalk:
    """Follows the zstd frame structure of the bytes the decompressor is given, without decompressing
    them: a frame's magic, its header's size (from the descriptor byte), each block's 3-byte header and
    the checksum; a skippable frame's magic and size. Payload bytes are skipped, not looked at. The
    decompressor itself stops quietly where the input ends inside a frame (a stray byte 0x50, a skippable
    frame cut short, an empty frame's first bytes): :attr:`whole` says whether the bytes walked so far end
    at a frame boundary, with nothing but whole frames before it."""

    def __init__(self, at: int):
        self.reset(at)

    def reset(self, at: int) -> None:
        """Walk on from offset ``at``, a frame boundary."""
        self.at = at  # the offset of the next byte to walk
        self.broken = False  # bytes that are no frame
        self._state = "magic"
        self._need = 4  # the bytes of the header part the state reads
        self._head = b""
        self._skip = 0  # payload bytes left to pass over
        self._last = False  # the current block is the frame's last
        self._checksum = False

    @property
    def whole(self) -> bool:
        return not self.broken and self._state == "magic" and not self._head and not self._skip

    def feed(self, data: bytes, offset: int) -> None:
        """The input's bytes from ``offset`` on (those walked before are passed over)."""
        if self.broken or offset + len(data) <= self.at:
            return
        if offset > self.at:  # bytes the walk never saw: it cannot vouch for them
            self.broken = True
            return
        view = memoryview(data)[self.at - offset :]
        self.at += len(view)
        i, n = 0, len(view)
        while i < n and not self.broken:
            if self._skip:
                step = min(self._skip, n - i)
                self._skip -= step
                i += step
                continue
            piece = bytes(view[i : i + self._need - len(self._head)])
            i += len(piece)
            self._head += piece
            if len(self._head) == self._need:
                head, self._head = self._head, b""
                self._step(head)

    def _step(self, head: bytes) -> None:
        state = self._state
        if state == "magic":
            if head == _ZSTD_MAGIC:
                self._state, self._need = "descriptor", 1
            elif int.from_bytes(head, "little") in _SKIPPABLE:
                self._state, self._need = "skippable", 4
            else:
                self.broken = True
        elif state == "skippable":
            self._skip = int.from_bytes(head, "little")
            self._state, self._need = "magic", 4
        elif state == "descriptor":
            fhd = head[0]
            single = fhd >> 5 & 1
            rest = (1 - single) + (0, 1, 2, 4)[fhd & 3] + (single, 2, 4, 8)[fhd >> 6]
            self._checksum = bool(fhd & 0x04)
            self._state, self._need = ("header", rest) if rest else ("block", 3)
        elif state == "header":
            self._state, self._need = "block", 3
        elif state == "block":
            header = int.from_bytes(head, "little")
            kind = header >> 1 & 3
            if kind == 3:  # reserved: the decompressor refuses it too
                self.broken = True
                return
            self._skip = 1 if kind == 1 else header >> 3
            if not header & 1:
                self._state, self._need = "block", 3
            elif self._checksum:
                self._state, self._need = "checksum", 4
            else:
                self._state, self._need = "magic", 4
        else:  # checksum
            self._state, self._need = "magic", 4


def _regular_file(fh: BinaryIO) -> tuple[int, int] | None:
    """(file descriptor, offset of the next byte) when ``fh`` reads a regular file, else None."""
    try:
        fd = fh.fileno()
        return (fd, fh.tell()) if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        return None


class _Tape:
    """A stream's bytes as its zstd reader reads them: ``read`` returns whatever the input has available
    (its ``read1``: a buffered pipe would otherwise block until a whole ``read_size`` chunk of 128 KiB
    arrives; records stream as frames are flushed). Until :meth:`release`, the tape keeps what it read,
    in the chunks the input gave, so that a new zstd reader can start at an earlier frame boundary
    (:meth:`seek`) and read the very chunks the first one would have.

    :meth:`frame_size` finds where the zstd frame at the current offset ends by walking its block headers,
    without decompressing it; :meth:`take` hands the frame out. When the input is a regular file, the tape
    reads those headers alone, where they lie (``os.pread``), and a frame is handed out as its position in
    the file (:attr:`fd`), for a process that reads it itself: the frames' bytes never pass through here.
    A reader that restarts beyond what the tape holds then reads the file from the chunk that a reader from
    the start would have read there (after the chunks held, the input gives ``_READ_SIZE`` bytes at a time)."""

    def __init__(self, fh: BinaryIO):
        self._fh = fh
        self._read1 = getattr(fh, "read1", fh.read)
        self._starts: list[int] = []  # the input offset of each chunk kept
        self._chunks: list[bytes] = []
        self._end = 0  # the input offset after the chunks read so far
        self._pos = 0  # the input offset of the next byte handed out
        self._keep = True
        file = _regular_file(fh)
        #: the input's file descriptor, when it is a regular file (else None)
        self.fd: int | None = file[0] if file is not None else None
        self._base = file[1] if file is not None else 0  # the file offset of the stream's first byte
        self._grid: int | None = None  # file: the offset of the first chunk after the ones read before any walk
        #: the frame structure of the bytes handed out by :meth:`read` (from :meth:`walk_from` on)
        self.walk: _FrameWalk | None = None

    def walk_from(self, at: int) -> None:
        """Follow the frame structure of what :meth:`read` hands out from offset ``at``, a frame boundary (a
        later one: the bytes before it were taken as whole frames, :meth:`take`)."""
        if self.walk is None:
            self.walk = _FrameWalk(at)
        elif at > self.walk.at:
            self.walk.reset(at)

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int) -> None:
        first = self._starts[0] if self._starts else self._end
        assert self.fd is not None or first <= pos <= self._end, "the tape no longer holds it"
        self._pos = pos

    def release(self, upto: int | None = None) -> None:
        """Drop the chunks that end by offset ``upto``; without it, by the current offset, now and from now on
        (a reader that goes on to the end)."""
        if upto is None:
            upto, self._keep = self._pos, False
        done = 0
        while done < len(self._chunks) and self._starts[done] + len(self._chunks[done]) <= upto:
            done += 1
        del self._starts[:done], self._chunks[:done]

    def _more(self, n: int) -> bool:
        chunk = self._fh.read(n) if self._end == 0 else self._read1(n)
        if not chunk:
            return False
        self._starts.append(self._end)
        self._chunks.append(chunk)
        self._end += len(chunk)
        return True

    def _reposition(self) -> None:
        """A regular file, the current offset beyond the chunks held: read on from the chunk holding it."""
        assert self.fd is not None and self._grid is not None and self._pos >= self._grid
        start = self._grid + (self._pos - self._grid) // _READ_SIZE * _READ_SIZE
        self._fh.seek(self._base + start)
        self._starts, self._chunks, self._end = [], [], start

    def read(self, n: int = _READ_SIZE) -> bytes:
        """Up to ``n`` bytes from the chunk at the current offset (the first read, the preamble's, blocks
        until it has ``n``, as a buffered file's ``read``)."""
        if self._pos > self._end:
            self._reposition()
        start = self._pos
        if self._pos == self._end and not self._keep:
            out = self._read1(n)  # nothing held: straight from the input
            self._pos = self._end = self._pos + len(out)
        else:
            while self._pos >= self._end:
                if not self._more(n):
                    return b""
            i = bisect.bisect_right(self._starts, self._pos) - 1
            chunk, at = self._chunks[i], self._pos - self._starts[i]
            out = chunk if at == 0 and n >= len(chunk) else chunk[at : at + n]
            self._pos += len(out)
            if not self._keep:
                self.release()
        if self.walk is not None:
            self.walk.feed(out, start)
        return out

    def _bytes(self, start: int, end: int) -> bytes | None:
        """The input's bytes from offset ``start`` to ``end``; None when it ends first."""
        if self.fd is not None:  # where they lie; the chunks read go on as they would have
            if self._grid is None:
                self._grid = self._end
            data = os.pread(self.fd, end - start, self._base + start)
            return data if len(data) == end - start else None
        while self._end < end:
            if not self._more(_READ_SIZE):
                return None
        i = bisect.bisect_right(self._starts, start) - 1
        parts = []
        while start < end:
            s, chunk = self._starts[i], self._chunks[i]
            parts.append(memoryview(chunk)[start - s : end - s])
            start = s + len(chunk)
            i += 1
        return b"".join(parts)

    def frame_size(self, most: int) -> int | None:
        """The size of the zstd frame at the current offset; None at the input's end, or where the bytes
        there are not a complete plain zstd frame of at most ``most`` bytes (no zstd magic, as in a skippable
        frame or trailing bytes; a dictionary; a reserved bit or block type; a frame cut short). A frame:
        magic, descriptor, header fields, blocks (3-byte headers: last block bit, type, size; an RLE block
        holds one byte), then a 4-byte checksum if the descriptor says so."""
        at = self._pos
        head = self._bytes(at, at + 5)
        if head is None or head[:4] != _ZSTD_MAGIC or head[4] & 0x0B:  # a reserved bit, a dictionary id
            return None
        fhd = head[4]
        single = fhd >> 5 & 1
        size = 5 + (1 - single) + (single, 2, 4, 8)[fhd >> 6]  # window descriptor, content size field
        while True:
            block = self._bytes(at + size, at + size + 3) if size + 3 <= most else None
            if block is None:
                return None
            header = int.from_bytes(block, "little")
            kind = header >> 1 & 3
            if kind == 3:
                return None
            size += 3 + (1 if kind == 1 else header >> 3)
            if header & 1:
                break
        size += 4 if fhd & 0x04 else 0
        if size > most or self._bytes(at + size - 1, at + size) is None:
            return None
        return size

    def take(self, size: int) -> bytes | int:
        """Hand out the ``size`` bytes at the current offset (a frame from :meth:`frame_size`): the bytes, or
        from a regular file their position in it, for ``os.pread(fd, size, position)``."""
        at, self._pos = self._pos, self._pos + size
        if self.fd is not None:
            return self._base + at
        data = self._bytes(at, at + size)
        assert data is not None, "take() follows frame_size()"
        return data
