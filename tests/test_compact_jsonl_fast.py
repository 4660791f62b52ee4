"""compact's JSONL lines (steps/compact.py ``_jsonl``) are exactly ``json.dumps(record) + "\\n"``."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.steps.compact import _jsonl

keys = st.sampled_from(["id", "input_ids", "labels", "tokenizer_fingerprint", "mask", "attention_mask", "tokens",
                        "loss_mask", "é\\\"", "a,b"])
values = st.one_of(
    st.lists(st.integers(-100, 2**31)), st.lists(st.integers(-(2**70), 2**70), max_size=4), st.lists(st.booleans()),
    st.text(max_size=8), st.integers(), st.none(), st.lists(st.one_of(st.integers(), st.booleans(), st.text(max_size=3),
                                                                       st.floats(allow_nan=False)), max_size=4),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=4),
)


@settings(max_examples=500, deadline=None)
@given(record=st.dictionaries(keys, values, max_size=5))
def test_jsonl_is_json_dumps(record):
    assert _jsonl(record) == json.dumps(record) + "\n"


def test_a_training_row():
    row = {"id": "ex-1", "input_ids": [1, 20, 300], "labels": [-100, 20, 300], "tokenizer_fingerprint": "sha256:ab"}
    assert _jsonl(row) == json.dumps(row) + "\n"
    assert _jsonl({"tokens": [1, 2], "mask": [True, False]}) == '{"tokens": [1, 2], "mask": [true, false]}\n'


@settings(max_examples=300, deadline=None)
@given(
    record=st.dictionaries(
        keys,
        st.one_of(st.lists(st.integers(-100, 2**31 - 1)), st.lists(st.booleans()), st.text(max_size=8)),
        max_size=5,
    )
)
def test_a_row_without_type_checks_is_json_dumps(record):
    """``row=True`` (compact's own rows: lists of ints or of bools) skips the element types, same line."""
    assert _jsonl(record, row=True) == json.dumps(record) + "\n"
