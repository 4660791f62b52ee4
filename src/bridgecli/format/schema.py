"""JSON Schema of the stream records, generated from the msgspec types.

The checked-in copy lives in ``schemas/bridge-stream-v1.schema.json``; a test fails when the two
drift. Regenerate with ``python -m bridgecli.format.schema > schemas/bridge-stream-v1.schema.json``.
"""

from __future__ import annotations

import json

import msgspec

from .records import Record
from .spec import MAJOR, MINOR


def stream_schema() -> dict:
    schema = msgspec.json.schema(Record)
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://github.com/bridgecli/bridgecli/schemas/bridge-stream-v{MAJOR}.schema.json",
        "title": f"bridge stream record, format {MAJOR}.{MINOR}",
        "description": (
            "One record of a bridge stream (msgpack-encoded inside the binary framing of docs/format.md). "
            "A stream is one header, then example records, then one end record. Binary fields are "
            "base64 strings in this JSON rendering."
        ),
        **schema,
    }
    return schema


def render() -> str:
    return json.dumps(stream_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(render(), end="")
