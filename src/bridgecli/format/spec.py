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

#: The largest magnitude of a model quantity in a stream: every value of ``Scores.a``, ``c``, ``A``, ``B``,
#: ``loss`` and of every ``Reference`` array lies in [-2^48, 2^48] (NaN and infinities are refused). Why 2^48:
#: ``select`` multiplies two such values (A[j, i] a_j, a_j c_j) and adds up at most 2^30 of the products in
#: one U_sur (a record holds at most 2^30 bytes, so n (m + 1) <= 2^30), so everything it computes stays
#: within 2^30 x 2^96 = 2^126, inside float32's range, the type ``response_scores`` are stored in.
MAX_QUANTITY = 2.0**48
#: The largest magnitude of ``Selection.response_scores`` and ``u_sur``: float32's largest finite value.
MAX_RESULT = 3.4028234663852886e38
#: The model quantities that are never negative (losses, attention masses, gradient norms), whose values lie
#: in [0, 2^48]: of ``Scores``, and every ``Reference`` array. A step may rely on it (``select --method
#: importance --option by=loss`` tilts its sampling by the loss).
NON_NEGATIVE_SCORES = ("c", "A", "loss")

#: Per-token kinds in ``Tokens.kinds`` (one byte each).
TEMPLATE = 0  # template / special token: always kept, never budgeted
PROMPT = 1  # eligible prompt token
RESPONSE = 2  # eligible response token
EOS = 3  # the token that ends the response: always supervised, never budgeted

#: Stages a stream can be at; each step enriches the records of the previous one.
STAGES = ("tokens", "scores", "selection", "closure")
