"""Records from their bytes without a stream reader: a payload decoded (as the reader decodes it), a
payload's kind or index alone, and the records of a zstd frame (for the process pools that read frames
:meth:`~bridgecli.format.reader.StreamReader.frames` hands out, and a shard merge)."""

from __future__ import annotations

import zlib
from typing import Union

import msgspec
import zstandard

from ..errors import FormatError
from .records import End, Record
from .spec import MAX_RECORD_BYTES, RECORD_PREFIX

_decoder = msgspec.msgpack.Decoder(Record)


class _HeaderTag(msgspec.Struct, tag="header"):
    pass


class _ExampleTag(msgspec.Struct, tag="example"):
    pass


#: which kind of record a payload holds, without decoding its fields (for :meth:`StreamReader.payloads`)
_kind_decoder = msgspec.msgpack.Decoder(Union[_HeaderTag, _ExampleTag, End])


class _Indexed(msgspec.Struct, tag="example"):
    index: int


#: an Example record's index alone (:func:`example_index`)
_index_decoder = msgspec.msgpack.Decoder(_Indexed)


def decode_example(payload: bytes | memoryview, name: str, position: int) -> Record:
    """Decode one record's payload as :meth:`StreamReader.__iter__` does (same error)."""
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise FormatError(f"cannot decode record ({exc})", file=name, record=position) from None


def _one_record(frame: bytes) -> bool:
    """Whether ``frame`` (the header's) holds one record and nothing more."""
    try:
        content = zstandard.ZstdDecompressor().decompressobj().decompress(frame)
    except zstandard.ZstdError:
        return False
    if len(content) < RECORD_PREFIX.size:
        return False
    return len(content) == RECORD_PREFIX.size + RECORD_PREFIX.unpack_from(content)[0]


def frame_payloads(frame: bytes) -> list[memoryview] | None:
    """The payloads of the Example records of ``frame`` (from :meth:`StreamReader.frames`), when it holds
    whole Example records only, each with a plausible length, its checksum right and its kind readable;
    None otherwise (reading it record by record then says what is wrong, and where)."""
    try:
        d = zstandard.ZstdDecompressor().decompressobj()
        content = d.decompress(frame)
    except zstandard.ZstdError:
        return None
    if not d.eof or d.unused_data or not content:
        return None
    out = []
    at, end = 0, len(content)
    view = memoryview(content)
    while at < end:
        if end - at < RECORD_PREFIX.size:
            return None
        length, crc = RECORD_PREFIX.unpack_from(content, at)
        at += RECORD_PREFIX.size
        if length > MAX_RECORD_BYTES or at + length > end:
            return None
        payload = view[at : at + length]
        at += length
        if zlib.crc32(payload) != crc:
            return None
        try:
            kind = _kind_decoder.decode(payload)
        except msgspec.DecodeError:
            return None
        if not isinstance(kind, _ExampleTag):
            return None
        out.append(payload)
    return out


def frame_records(frame: bytes) -> list[bytes]:
    """The records of a zstd frame as written (each with its length and CRC-32 before its payload), not
    checked: for a frame this process made with :func:`~bridgecli.format.writer.compress_frame`."""
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(frame)
    out, at = [], 0
    while at < len(raw):
        end = at + RECORD_PREFIX.size + RECORD_PREFIX.unpack_from(raw, at)[0]
        out.append(raw[at:end])
        at = end
    return out


def example_index(payload: bytes | memoryview, name: str) -> int:
    """The data index of an Example record's payload, decoding nothing else (a shard merge orders records
    by it)."""
    try:
        return _index_decoder.decode(payload).index
    except msgspec.DecodeError as exc:
        raise FormatError(f"cannot decode record ({exc})", file=name) from None
