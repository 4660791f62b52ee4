"""core/sampling.py: inclusion probabilities and systematic sampling, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bridgecli.core.sampling import inclusion_probabilities, ipw_weights, systematic_sample

# ordinary tilts, and now and then a subnormal one beside them (where a water level once overflowed)
tilt = st.floats(0.0, 50.0, allow_nan=False, allow_infinity=False) | st.sampled_from([5e-324, 2.2e-311, 1e-300])
tilts = st.lists(tilt, min_size=1, max_size=12)


@given(tilts, st.integers(0, 14), st.floats(0.0, 1.0))
# subnormal tilts beside ordinary ones (found by hypothesis in CI): the water level once overflowed, split a
# tie between 1 and 0, and ran past the end
@example([1.0] * 8 + [2.225073858507e-311] * 2, 9, 0.0)
@example([0.0] + [1.0] * 8 + [2.225073858507e-311], 9, 0.0)
@settings(max_examples=400, deadline=None)
def test_probabilities_sum_to_the_budget_lie_in_unit_interval_and_rise_with_the_tilt(t, b, floor):
    t = np.array(t)
    pi = inclusion_probabilities(t, b, floor)
    n = len(t)
    assert pi.shape == (n,)
    assert ((pi >= 0) & (pi <= 1 + 1e-12)).all()
    assert pi.sum() == pytest.approx(min(max(b, 0), n), abs=1e-9)
    order = np.argsort(t, kind="stable")
    assert (np.diff(pi[order]) >= -1e-12).all()  # monotone in the tilt
    if 0 < b < n:
        # below the cap, pi is proportional to x = floor/n + (1-floor) t/sum(t) (or uniform)
        x = floor / n + (1 - floor) * t / t.sum() if t.sum() > 0 and floor < 1 else np.full(n, 1 / n)
        free = (pi < 1 - 1e-12) & (x > 0)
        if (x > 0).sum() >= b and free.any() and (x[free] >= np.finfo(np.float64).tiny).all():
            # pi / x is one constant on the free tokens (compared crosswise; subnormal x carry too few digits)
            i = np.flatnonzero(free)[np.argmax(x[free])]
            assert np.allclose(pi[free] * x[i], pi[i] * x[free], rtol=1e-9, atol=0)
            assert (x[pi >= 1 - 1e-12] * pi[i] >= (1 - 1e-9) * x[i]).all()  # the capped ones would exceed 1


def test_floor_one_is_uniform_and_full_tilt_is_proportional():
    assert np.allclose(inclusion_probabilities(np.array([0.0, 5.0, 1.0, 2.0]), 2, 1.0), 0.5)
    pi = inclusion_probabilities(np.array([1.0, 1.0, 2.0, 4.0]), 2, 0.0)
    assert np.allclose(pi, [0.25, 0.25, 0.5, 1.0])
    # too few positive tilts at floor 0: those at 1, the zeros share the rest
    assert np.allclose(inclusion_probabilities(np.array([0.0, 3.0, 0.0, 0.0]), 2, 0.0), [1 / 3, 1, 1 / 3, 1 / 3])


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        inclusion_probabilities(np.array([1.0, -1.0]), 1, 0.5)
    with pytest.raises(ValueError):
        inclusion_probabilities(np.array([1.0, np.nan]), 1, 0.5)
    with pytest.raises(ValueError):
        inclusion_probabilities(np.array([1.0, 2.0]), 1, 1.5)
    with pytest.raises(ValueError):
        systematic_sample(np.array([0.5, 0.5]), 1.0)


def _exact_inclusion(pi: np.ndarray) -> np.ndarray:
    """P(token j drawn) over u uniform in [0, 1), by integrating the draw over u exactly: the draw only
    changes where u crosses a fractional part of a cumulative sum, so it is constant between them."""
    cum = np.cumsum(pi)
    cum *= round(pi.sum()) / cum[-1]
    cuts = np.unique(np.concatenate([[0.0, 1.0], np.mod(cum, 1.0), np.mod(np.concatenate([[0.0], cum[:-1]]), 1.0)]))
    cuts = cuts[(cuts >= 0) & (cuts <= 1)]
    freq = np.zeros(len(pi))
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        if hi - lo < 1e-15:
            continue
        freq[systematic_sample(pi, (lo + hi) / 2)] += hi - lo
    return freq


@given(tilts, st.integers(1, 12), st.floats(0.0, 1.0), st.floats(0.0, 0.999999))
@settings(max_examples=300, deadline=None)
def test_systematic_sample_draws_exactly_b_with_exactly_pi(t, b, floor, u):
    t = np.array(t)
    b = min(b, len(t))
    pi = inclusion_probabilities(t, b, floor)
    chosen = systematic_sample(pi, u)
    assert len(chosen) == b and len(set(chosen.tolist())) == b
    assert (np.diff(chosen) > 0).all()
    assert np.allclose(_exact_inclusion(pi), pi, atol=1e-9)


def test_ipw_weights_make_the_expected_weighted_sum_that_of_a_uniform_draw():
    rng = np.random.default_rng(0)
    t = rng.random(9) ** 3
    g = rng.normal(size=9)  # one number per token: its "gradient"
    b = 4
    pi = inclusion_probabilities(t, b, 0.3)
    # the expectation over u, exactly (piecewise-constant draw): sum over drawn of w_j g_j
    cum = np.cumsum(pi)
    cuts = np.unique(np.concatenate([[0.0, 1.0], np.mod(cum, 1.0)]))
    expected = 0.0
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        chosen = systematic_sample(pi, (lo + hi) / 2)
        expected += (hi - lo) * float((ipw_weights(pi, chosen, b) * g[chosen]).sum())
    assert expected == pytest.approx(b / 9 * g.sum(), rel=1e-9)
