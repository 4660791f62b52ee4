"""format/validate.py checks each record twice over: ``_fast_ok`` (all checks at once, few calls) and
``_check_each`` (one at a time, naming the first that fails). The fast one may only ever say yes to a
record the slow one accepts, and must say yes to what the steps write (or it buys nothing)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.format import Array
from bridgecli.format.validate import _Bad, _check_each, _fast_ok

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("fuzz_records", ROOT / "bench" / "fuzz" / "records.py")
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)


def _slow_ok(ex, stage) -> bool:
    try:
        _check_each(ex, stage)
    except _Bad:
        return False
    return True


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), name=st.sampled_from(sorted(fuzz.MUTATIONS)))
def test_fast_path_never_accepts_a_broken_record(seed, name):
    header, examples, stage = fuzz.broken_stream(seed, name)
    refused = 0
    for ex in examples:
        if not _slow_ok(ex, header.stage):
            refused += 1
            assert not _fast_ok(ex, header.stage), (name, ex)
    assert refused  # the mutation broke a record


def test_every_mutation_refused_by_both():
    for k, name in enumerate(sorted(fuzz.MUTATIONS)):
        header, examples, _ = fuzz.broken_stream(k, name)
        assert [_fast_ok(ex, header.stage) for ex in examples].count(False) >= 1, name


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), stage=st.sampled_from(["scores", "selection", "closure"]))
def test_fast_path_accepts_what_the_steps_write(seed, stage):
    for ex in fuzz.consistent_stream(random.Random(seed), stage):
        assert _fast_ok(ex, stage) and _slow_ok(ex, stage)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values_go_to_the_slow_checks(dtype, bad):
    ex = fuzz.consistent_stream(random.Random(1), "scores")[0]
    n_r = ex.tokens.kinds.count(2)
    for k in range(n_r):
        values = np.linspace(-1, 1, n_r)
        values[k] = bad
        broken = msgspec.structs.replace(ex, scores=msgspec.structs.replace(ex.scores, a=Array.of(values, dtype)))
        assert not _fast_ok(broken, "scores") and not _slow_ok(broken, "scores")
    # the largest finite value of each dtype is finite
    big = np.full(n_r, np.finfo(dtype).max, dtype=dtype)
    ok = msgspec.structs.replace(ex, scores=msgspec.structs.replace(ex.scores, a=Array.of(-big, dtype)))
    assert _fast_ok(ok, "scores") and _slow_ok(ok, "scores")
