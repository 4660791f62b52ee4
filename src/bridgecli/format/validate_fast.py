"""The checks of :mod:`bridgecli.format.validate` at once, for the common case where they all hold.

:func:`_fast_ok` says True only when every check of ``validate._check_each`` holds, with few Python and
numpy calls per record (the reader validates every record it reads, so this time is part of every step's
cost: bench/cpu_steps/floor.py measures it); on False the step-by-step checks run and name the first that fails. The
closure's checks at once (:func:`_closure_ok`) serve both: the step-by-step checks run theirs only where it
says no. Never True for a record that the step-by-step checks refuse: tests/test_validate_fast.py checks
this on every kind of broken record.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_right
from typing import Any

import numpy as np

from .records import REFERENCE_ARRAYS, Array, Example
from .spec import EOS, MAX_QUANTITY, MAX_RESULT, NON_NEGATIVE_SCORES, PROMPT, RESPONSE, STAGES

MAX_TOKEN_ID = 2**31 - 1


def _ascending(values: list) -> bool:
    return all(map(operator.lt, values, values[1:]))


def _protected_units(starts: list[int], sel) -> list[int]:
    """The ascending indices of the units (ascending ``starts``) that hold a protected response token of
    ``sel`` (none without a selection); every response position lies in a unit (checked before)."""
    if sel is None or not sel.protected_response:
        return []
    return sorted({bisect_right(starts, p) - 1 for p in sel.protected_response})


def _closure_ok(clo, t: int, kinds: bytes, n_r: int, sel) -> bool:
    """The closure checks of ``validate._check_each`` at once, on Python ints (True: all hold); on False
    the caller runs the step-by-step checks, which say which one fails. ``n_r`` >= 1 response tokens;
    ``sel`` the example's selection (checked) or None."""
    if not 0.0 <= clo.alpha <= 1.0 or len(clo.units) % 2:
        return False
    if not set(map(type, clo.units)) <= {int} or not set(map(type, clo.chosen)) <= {int}:
        return False
    starts, ends = clo.units[0::2], clo.units[1::2]
    # 0 <= start < end <= next start ... <= t: non-empty, ascending, disjoint, within the tokens
    if starts and (
        starts[0] < 0
        or ends[-1] > t
        or not all(map(operator.lt, starts, ends))
        or not all(map(operator.le, ends, starts[1:]))
    ):
        return False
    # every response position inside a unit: none before the first, after the last or in a gap between two
    if not starts or kinds.find(RESPONSE) < starts[0] or kinds.rfind(RESPONSE) >= ends[-1]:
        return False
    if ends[:-1] != starts[1:] and any(kinds.count(RESPONSE, e, s) for e, s in zip(ends, starts[1:])):
        return False
    chosen = clo.chosen
    if chosen and not _ascending_within(chosen, len(starts)):  # close writes them ascending
        if min(chosen) < 0 or max(chosen) >= len(starts) or len(set(chosen)) != len(chosen):
            return False
        chosen = sorted(chosen)
    protected = clo.protected_units
    if (protected or (sel is not None and sel.protected_response)) and (
        protected != _protected_units(starts, sel) or not set(protected) <= set(chosen)
    ):
        return False
    # the units are ascending and disjoint: their positions in unit order are ascending
    expected: list[int] = []
    for c in chosen:
        expected += range(starts[c], ends[c])
    if expected and _pick(kinds, expected).count(RESPONSE) != len(expected):  # close's units: response only
        expected = [i for i in expected if kinds[i] == RESPONSE]
    filled = clo.filled
    if filled:  # (1.3) close --fill: ascending response positions outside the chosen units
        if not set(map(type, filled)) <= {int} or not _ascending_within(filled, t):
            return False
        if _pick(kinds, filled).count(RESPONSE) != len(filled) or not set(filled).isdisjoint(expected):
            return False
        expected = sorted(expected + filled)
    return isinstance(clo.supervise, list) and expected == clo.supervise


def _ascending_within(values: list, size: int) -> bool:
    """``values`` (non-empty) strictly ascending within ``[0, size)``: distinct positions."""
    return values[0] >= 0 and values[-1] < size and all(map(operator.lt, values, values[1:]))


def _pick(values, at: list[int]) -> tuple:
    """``tuple(values[i] for i in at)`` (``at`` non-empty), in one call."""
    return operator.itemgetter(*at)(values) if len(at) > 1 else (values[at[0]],)


#: per float dtype, the unsigned integer of its width and the mask that drops the sign bit. Without their
#: sign bit, IEEE floats order as their bit patterns do, as unsigned integers, with the infinities and NaN
#: above every finite value: ``|x| <= bound`` exactly when the pattern is at most the bound's.
_UINT: dict[str, tuple[np.dtype, int]] = {
    "float16": (np.dtype("<u2"), 0x7FFF),
    "float32": (np.dtype("<u4"), 0x7FFFFFFF),
    "float64": (np.dtype("<u8"), 0x7FFFFFFFFFFFFFFF),
}


def _pattern(dtype: str, bound: float) -> int:
    """The bit pattern of the largest value of ``dtype`` within ``bound`` (the dtype's largest finite one when
    the bound lies beyond it)."""
    uint, _ = _UINT[dtype]
    value = min(bound, float(np.finfo(dtype).max))
    return int(np.array([value], dtype=np.dtype(dtype).newbyteorder("<")).view(uint)[0])


_LIMIT = {(dtype, bound): _pattern(dtype, bound) for dtype in _UINT for bound in (MAX_QUANTITY, MAX_RESULT)}
_KIND_BYTES = bytes(range(EOS + 1))


def _fills(arr: Array, shape) -> bool:
    """``arr`` is of a float dtype and its bytes fill ``shape`` (sizes already known to be counts)."""
    width = _UINT.get(arr.dtype)
    return width is not None and len(arr.data) == math.prod(shape) * width[0].itemsize


def _all_bounded(arrays, floats: list[float] | None = None) -> bool:
    """Every ``(array, shape, bound, non-negative)`` of ``arrays`` a float Array of ``shape`` whose bytes fill
    it, with every value within ``[-bound, bound]``, or ``[0, bound]`` where non-negative (no NaN, no
    infinity), and every value of ``floats`` within ``MAX_RESULT``. Per dtype and sign rule, one numpy pass
    over the bytes of all its arrays gives the largest bit pattern (the largest magnitude's, the sign bit
    dropped; with it, for the non-negative ones: a negative value's pattern lies above every positive one's);
    only when it lies beyond the smallest of their bounds are the arrays of each bound looked at on their
    own. (-0.0 fails here and passes the step-by-step check.)"""
    data: dict[tuple[str, bool], tuple[list[bytes], list[float]]] = {}
    for arr, shape, bound, non_negative in arrays:
        if type(arr) is not Array or arr.shape != shape or not _fills(arr, shape):
            return False
        entry = data.get((arr.dtype, non_negative))
        if entry is None:
            data[arr.dtype, non_negative] = ([arr.data], [bound])
        else:
            entry[0].append(arr.data)
            entry[1].append(bound)
    # Python floats: a finite sum has no NaN and no infinity in it (values within the bound never overflow it)
    if floats and not (math.isfinite(sum(floats)) and -MAX_RESULT <= min(floats) and max(floats) <= MAX_RESULT):
        return False
    for (dtype, non_negative), (chunks, bounds) in data.items():
        uint, mask = _UINT[dtype]
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if not raw:
            continue
        patterns = np.frombuffer(raw, dtype=uint)
        if not non_negative:
            patterns = patterns & mask
        if int(patterns.max()) <= _LIMIT[dtype, min(bounds)]:
            continue
        at = 0
        for bound, chunk in zip(bounds, chunks):
            size = len(chunk) // uint.itemsize
            if size and int(patterns[at : at + size].max()) > _LIMIT[dtype, bound]:
                return False
            at += size
    return True


#: arrays of more bytes than this are scanned on their own, smaller ones joined per dtype first
_JOIN_BELOW = 1 << 16


def _scores_within(arrays: list[tuple[Any, bool]]) -> bool:
    """Every ``(array, non-negative)`` a float array whose bytes fill its shape, every value within +-2^48,
    or within [0, 2^48] where non-negative. On the bit patterns (:data:`_UINT`), a scorer's batch at a time:
    the plain maximum first, which needs no temporary array and settles arrays without a negative value (it
    is the whole check of the non-negative ones: a negative value's pattern lies above every positive one's);
    the maximum without the sign bit only when that one is beyond the bound's pattern. Small arrays are
    joined per dtype, large ones read where they lie (no copy). (:func:`_all_bounded` does the reader's
    check, with a bound and a shape per array.)"""
    small: dict[tuple[str, bool], list[bytes]] = {}
    scans: list[tuple[str, bool, bytes]] = []
    for arr, non_negative in arrays:
        if type(arr) is not Array or any(type(d) is not int or d < 0 for d in arr.shape):
            return False
        if not _fills(arr, arr.shape):
            return False
        if len(arr.data) > _JOIN_BELOW:
            scans.append((arr.dtype, non_negative, arr.data))
        else:
            small.setdefault((arr.dtype, non_negative), []).append(arr.data)
    scans += [(dtype, non_negative, b"".join(chunks)) for (dtype, non_negative), chunks in small.items()]
    for dtype, non_negative, data in scans:
        uint, mask = _UINT[dtype]
        limit = _LIMIT[dtype, MAX_QUANTITY]
        patterns = np.frombuffer(data, dtype=uint)
        if len(patterns) and int(patterns.max()) > limit and (non_negative or int((patterns & mask).max()) > limit):
            return False
    return True


def _on_side(values: list, kinds: bytes, kind: int) -> bool:
    """``values`` are ascending positions whose kind is ``kind``."""
    if not values:
        return True
    return _ascending_within(values, len(kinds)) and _pick(kinds, values).count(kind) == len(values)


def _fast_ok(ex: Example, stage: str) -> bool:
    """True when every check of ``validate._check_each`` holds, found with few Python and numpy calls;
    False when one may fail (then ``_check_each`` runs, and names it). Never True for a record that
    ``_check_each`` refuses: the tests check this on every kind of broken record."""
    if not ex.id or ex.index < 0:
        return False
    tok = ex.tokens
    ids, kinds, offsets = tok.input_ids, tok.kinds, tok.offsets
    t = len(ids)
    if t == 0 or len(kinds) != t or len(offsets) != 2 * t or min(ids) < 0 or max(ids) > MAX_TOKEN_ID:
        return False
    if kinds.translate(None, _KIND_BYTES) or kinds.count(EOS) != 1 or kinds.rfind(RESPONSE) > kinds.find(EOS):
        return False
    starts, ends = offsets[0::2], offsets[1::2]
    if min(starts) < 0 or max(ends) > len(ex.text) or not all(map(operator.le, starts, ends)):
        return False
    n_p, n_r = kinds.count(PROMPT), kinds.count(RESPONSE)
    if n_r == 0:
        return False
    need = STAGES.index(stage) if stage in STAGES else 0
    if (need >= 1 and ex.scores is None) or (need >= 2 and ex.selection is None) or (need >= 3 and ex.closure is None):
        return False

    # (array, shape, bound, non-negative) of every float array: checked together at the end
    arrays: list[tuple[Array, list[int], float, bool]] = []
    s = ex.scores
    if s is not None:
        for name, shape in (("a", [n_r]), ("c", [n_r]), ("A", [n_r, n_p]), ("loss", [n_r]), ("B", [n_r, n_p])):
            arr = getattr(s, name)
            if arr is not None or name not in ("loss", "B"):
                arrays.append((arr, shape, MAX_QUANTITY, name in NON_NEGATIVE_SCORES))

    sel = ex.selection
    u_sur = None
    if sel is not None:
        if not (0 <= sel.b_p <= t and 0 <= sel.b_r <= t):
            return False
        keep_p, keep_r = sel.prompt_keep, sel.response_keep
        protected_p, protected_r = sel.protected_prompt, sel.protected_response
        # as _kept: the budget, or the protected tokens where they alone exceed it, at most the side's size
        if len(keep_p) != min(max(sel.b_p, len(protected_p)), n_p) or len(keep_r) != min(
            max(sel.b_r, len(protected_r)), n_r
        ):
            return False
        if not (_on_side(keep_p, kinds, PROMPT) and _on_side(keep_r, kinds, RESPONSE)):
            return False
        arrays.append((sel.response_scores, [n_r], MAX_RESULT, False))
        u_sur = sel.u_sur
        if protected_p and not (_ascending(protected_p) and set(protected_p) <= set(keep_p)):
            return False
        if protected_r and not (_ascending(protected_r) and set(protected_r) <= set(keep_r)):
            return False
        # as _rho_ok: kept / size up to rounding, nil for an empty side
        rho = sel.achieved_rho_p
        if rho is not None and not (n_p and 0.0 <= rho <= 1.0 and abs(rho * n_p - len(keep_p)) < 0.5):
            return False
        rho = sel.achieved_rho_r
        if rho is not None and not (0.0 <= rho <= 1.0 and abs(rho * n_r - len(keep_r)) < 0.5):
            return False
        if sel.response_weights is not None:  # (1.3) bounded (with the others below) and > 0
            arrays.append((sel.response_weights, [len(keep_r)], MAX_RESULT, False))
            if not (sel.response_weights.numpy("float64") > 0).all():
                return False

    if ex.closure is not None and not _closure_ok(ex.closure, t, kinds, n_r, sel):
        return False
    for ref in ex.references.values():
        for name in REFERENCE_ARRAYS:
            arr = getattr(ref, name)
            if arr is not None:
                arrays.append((arr, [n_p if name.startswith("prompt") else n_r], MAX_QUANTITY, True))
    return _all_bounded(arrays, u_sur)
