"""Structure-aware projection: spans -> units, q(u), exact knapsack, project; against brute force."""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.closure import Projection, knapsack, project, unit_values, units_from_spans
from bridgecli.core.topk import top_b

FAST = settings(max_examples=200, deadline=None)
TOL = 1e-9


def as_list(x) -> list[int]:
    return [int(v) for v in np.asarray(x).tolist()]


def all_subsets(k: int):
    for r in range(k + 1):
        yield from combinations(range(k), r)


def brute_knapsack(weights, values, capacity) -> float:
    best = 0.0
    for sub in all_subsets(len(weights)):
        if sum(weights[i] for i in sub) <= capacity:
            best = max(best, sum(values[i] for i in sub))
    return best


# --- knapsack ----------------------------------------------------------------------------------

value_st = st.one_of(
    st.integers(-5, 5).map(float),
    st.sampled_from([0.0, -0.0, 1e-12, -1e-12, 0.5, 2.5]),
    st.floats(-5, 5, allow_nan=False, allow_infinity=False),
)


@st.composite
def knapsack_instances(draw, max_items: int = 8):
    k = draw(st.integers(0, max_items))
    weights = [draw(st.integers(1, 5)) for _ in range(k)]
    values = [draw(value_st) for _ in range(k)]
    capacity = draw(st.integers(0, 12))
    return weights, values, capacity


@FAST
@given(inst=knapsack_instances())
def test_knapsack_equals_brute_force(inst):
    weights, values, capacity = inst
    got = knapsack(np.array(weights, dtype=np.int64), np.array(values, dtype=np.float64), capacity)
    chosen = as_list(got)
    assert got.dtype == np.int64
    assert chosen == sorted(set(chosen))
    assert all(0 <= i < len(weights) for i in chosen)
    assert sum(weights[i] for i in chosen) <= capacity  # feasible
    assert all(values[i] > 0 for i in chosen)  # never an item of value <= 0
    assert sum(values[i] for i in chosen) == pytest.approx(brute_knapsack(weights, values, capacity), abs=TOL)
    again = knapsack(np.array(weights), np.array(values), capacity)  # deterministic
    assert as_list(again) == chosen


@FAST
@given(inst=knapsack_instances(max_items=10))
def test_knapsack_exact_integer_values(inst):
    """Integer values: the optimum is exact, with no tolerance."""
    weights, values, capacity = inst
    values = [float(round(v)) for v in values]
    chosen = as_list(knapsack(np.array(weights), np.array(values), capacity))
    assert sum(values[i] for i in chosen) == brute_knapsack(weights, values, capacity)
    assert sum(weights[i] for i in chosen) <= capacity


def test_knapsack_edges():
    assert as_list(knapsack(np.zeros(0, dtype=np.int64), np.zeros(0), 5)) == []
    assert as_list(knapsack([1, 2], [3.0, 4.0], 0)) == []
    assert as_list(knapsack([1, 2], [-3.0, 0.0], 5)) == []  # nothing of positive value
    assert as_list(knapsack([6, 1], [100.0, 1.0], 5)) == [1]  # too heavy to fit
    assert as_list(knapsack([3, 2, 2], [5.0, 3.0, 3.0], 4)) == [1, 2]  # greedy by value would take 0
    assert as_list(knapsack([1, 1, 1], [1.0, 1.0, 1.0], 2)) == [0, 1]  # equal options: earlier items
    assert as_list(knapsack([2, 1, 1], [2.0, 1.0, 1.0], 2)) == [0]  # equal value: the DP keeps the earlier item
    assert as_list(knapsack([1, 1], [2.0, 3.0], 5)) == [0, 1]  # everything fits


# --- unit_values / project ---------------------------------------------------------------------


@st.composite
def unit_partitions(draw, max_n: int = 12):
    n = draw(st.integers(0, max_n))
    cuts = sorted(draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=max(n - 1, 0)))) if n > 1 else []
    bounds = [0, *cuts, n] if n else [0]
    units = [np.arange(s, e, dtype=np.int64) for s, e in zip(bounds, bounds[1:])]
    scores = [draw(st.one_of(st.integers(-3, 3).map(float), st.floats(-3, 3, allow_nan=False))) for _ in range(n)]
    return units, np.array(scores, dtype=np.float64)


alpha_st = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1))


@FAST
@given(part=unit_partitions(), alpha=alpha_st, data=st.data())
def test_project_against_brute_force(part, alpha, data):
    units, scores = part
    n = len(scores)
    b_r = data.draw(st.integers(0, n + 2))
    proj = project(units, scores, b_r, alpha)
    assert isinstance(proj, Projection)
    q = [len(u) ** (-alpha) * sum(scores[j] for j in u) for u in units]
    np.testing.assert_allclose(unit_values(units, scores, alpha), q, rtol=1e-12, atol=1e-12)
    chosen = as_list(proj.chosen)
    assert chosen == sorted(set(chosen))
    assert all(q[k] > 0 for k in chosen)
    sup = as_list(proj.supervise)
    assert len(sup) <= b_r  # never exceeds the response budget
    assert sup == sorted(j for k in chosen for j in units[k].tolist())  # union of the chosen units
    assert proj.supervise.dtype.kind == "i"
    # optimal over all unit subsets within budget
    sizes = [len(u) for u in units]
    assert sum(q[k] for k in chosen) == pytest.approx(brute_knapsack(sizes, q, b_r), abs=TOL)
    # the same as the knapsack on (|u|, q(u)), and deterministic
    assert chosen == as_list(knapsack(np.array(sizes, dtype=np.int64), unit_values(units, scores, alpha), b_r))
    assert as_list(project(units, scores, b_r, alpha).supervise) == sup


def test_unit_values_alpha():
    units = [np.array([0]), np.array([1, 2]), np.array([3, 4, 5, 6])]
    scores = np.array([3.0, 1.0, 3.0, 2.0, 2.0, 2.0, 2.0])
    np.testing.assert_allclose(unit_values(units, scores, 0.0), [3.0, 4.0, 8.0])  # plain sums
    np.testing.assert_allclose(unit_values(units, scores, 0.5), [3.0, 4.0 / math.sqrt(2), 4.0])  # sum / sqrt|u|
    np.testing.assert_allclose(unit_values(units, scores, 1.0), [3.0, 2.0, 2.0])  # means


def test_alpha_changes_the_choice():
    """One long unit vs two short ones, budget for either: sums favour the long unit, means the short."""
    units = [np.array([0, 1, 2, 3]), np.array([4, 5]), np.array([6, 7])]
    scores = np.array([1.0, 1.0, 1.0, 1.0, 1.5, 0.0, 1.5, 0.0])
    # alpha=0: q = [4, 1.5, 1.5] -> {0}; alpha=1: q = [1, 0.75, 0.75] -> {1, 2} (1.5 > 1)
    # alpha=0.5: q = [2, 1.06, 1.06] -> {1, 2} (2.12 > 2)
    assert as_list(project(units, scores, 4, 0.0).chosen) == [0]
    assert as_list(project(units, scores, 4, 0.5).chosen) == [1, 2]
    assert as_list(project(units, scores, 4, 1.0).chosen) == [1, 2]
    assert as_list(project(units, scores, 4, 1.0).supervise) == [4, 5, 6, 7]


@pytest.mark.parametrize("alpha", [-0.01, 1.01, 2.0, float("nan"), float("inf")])
def test_alpha_out_of_range_raises(alpha):
    with pytest.raises(ValueError):
        project([np.array([0])], np.array([1.0]), 1, alpha)


def test_project_edges():
    empty = project([], np.zeros(0), 5, 0.0)
    assert as_list(empty.chosen) == [] and as_list(empty.supervise) == []
    units = [np.array([0, 1]), np.array([2])]
    p = project(units, np.array([1.0, 1.0, 5.0]), 0, 0.0)
    assert as_list(p.supervise) == []
    p = project(units, np.array([-1.0, -1.0, 0.0]), 3, 0.0)  # nothing positive: supervise nothing
    assert as_list(p.supervise) == []
    p = project(units, np.array([3.0, -1.0, 0.5]), 3, 0.0)  # a unit with a negative token can win
    assert as_list(p.supervise) == [0, 1, 2]
    p = project(units, np.array([3.0, -1.0, 0.5]), 1, 0.0)  # the pair does not fit
    assert as_list(p.supervise) == [2]


# --- units_from_spans --------------------------------------------------------------------------


@st.composite
def tokenisations(draw, max_tokens: int = 12, max_spans: int = 5):
    """Tokens: in order, non-overlapping, with gaps (uncovered text) and zero-width tokens.
    Spans: non-overlapping character ranges (possibly empty), given in any order."""
    k = draw(st.integers(0, max_tokens))
    toks, pos = [], 0
    for _ in range(k):
        pos += draw(st.sampled_from([0, 0, 0, 1, 2]))  # gap
        w = draw(st.sampled_from([0, 1, 1, 2, 3, 4]))  # 0: zero-width token
        toks.append((pos, pos + w))
        pos += w
    length = pos + 2
    s = draw(st.integers(0, max_spans))
    points = sorted(draw(st.lists(st.integers(0, length), min_size=2 * s, max_size=2 * s)))
    spans = [(points[2 * i], points[2 * i + 1]) for i in range(s)]
    spans = draw(st.permutations(spans))
    return np.array(toks, dtype=np.int64).reshape(-1, 2), list(spans)


def brute_units(toks, spans) -> list[list[int]]:
    spans = sorted((s, e) for s, e in spans if e > s)
    owner = []
    for ts, te in toks.tolist():
        best, best_ov = -1, 0
        for k, (s, e) in enumerate(spans):  # strictly larger overlap wins: ties stay with the earlier span
            ov = min(te, e) - max(ts, s)
            if ov > best_ov:
                best, best_ov = k, ov
        owner.append(best)
    units, t = [], 0
    while t < len(owner):
        u = t + 1
        if owner[t] >= 0:
            while u < len(owner) and owner[u] == owner[t]:
                u += 1
        units.append(list(range(t, u)))
        t = u
    return units


def check_partition(units, n):
    flat = [j for u in units for j in as_list(u)]
    assert flat == list(range(n))  # every token exactly once, units in token order
    for u in units:
        lst = as_list(u)
        assert lst and lst == list(range(lst[0], lst[-1] + 1))  # non-empty, contiguous, ascending
        assert np.asarray(u).dtype == np.int64


@FAST
@given(tk=tokenisations())
def test_units_from_spans_against_brute_force(tk):
    toks, spans = tk
    units = units_from_spans(toks, spans)
    check_partition(units, len(toks))
    assert [as_list(u) for u in units] == brute_units(toks, spans)
    real = [(s, e) for s, e in spans if e > s]
    for u in units:
        lst = as_list(u)
        for j in lst:
            ts, te = toks[j]
            touches = any(min(te, e) - max(ts, s) > 0 for s, e in real)
            if te <= ts or not touches:  # zero-width or uncovered: a unit of its own
                assert lst == [j]
        if len(lst) > 1:  # a multi-token unit: all its tokens overlap one common span
            assert any(all(min(toks[j][1], e) - max(toks[j][0], s) > 0 for j in lst) for s, e in real)
    # the order of the spans does not matter
    assert [as_list(u) for u in units_from_spans(toks, sorted(spans))] == [as_list(u) for u in units]


def test_units_from_spans_straddling_tokens():
    spans = [(0, 5), (5, 10)]
    # token 1 = [3, 7): overlap 2 with each span -> the earlier span
    assert [as_list(u) for u in units_from_spans(np.array([[0, 3], [3, 7], [7, 10]]), spans)] == [[0, 1], [2]]
    # token 1 = [3, 8): overlap 2 vs 3 -> the later span
    assert [as_list(u) for u in units_from_spans(np.array([[0, 3], [3, 8], [8, 10]]), spans)] == [[0], [1, 2]]
    # the same with the spans listed in reverse: "earlier" means earlier in the text
    assert [as_list(u) for u in units_from_spans(np.array([[0, 3], [3, 7], [7, 10]]), spans[::-1])] == [[0, 1], [2]]


def test_units_from_spans_uncovered_and_zero_width():
    toks = np.array([[0, 2], [2, 3], [3, 3], [3, 6], [6, 8], [8, 9]])
    # span covers [2, 8): token 0 uncovered, token 2 zero-width, token 5 uncovered
    units = [as_list(u) for u in units_from_spans(toks, [(2, 8)])]
    assert units == [[0], [1], [2], [3, 4], [5]]
    # no spans at all: every token is its own unit; empty spans are ignored
    assert [as_list(u) for u in units_from_spans(toks, [])] == [[j] for j in range(6)]
    assert [as_list(u) for u in units_from_spans(toks, [(4, 4)])] == [[j] for j in range(6)]
    # no tokens
    assert units_from_spans(np.zeros((0, 2), dtype=np.int64), [(0, 3)]) == []


# --- the paper's example (Section "Structure-Aware Projection") --------------------------------


def test_paper_example_closure_keeps_the_equation():
    """Operands "2", "3", "6" score high, the structural "*" and "=" low: token Top-b fragments the
    expression, the projection supervises the whole equation under the same budget."""
    pieces = ["The", " answer", ":", " 2", " *", " 3", " =", " 6", "."]
    scores = np.array([0.12, 0.15, 0.05, 1.0, 0.08, 1.0, 0.08, 1.0, 0.02])
    text, toks, pos = "", [], 0
    for p in pieces:
        toks.append((pos, pos + len(p)))
        text += p
        pos += len(p)
    start = text.index("2 * 3 = 6")
    math_span = (start, start + len("2 * 3 = 6"))
    units = units_from_spans(np.array(toks), [math_span])
    eq = [3, 4, 5, 6, 7]
    assert [as_list(u) for u in units] == [[0], [1], [2], eq, [8]]
    b_r = len(eq)

    token_top = as_list(top_b(scores, b_r))
    assert {3, 5, 7} <= set(token_top)  # the operands are kept ...
    assert 4 not in token_top and 6 not in token_top  # ... but "*" and "=" are dropped: fragmented
    assert not set(eq) <= set(token_top)

    for alpha in (0.0, 0.5, 1.0):
        proj = project(units, scores, b_r, alpha)
        assert as_list(proj.supervise) == eq, alpha  # the complete equation, same budget
        assert len(proj.supervise) <= b_r


# --- units never cut a word, a number or a <<...>> calculation ---------------------------------

_PIECES = ["hamburger", "she", "don't", "Léa", "x", "8", "16", "1,000.5", "3.75", "<<5*3=15>>15", "<<48/2=24>>",
           "$", " ", "  ", "\n", ".", ",", "-", "=", "*", "(", ")", "#### ", "\\boxed{", "}", "inch"]


@st.composite
def texts_and_tokens(draw):
    """A text glued from words, numbers, calculations, spaces and punctuation; tokens that cut it
    anywhere (a word may be split over several tokens, a token may hold a space and a word piece);
    character spans from a real segmenter or at random."""
    text = "".join(draw(st.lists(st.sampled_from(_PIECES), min_size=1, max_size=14)))
    cuts = sorted(set(draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=12))) - {len(text)})
    bounds = [0, *cuts, len(text)]
    toks = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1) if bounds[i + 1] > bounds[i]]
    how = draw(st.sampled_from(["random", "sentence", "math", "step", "list", "code"]))
    if how == "random":
        points = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
        spans = [(points[i], points[i + 1]) for i in range(0, len(points) - 1, 2)]
    else:
        from bridgecli.builtin.segmenters import SEGMENTERS

        spans = SEGMENTERS[how](text)
    return text, np.array(toks, dtype=np.int64).reshape(-1, 2), spans


@FAST
@given(case=texts_and_tokens())
def test_no_unit_boundary_inside_an_atom(case):
    """Between two consecutive units, no word, number or <<...>> calculation has characters in both
    the last token of one and the first token of the next."""
    from bridgecli.core.closure import atoms

    text, toks, spans = case
    units = units_from_spans(toks, spans, text)
    check_partition(units, len(toks))
    pieces = atoms(text)
    for left, right in zip(units, units[1:]):
        a, b = toks[left[-1]], toks[right[0]]
        for s, e in pieces:
            assert not (min(a[1], e) > max(a[0], s) and min(b[1], e) > max(b[0], s)), (
                text, text[s:e], [text[toks[u[0]][0]:toks[u[-1]][1]] for u in units])


def test_atoms_words_numbers_calculations():
    from bridgecli.core.closure import atoms

    text = "Léa's hamburger costs $1,000.5 = $<<5*3=15>>15 now."
    assert [text[s:e] for s, e in atoms(text)] == ["Léa's", "hamburger", "costs", "1,000.5", "<<5*3=15>>15", "now"]


def test_word_split_over_tokens_stays_one_unit():
    """The issue's "hamb[[urger]]": with no span over the word, its two tokens used to be two units."""
    text = "I ate a hamburger."
    toks = np.array([[0, 1], [1, 5], [5, 7], [7, 12], [12, 17], [17, 18]])  # "I"," ate"," a"," hamb","urger","."
    assert [as_list(u) for u in units_from_spans(toks, [], text)] == [[0], [1], [2], [3, 4], [5]]
    # a span that ends inside the word grows to its end
    assert [as_list(u) for u in units_from_spans(toks, [(0, 11)], text)] == [[0, 1, 2, 3, 4], [5]]
    # without the text: the old behaviour (the core mapping alone)
    assert [as_list(u) for u in units_from_spans(toks, [], None)] == [[j] for j in range(6)]


def test_math_segmenter_keeps_the_gsm8k_calculation_whole():
    from bridgecli.builtin.segmenters import split_math

    text = "So she pays $5 x 3 = $<<5*3=15>>15 in all.\n#### 15"
    assert [text[s:e] for s, e in split_math(text)] == ["$5 x 3 = $<<5*3=15>>15", "#### 15"]
    text = "5x3 = 15 and 2 X 4"
    assert [text[s:e] for s, e in split_math(text)] == ["5x3 = 15", "2 X 4"]
