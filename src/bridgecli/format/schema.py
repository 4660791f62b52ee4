"""JSON Schema of the stream records, generated from the msgspec types.

The checked-in copy lives in ``schemas/bridge-stream-v1.schema.json``; a test fails when the two
drift. Regenerate with ``python -m bridgecli.format.schema > schemas/bridge-stream-v1.schema.json``.
"""

from __future__ import annotations

import inspect
import json

import msgspec

from .records import REFERENCE_ARRAYS, Record
from .spec import MAJOR, MAX_QUANTITY, MAX_RESULT, MINOR, NON_NEGATIVE_SCORES

#: The rules on numbers that the reader enforces (format/validate.py), as JSON Schema keywords: on the
#: JSON numbers of a record (``$defs`` name, property -> keywords; ``items`` for a list's values).
NUMBERS: dict[tuple[str, str], dict] = {
    ("Example", "index"): {"minimum": 0},
    ("End", "count"): {"minimum": 0},
    ("Array", "shape"): {"items": {"minimum": 0}},
    ("Tokens", "input_ids"): {"items": {"minimum": 0, "maximum": 2**31 - 1}},
    ("Tokens", "offsets"): {"items": {"minimum": 0}},
    ("Selection", "b_p"): {"minimum": 0},
    ("Selection", "b_r"): {"minimum": 0},
    **{
        ("Selection", f): {"items": {"minimum": 0}}
        for f in ("prompt_keep", "response_keep", "protected_prompt", "protected_response")
    },
    ("Selection", "u_sur"): {"items": {"minimum": -MAX_RESULT, "maximum": MAX_RESULT}},
    ("Selection", "achieved_rho_p"): {"minimum": 0, "maximum": 1},
    ("Selection", "achieved_rho_r"): {"minimum": 0, "maximum": 1},
    ("Closure", "alpha"): {"minimum": 0, "maximum": 1},
    **{
        ("Closure", f): {"items": {"minimum": 0}} for f in ("units", "chosen", "supervise", "protected_units", "filled")
    },
}

_QUANTITY = "every value finite and within +-2^48"
_NON_NEGATIVE = "every value finite and within [0, 2^48]: never negative"
#: The rules on the values an Array's bytes hold (JSON Schema cannot see into them): the property's description.
ARRAYS: dict[tuple[str, str], str] = {
    **{("Scores", f): _NON_NEGATIVE if f in NON_NEGATIVE_SCORES else _QUANTITY for f in ("a", "c", "A", "loss", "B")},
    **{("Reference", f): _NON_NEGATIVE for f in REFERENCE_ARRAYS},
    ("Selection", "response_scores"): "every value finite and within float32's range",
    ("Selection", "response_weights"): "every value finite, > 0 and within float32's range",
}


def _constrain(schema: dict) -> dict:
    """``schema`` with :data:`NUMBERS` and :data:`ARRAYS` added where they apply."""
    defs = schema["$defs"]
    for (name, field), keywords in NUMBERS.items():
        prop = defs[name]["properties"][field]
        for target in prop.get("anyOf", [prop]):  # an optional number: its number branch
            if target.get("type") in ("integer", "number"):
                target.update(keywords)
            elif target.get("type") == "array":
                target["items"] = {**target["items"], **keywords["items"]}
    for (name, field), rule in ARRAYS.items():
        defs[name]["properties"][field]["description"] = f"Array of a float dtype; {rule} (docs/format.md, Numbers)."
    assert MAX_QUANTITY == 2.0**48  # the words above
    return schema


def _clean_descriptions(node: object) -> None:
    """Every ``description`` under ``node`` as :func:`inspect.cleandoc` gives it (in place): msgspec takes the
    descriptions from the records' docstrings, cleaned since 0.23 and as written before, so the rendering
    would depend on its version."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "description" and isinstance(value, str):
                node[key] = inspect.cleandoc(value)
            else:
                _clean_descriptions(value)
    elif isinstance(node, list):
        for value in node:
            _clean_descriptions(value)


def stream_schema() -> dict:
    schema = msgspec.json.schema(Record)
    _clean_descriptions(schema)
    schema = _constrain(schema)
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
