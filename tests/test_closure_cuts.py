"""The closure step's fast path (core/closure.py: unit_cuts, np_sum, project_cuts) against the array
code it replaces: the same units, q(u) equal to numpy's sums bit for bit, the same chosen units."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bridgecli.core.closure import (
    _joined, _widen, atoms, forced_units, np_sum, project, project_cuts, unit_cuts, unit_sums, units_from_spans,
)

FAST = settings(max_examples=300, deadline=None)


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


# --- np_sum ----------------------------------------------------------------------------------------

floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32),
                   st.floats(-1e6, 1e6, allow_nan=False), st.sampled_from([0.0, 1e-300, -1e-300, 1e300, 0.1, 1 / 3]))


@FAST
@given(values=st.lists(floats, max_size=700), data=st.data())
def test_np_sum_is_numpys_sum_bit_for_bit(values, data):
    lo = data.draw(st.integers(0, len(values)))
    n = data.draw(st.integers(0, len(values) - lo))
    want = float(np.asarray(values[lo:lo + n], dtype=np.float64).sum())
    got = np_sum(values, lo, n)
    assert bits(got) == bits(want) or got == want == 0.0  # the sign of a zero sum never reaches the output


def test_np_sum_every_length_to_1100():
    rng = np.random.default_rng(0)
    for n in range(1100):
        x = rng.normal(size=n) * 10.0 ** rng.uniform(-8, 8, size=n)
        assert bits(np_sum(x.tolist(), 0, n)) == bits(float(x.sum())), n


@FAST
@given(data=st.data())
def test_unit_sums_are_numpys_sums(data):
    sizes = data.draw(st.lists(st.one_of(st.integers(1, 9), st.integers(1, 140)), max_size=10))
    cuts = [0]
    for size in sizes:
        cuts.append(cuts[-1] + size)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=cuts[-1]) * 10.0 ** rng.uniform(-8, 8, size=cuts[-1])
    got = unit_sums(x, cuts)
    want = [float(x[a:b].sum()) for a, b in zip(cuts, cuts[1:])]
    assert [bits(v) for v in got] == [bits(v) for v in want] or got == want  # == : zero signs aside


# --- unit_cuts against the array code it replaced ------------------------------------------------------

def old_units(token_spans, char_spans, text=None):
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    n = token_spans.shape[0]
    spans = sorted((int(s), int(e)) for s, e in char_spans if e > s)
    pieces = atoms(text) if text is not None else []
    spans = _widen(spans, pieces)
    owner = np.full(n, -1, dtype=np.int64)
    if spans and n:
        starts = np.array([s for s, _ in spans], dtype=np.int64)
        ends = np.array([e for _, e in spans], dtype=np.int64)
        overlap = (np.minimum(token_spans[:, 1:2], ends[None, :]) - np.maximum(token_spans[:, 0:1], starts[None, :]))
        best = overlap.argmax(axis=1)
        has = overlap[np.arange(n), best] > 0
        owner[has] = best[has]
    starts_at = np.flatnonzero((owner < 0) | np.concatenate([[True], owner[1:] != owner[:-1]])) if n else []
    units = np.split(np.arange(n, dtype=np.int64), starts_at[1:]) if n else []
    if pieces and len(units) > 1:
        joined = _joined(token_spans, pieces)
        merged = [units[0]]
        for unit in units[1:]:
            if joined[unit[0] - 1]:
                merged[-1] = np.concatenate([merged[-1], unit])
            else:
                merged.append(unit)
        units = merged
    return [u.tolist() for u in units]


@st.composite
def tokenised_texts(draw):
    text = draw(st.text(alphabet="ab1 2,.<>=+$x\n", max_size=40))
    n = draw(st.integers(0, 14))
    toks = []
    for _ in range(n):
        s = draw(st.integers(0, len(text)))
        toks.append((s, draw(st.integers(s, min(len(text), s + 6)))))
    toks.sort()
    spans = [(s, draw(st.integers(s, len(text)))) for s in draw(st.lists(st.integers(0, len(text)), max_size=5))]
    return text, toks, spans


@FAST
@given(case=tokenised_texts(), with_text=st.booleans())
def test_unit_cuts_are_the_old_units(case, with_text):
    text, toks, spans = case
    cuts = unit_cuts(np.array(toks, dtype=np.int64).reshape(-1, 2), spans, text if with_text else None)
    want = old_units(toks, spans, text if with_text else None)
    assert [list(range(a, b)) for a, b in zip(cuts, cuts[1:])] == want
    assert [u.tolist() for u in units_from_spans(np.array(toks).reshape(-1, 2), spans, text if with_text else None)] == want


# --- project_cuts against project -------------------------------------------------------------------------

@FAST
@given(data=st.data(), alpha=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1)))
def test_project_cuts_is_project(data, alpha):
    n = data.draw(st.integers(0, 40))
    inner = sorted(data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=max(n - 1, 0)))) if n > 1 else []
    cuts = [0, *inner, n] if n else [0]
    scores = np.array(data.draw(st.lists(st.one_of(floats, st.integers(-3, 3).map(float)), min_size=n, max_size=n)),
                      dtype=np.float64)
    b_r = data.draw(st.integers(0, n + 2))
    protected = np.array(data.draw(st.lists(st.integers(0, max(n, 1)), max_size=3)), dtype=np.int64)
    units = [np.arange(a, b, dtype=np.int64) for a, b in zip(cuts, cuts[1:])]
    want = project(units, scores, b_r, alpha, protected)
    chosen, forced = project_cuts(cuts, scores, b_r, alpha, protected)
    assert chosen == want.chosen.tolist()
    assert forced == forced_units(units, protected).tolist()
