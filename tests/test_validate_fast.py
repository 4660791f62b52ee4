"""format/validate.py checks each record twice over: ``_fast_ok`` (validate_fast.py: all checks at once, few calls) and
``_check_each`` (one at a time, naming the first that fails). The fast one may only ever say yes to a
record the slow one accepts, and must say yes to what the steps write (or it buys nothing)."""

from __future__ import annotations

import math
import random

import fuzz_cases as fuzz  # tests/fuzz_cases.py
import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.format import Array
from bridgecli.format.spec import MAX_QUANTITY, MAX_RESULT
from bridgecli.format import validate_fast
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
#: losses, attention masses, gradient norms: within [0, 2^48] (issue 40)
NON_NEGATIVE = ["scores.c", "scores.A", "scores.loss", "references.prompt_loss", "references.response_grad"]


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
    at_bound = _with(ex, field, np.array([top, 0.0, 0.0] if field in NON_NEGATIVE else [top, -top, 0.0]), dtype)
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


# -- first_bad_scores: what `bridge score` checks a batch with before writing it ---------------------------

_SPECIAL = [np.nan, np.inf, -np.inf, 2.0**48, -(2.0**48), np.nextafter(2.0**48, np.inf), 1e300, 0.0, -1.5, 7.0]


@st.composite
def _score_batches(draw):
    """A batch of Scores of random sizes and float dtypes, most values ordinary, a few special ones
    (NaN, the infinities, values at and just beyond +-2^48) here and there."""
    from bridgecli.format import Scores

    def array(shape):
        dtype = draw(st.sampled_from(["float16", "float32", "float64"]))
        size = int(np.prod(shape))
        values = np.asarray(draw(st.lists(st.floats(-100, 100), min_size=size, max_size=size)), dtype=np.float64)
        for at in draw(st.lists(st.integers(0, max(size - 1, 0)), max_size=2 if size else 0)):
            values[at] = draw(st.sampled_from(_SPECIAL))
        with np.errstate(over="ignore"):  # beyond float16's range: an infinity, refused as such
            return Array.of(values.reshape(shape), dtype)

    batch = []
    for _ in range(draw(st.integers(1, 4))):
        n, m = draw(st.integers(1, 5)), draw(st.integers(0, 4))
        batch.append(Scores(scorer="t", a=array([n]), c=array([n]), A=array([n, m]),
                            loss=array([n]) if draw(st.booleans()) else None,
                            B=array([n, m]) if draw(st.booleans()) else None))
    return batch


def _first_bad_brute(batch):
    """The first (example, field) whose values, read one by one as Python floats, are not all finite and
    within +-2^48, and >= 0 for c, A and loss."""
    for k, s in enumerate(batch):
        for name in ("a", "c", "A", "loss", "B"):
            arr = getattr(s, name)
            low = 0.0 if name in ("c", "A", "loss") else -MAX_QUANTITY
            if arr is not None and not all(math.isfinite(v) and low <= v <= MAX_QUANTITY
                                           for v in arr.numpy("float64").reshape(-1).tolist()):
                return k, f"scores.{name}"
    return None


@settings(max_examples=300, deadline=None)
@given(_score_batches(), st.sampled_from([0, 8, 1 << 16]))
def test_first_bad_scores_finds_what_brute_force_finds(batch, join_below):
    """Small arrays are joined per dtype before the scan, large ones scanned alone: both ways (``join_below``
    bytes the size up to which an array is joined) find what reading every value finds."""
    from bridgecli.format import validate

    saved, validate_fast._JOIN_BELOW = validate_fast._JOIN_BELOW, join_below
    try:
        got = validate.first_bad_scores(batch)
    finally:
        validate_fast._JOIN_BELOW = saved
    assert (got[:2] if got else None) == _first_bad_brute(batch)


def test_first_bad_scores_uses_the_readers_words():
    """The same message the reader gives for the same value (format/validate.py's _array), and a dtype or a
    byte count the format refuses is refused too."""
    from bridgecli.format import Scores
    from bridgecli.format.validate import first_bad_scores

    ok, signed = Array.of([0.5, 1.0]), Array.of([0.5, -1.0])
    assert first_bad_scores([Scores(scorer="t", a=signed, c=ok, A=Array.of([[1.0], [0.0]], "float16"))]) is None
    negative = Scores(scorer="t", a=signed, c=ok, A=Array.of([[1.0], [0.0]], "float16"), loss=Array.of([1.0, -0.001]))
    assert first_bad_scores([negative]) == (
        0, "scores.loss", "holds -0.001 at index 1 (a loss, an attention mass or a gradient norm: values must be >= 0)")
    nan = Scores(scorer="t", a=ok, c=ok, A=Array.of([[1.0], [0.0]], "float16"), loss=Array.of([1.0, np.nan]))
    assert first_bad_scores([nan, nan]) == (
        0, "scores.loss", "holds NaN at index 1 (values must lie within +-2^48, the largest magnitude the stream "
        "format allows in scores and references)")
    ints = msgspec.structs.replace(nan, loss=None, c=Array.of([1, 2], "int32"))
    assert first_bad_scores([Scores(scorer="t", a=ok, c=ok, A=ok), ints])[:2] == (1, "scores.c")
    short = msgspec.structs.replace(ints, c=Array(dtype="float32", shape=[2], data=b"\0" * 4))
    assert "4 bytes of data" in first_bad_scores([short])[2]
    missing = Scores(scorer="t", a=ok, c=None, A=ok, loss=ok, B=ok)  # as many arrays as a, c and A
    assert first_bad_scores([missing]) == (0, "scores.c", "not an array")


@pytest.mark.parametrize("field", NON_NEGATIVE + ["scores.a", "scores.B"])
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_quantities_that_are_never_negative(field, dtype):
    """A negative loss, attention mass or gradient norm (even the smallest, -0.001 in the issue) is refused by
    both checks; -0.0 passes (the fast check leaves it to the slow one); a's and B's signs are free."""
    ex = _example_with_everything()
    tiny = float(np.finfo(dtype).smallest_subnormal)
    for bad in (-0.001, -tiny, -min(MAX_QUANTITY, float(np.finfo(dtype).max))):
        broken = _with(ex, field, np.array([0.5, bad, 0.25]), dtype)
        if field in NON_NEGATIVE:
            assert not _fast_ok(broken, "selection") and not _slow_ok(broken, "selection"), (field, dtype, bad)
        else:
            assert _slow_ok(broken, "selection") and _fast_ok(broken, "selection"), (field, dtype, bad)
    zero = _with(ex, field, np.array([0.5, -0.0, 0.25]), dtype)
    assert _slow_ok(zero, "selection")
