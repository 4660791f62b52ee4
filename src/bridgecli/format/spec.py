"""Constants of the bridge stream format, version 1. See docs/format.md for the full specification.

Layout of a file::

    preamble   8 bytes magic  b"\\x89BRIDGE\\n"
               2 bytes major  (uint16, little endian)
               2 bytes minor  (uint16, little endian)
    body       one or more zstd frames (each with a content checksum); their concatenated
               content is a sequence of records, each framed as
                   4 bytes  payload length (uint32 LE)
                   4 bytes  CRC-32 of the payload (uint32 LE)
                   payload  one msgpack-encoded record (see records.py)
    records    exactly one Header first, any number of Example records, exactly one End last.

The magic starts with a byte outside ASCII/UTF-8 so text tools never mistake the file for text
and a file mangled by newline translation is detected (the trailing ``\\n``).
"""

from __future__ import annotations

import struct

MAGIC = b"\x89BRIDGE\n"
MAJOR = 1
MINOR = 3
PREAMBLE = struct.Struct("<8sHH")
RECORD_PREFIX = struct.Struct("<II")
#: A single record larger than this is treated as corruption (a 4K x 4K float16 matrix is 32 MiB).
MAX_RECORD_BYTES = 1 << 30
#: Records per zstd frame when writing; each flush ends a frame so pipes see data promptly.
RECORDS_PER_FRAME = 64
ZSTD_LEVEL = 6

#: Per-token kinds in ``Tokens.kinds`` (one byte each).
TEMPLATE = 0  # template / special token: always kept, never budgeted
PROMPT = 1  # eligible prompt token
RESPONSE = 2  # eligible response token
EOS = 3  # the token that ends the response: always supervised, never budgeted

#: Stages a stream can be at; each step enriches the records of the previous one.
STAGES = ("tokens", "scores", "selection", "closure")
