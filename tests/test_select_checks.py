"""``bridge select`` refuses what a selector returns when the stream format does not allow it (indices out of
order or range, NaN, infinities, values beyond float32's range), so it never writes a stream the next step
refuses; and the built-in selectors, on scores at the format's bound, never come near it."""

from __future__ import annotations

import random

import fuzz_cases as fuzz  # tests/fuzz_cases.py
import msgspec
import numpy as np
import pytest

from bridgecli.core.select import SelectionResult, Surrogate, select
from bridgecli.errors import FormatError
from bridgecli.format import Array
from bridgecli.format.spec import MAX_QUANTITY, MAX_RESULT
from bridgecli.contracts import as_selector
from bridgecli.steps.select import select_example


def _example():
    for seed in range(1000):
        ex = fuzz.scored_example(random.Random(seed), 0)
        if ex.tokens.kinds.count(1) >= 2 and ex.tokens.kinds.count(2) >= 3:
            return ex
    raise AssertionError("no seed gave one")


def _two_each(ex) -> tuple[float, float]:
    """rho_p, rho_r that budget two tokens on each side."""
    return 2 / ex.tokens.kinds.count(1) - 1e-9, 2 / ex.tokens.kinds.count(2) - 1e-9


def _returning(**changes):
    """A plugin's selector: the first b tokens of each side, zero scores, then ``changes``."""

    def fn(example, b_p, b_r, options):
        n = example.tokens.kinds.count(2)
        result = dict(prompt=np.arange(b_p), response=np.arange(b_r), response_scores=np.zeros(n), u_sur=[0.0])
        result.update({k: v(n) if callable(v) else v for k, v in changes.items()})
        return SelectionResult(**result)

    return as_selector(fn, "plugin")


@pytest.mark.parametrize("changes, field, text", [
    ({"response_scores": lambda n: np.full(n, np.nan)}, "selection.response_scores", "computed nan"),
    ({"response_scores": lambda n: np.r_[np.inf, np.zeros(n - 1)]}, "selection.response_scores", "computed inf"),
    ({"response_scores": lambda n: np.r_[np.zeros(n - 1), -1e39]}, "selection.response_scores", "computed -1e+39"),
    ({"u_sur": [0.0, float("nan")]}, "selection.u_sur", "computed nan"),
    ({"u_sur": [1e300]}, "selection.u_sur", "computed 1e+300"),
    ({"response_scores": lambda n: np.zeros(n + 1)}, None, "response scores of shape"),
    ({"response": np.array([1, 0])}, None, "response indices that are not ascending"),
    ({"response": np.array([0, 0])}, None, "response indices that are not ascending"),
    ({"prompt": np.array([-1, 0])}, None, "prompt indices that are not ascending"),
    ({"prompt": np.array([0.0, 1.0])}, None, "prompt indices that are not ascending"),
])
def test_select_refuses_what_the_format_does_not_allow(changes, field, text):
    ex = _example()
    with pytest.raises(FormatError) as info:
        select_example(ex, _returning(**changes), "plugin", *_two_each(ex), {})
    message = str(info.value)
    assert "selector 'plugin'" in message and text in message and "\n" not in message, message
    assert info.value.exit_code == 3 and info.value.record == ex.index
    if field is not None:
        assert f"field '{field}'" in message


def test_a_selector_within_the_rules_passes():
    ex = _example()
    out = select_example(ex, _returning(), "plugin", 1.0, 0.5, {})
    assert out.selection.response_keep == ex.tokens.response_positions()[: out.selection.b_r].tolist()


def test_the_surrogate_at_the_bound_stays_within_float32():
    """The bound's arithmetic on the worst case a small record allows: every a, c at +-2^48, every A and B
    entry at +-2^48 (A as float32): every response score and U_sur value stays finite, within MAX_RESULT, and
    within the closed form n (m + 1) 2^96 of docs/format.md."""
    rng = np.random.default_rng(0)
    for n, m in ((1, 1), (7, 3), (64, 200), (300, 40)):
        sign = lambda *shape: rng.choice((-1.0, 1.0), size=shape)  # noqa: E731
        a, c = MAX_QUANTITY * sign(n), MAX_QUANTITY * sign(n)
        A, B = MAX_QUANTITY * sign(n, m), MAX_QUANTITY * sign(n, m)
        for sur in (Surrogate.from_scores(a, c, A), Surrogate.from_interactions(a, B)):
            for schedule in ("bridge", "independent"):
                r = select(sur, (m + 1) // 2, (n + 1) // 2, schedule, rounds=3)
                scores = np.asarray(r.response_scores, dtype=np.float32)  # as the stream stores them
                assert np.isfinite(scores).all() and np.abs(scores).max() <= MAX_RESULT
                assert all(abs(u) <= n * (m + 1) * 2.0**96 <= MAX_RESULT for u in r.u_sur)


def test_the_bound_is_what_the_format_says():
    assert MAX_QUANTITY == 2.0**48 and MAX_RESULT == float(np.finfo(np.float32).max)
    # n (m + 1) <= 2^30 in a record of at most 2^30 bytes, products of two quantities <= 2^96
    assert 2.0**30 * MAX_QUANTITY**2 < MAX_RESULT


def test_close_refuses_response_scores_beyond_float32_from_python():
    """close_example on a record that never went through the reader (a Python caller): response scores beyond
    float32's range are refused, not projected."""
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example

    ex = select_example(_example(), get("selector", "bridge").obj, "bridge", 0.5, 0.5, {"rounds": 2})
    n = ex.tokens.kinds.count(2)
    for bad in (np.nan, np.inf, 1e300):
        scores = np.zeros(n)
        scores[-1] = bad
        broken = msgspec.structs.replace(ex, selection=msgspec.structs.replace(
            ex.selection, response_scores=Array.of(scores, "float64")))
        with pytest.raises(FormatError, match="field 'selection.response_scores'"):
            close_example(broken, get("segmenter", "sentence").obj, "sentence", 0.5)
