"""Length bucketing (core/buckets.py) against brute force: every way of cutting the length-sorted
examples into feasible runs, on small cases."""

from __future__ import annotations

from itertools import combinations

from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.buckets import bucket


def cost(lengths, batches, batch_cost):
    return sum(max(lengths[i] for i in b) * len(b) + batch_cost for b in batches)


def feasible(lengths, b, max_tokens, max_rows):
    return (len(b) == 1 or max(lengths[i] for i in b) * len(b) <= max_tokens) and (
        max_rows is None or len(b) <= max_rows
    )


def brute_force(lengths, max_tokens, max_rows, batch_cost):
    """The least cost over every cut of the sorted order into feasible runs."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    n = len(order)
    best = None
    for k in range(n):
        for cuts in combinations(range(1, n), k):
            edges = [0, *cuts, n]
            batches = [order[a:b] for a, b in zip(edges, edges[1:])]
            if all(feasible(lengths, b, max_tokens, max_rows) for b in batches):
                c = cost(lengths, batches, batch_cost)
                best = c if best is None else min(best, c)
    return 0 if n == 0 else best


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 40), max_size=9),
    st.integers(1, 120),
    st.one_of(st.none(), st.integers(1, 5)),
    st.integers(0, 60),
)
def test_cuts_are_the_cheapest_feasible_ones(lengths, max_tokens, max_rows, batch_cost):
    batches = bucket(lengths, max_tokens, max_rows, batch_cost)
    flat = [i for b in batches for i in b]
    assert flat == sorted(range(len(lengths)), key=lambda i: (lengths[i], i))  # sorted runs, every index once
    assert all(b and feasible(lengths, b, max_tokens, max_rows) for b in batches)
    assert cost(lengths, batches, batch_cost) == brute_force(lengths, max_tokens, max_rows, batch_cost)
    assert bucket(lengths, max_tokens, max_rows, batch_cost) == batches  # deterministic


def test_a_batch_cost_trades_padding_for_fewer_batches():
    lengths = [10, 11, 12, 13, 30, 31, 32, 33]
    assert bucket(lengths, 1000, batch_cost=0) == [[0], [1], [2], [3], [4], [5], [6], [7]]  # no padding at all
    assert bucket(lengths, 1000, batch_cost=20) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert bucket(lengths, 1000, batch_cost=1000) == [list(range(8))]
    # the budget caps a batch (default cost 100 / 16 = 6): two even batches of the long ones, not a
    # full one and a last one of a single example, as filling each batch would give
    assert bucket(lengths, 100) == [[0, 1, 2, 3], [4, 5], [6, 7]]
