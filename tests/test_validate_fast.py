"""format/validate.py checks each record twice over: ``_fast_ok`` (validate_fast.py: all checks at once, few calls) and
``_check_each`` (one at a time, naming the first that fails). The fast one may only ever say yes to a
record the slow one accepts, and must say yes to what the steps write (or it buys nothing)."""

from __future__ import annotations

import random

import fuzz_cases as fuzz  # tests/fuzz_cases.py
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.format import Array
from bridgecli.format.spec import MAX_QUANTITY, MAX_RESULT
from bridgecli.format.validate import _Bad, _check_each, _fast_ok


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


def _with(ex, field: str, values: np.ndarray, dtype: str):
    """``ex`` with the float field ``field`` (``scores.a``, ``selection.u_sur``, ...) holding ``values`` (its
    shape's worth, cycled) in ``dtype``."""
    part, name = field.split(".")
    if part == "references":
        ref = ex.references["base"]
        old = getattr(ref, name)
        new = Array.of(np.resize(values, old.shape), dtype)
        return msgspec.structs.replace(ex, references={**ex.references, "base": msgspec.structs.replace(ref, **{
            name: new})})
    if field == "selection.u_sur":
        return msgspec.structs.replace(ex, selection=msgspec.structs.replace(
            ex.selection, u_sur=[float(v) for v in np.resize(values, 3)]))
    holder = getattr(ex, part)
    old = getattr(holder, name)
    shape = old.shape if old is not None else ex.scores.A.shape
    new = Array.of(np.resize(values, shape), dtype)
    return msgspec.structs.replace(ex, **{part: msgspec.structs.replace(holder, **{name: new})})


def _example_with_everything():
    """A selected example with a prompt, an interaction matrix and references (seeded: found once)."""
    for seed in range(1000):
        rng = random.Random(seed)
        ex = fuzz.scored_example(rng, 0, interactions=True, references=True)
        if ex.tokens.kinds.count(1) and ex.tokens.kinds.count(2) > 1:
            from bridgecli.registry import get
            from bridgecli.steps.select import select_example

            return select_example(ex, get("selector", "bridge").obj, "bridge", 0.5, 0.5, {"rounds": 2})
    raise AssertionError("no seed gave one")


QUANTITIES = ["scores.a", "scores.c", "scores.A", "scores.B", "scores.loss", "references.prompt_loss",
              "references.response_grad"]
RESULTS = ["selection.response_scores", "selection.u_sur"]


@pytest.mark.parametrize("field", QUANTITIES + RESULTS)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_every_float_field_is_bounded_by_both(field, dtype):
    """NaN, the infinities and finite values beyond the bound (+-2^48 for scores and references, float32's
    +-3.4e38 for a selection's numbers) are refused by the fast and the slow checks alike; values at the
    bound pass both."""
    ex = _example_with_everything()
    assert _fast_ok(ex, "selection") and _slow_ok(ex, "selection")
    if field == "selection.u_sur" and dtype != "float64":
        return  # a list of Python floats: one case
    bound = MAX_QUANTITY if field in QUANTITIES else MAX_RESULT
    top = min(bound, float(np.finfo(dtype).max))
    for bad in (np.nan, np.inf, -np.inf, *([np.nextafter(bound, np.inf), -1e300] if dtype == "float64" else []),
                *([np.nextafter(np.float32(bound), np.float32(np.inf))] if dtype == "float32" and bound < 1e38 else [])):
        values = np.array([0.5, bad, -0.25])
        broken = _with(ex, field, values, dtype)
        assert not _fast_ok(broken, "selection") and not _slow_ok(broken, "selection"), (field, dtype, bad)
    at_bound = _with(ex, field, np.array([top, -top, 0.0]), dtype)
    assert _fast_ok(at_bound, "selection") and _slow_ok(at_bound, "selection"), (field, dtype)


def test_the_slow_checks_name_the_bad_value():
    ex = _example_with_everything()
    for field, value, text in (("scores.a", np.nan, "holds NaN at index 1"),
                               ("scores.B", -np.inf, "holds an infinite value at index 1"),
                               ("references.response_grad", 1e20, "holds 1e+20 at index 1 (values must lie within "
                                                                  "+-2^48"),
                               ("selection.response_scores", 1e39, "holds 1e+39 at index 1 (values must lie within "
                                                                   "+-3.4e38")):
        with pytest.raises(_Bad) as info:
            _check_each(_with(ex, field, np.array([0.0, value, 0.0]), "float64"), "selection")
        name = field.replace("references.", "references.base.")
        assert info.value.field == name and text in info.value.message, (info.value.field, info.value.message)
