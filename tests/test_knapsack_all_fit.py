"""knapsack's shortcut when every item fits: the same answer as the DP table, tiny values included."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.closure import knapsack


def table_knapsack(weights, values, capacity):
    """The DP table exactly as knapsack runs it when the items do not all fit."""
    weights = np.asarray(weights, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if capacity <= 0:
        return np.zeros(0, dtype=np.int64)
    items = [i for i in range(len(weights)) if values[i] > 0 and 0 < weights[i] <= capacity]
    dp = np.zeros(capacity + 1)
    take = np.zeros((len(items), capacity + 1), dtype=bool)
    for row, i in enumerate(items):
        w, v = int(weights[i]), values[i]
        cand = dp[:-w] + v
        better = cand > dp[w:]
        take[row, w:] = better
        dp[w:] = np.where(better, cand, dp[w:])
    chosen, c = [], capacity
    for row in range(len(items) - 1, -1, -1):
        if take[row, c]:
            chosen.append(items[row])
            c -= int(weights[items[row]])
    return np.array(sorted(chosen), dtype=np.int64)


VALUES = st.one_of(st.floats(-2, 2), st.sampled_from([0.0, 1e-300, 1e-17, 5e-17, 1.0, 1e16, -1e-17]))


@settings(max_examples=300, deadline=None)
@given(items=st.lists(st.tuples(st.integers(0, 6), VALUES), max_size=10), slack=st.integers(-3, 5))
def test_all_fit_shortcut_equals_the_table(items, slack):
    weights = [w for w, _ in items]
    values = [v for _, v in items]
    capacity = max(0, sum(w for w, v in items if v > 0) + slack)  # around the point where all fit
    got = knapsack(np.array(weights, dtype=np.int64), np.array(values), capacity)
    want = table_knapsack(weights, values, capacity)
    assert got.tolist() == want.tolist()
