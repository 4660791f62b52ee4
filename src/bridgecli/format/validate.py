"""Internal consistency of stream records, checked as they are read.

A record can pass every checksum and still make no sense: an unknown stage, an array whose bytes
do not fill its shape, kinds shorter than the tokens, a selection keeping positions that are not
on its side, a closure whose supervision is not its chosen units, a budget of 2^60. The reader
calls :func:`check_header` and :func:`check_example` on every record, so no step computes on such
a record: each raises :class:`FormatError` (exit 3) naming the file, the record and the field.

What holds for every example (n_p prompt, n_r response positions, ``T = len(input_ids)``):

- ``id`` non-empty and unique in the stream; ``index`` >= 0;
- ``tokens``: ``kinds`` has T bytes, each 0-3 (template, prompt, response, EOS), at least one response
  token, exactly one EOS after the last response token; ``offsets`` has 2T entries,
  ``0 <= start <= end <= len(text)``; token ids in [0, 2^31);
- the parts the header's stage promises are present (scores from ``scores`` on, selection from
  ``selection`` on, closure at ``closure``);
- ``scores``: ``a``, ``c`` (and ``loss``) float arrays of shape [n_r], ``A`` (and ``B``) of shape
  [n_r, n_p], the bytes filling the shape exactly;
- ``selection``: ``0 <= b_p, b_r <= T``; ``prompt_keep`` ascending prompt positions,
  ``min(max(b_p, |protected_prompt|), n_p)`` of them (protected tokens alone may exceed the budget);
  ``response_keep`` ascending response positions, ``min(max(b_r, |protected_response|), n_r)`` of them;
  ``protected_prompt`` / ``protected_response`` ascending positions of those; ``response_scores`` a float
  array of shape [n_r]; ``achieved_rho_*`` nil or ``|keep| / side`` (nil for an empty side);
  ``response_weights`` (1.3, when present) a float array of shape [len(response_keep)], values > 0;
- ``closure``: ``alpha`` in [0, 1]; ``units`` an even-length list of ``[start, end)`` pairs,
  ascending, disjoint, within the tokens, covering every response position; ``chosen`` distinct
  indices of units; ``filled`` (1.3) ascending response positions outside the chosen units;
  ``supervise`` exactly the response positions inside the chosen units and the filled ones, ascending;
  ``protected_units`` exactly the units holding a ``selection.protected_response`` token, ascending;
- ``references``: arrays of a float dtype of shape [n_p] (``prompt_*``) or [n_r] (``response_*``), the
  bytes filling the shape;
- numbers: every value of ``scores`` and ``references`` within +-2^48 (``spec.MAX_QUANTITY``, which keeps
  whatever ``select`` computes from them inside float32's range), and >= 0 where the quantity is never
  negative (``scores.c``, ``A`` and ``loss``, every ``references`` array: losses, attention masses, gradient
  norms; ``spec.NON_NEGATIVE_SCORES``); ``response_scores`` and ``u_sur`` within float32's range
  (``spec.MAX_RESULT``); NaN and infinities nowhere.

The checks run twice over: :func:`~bridgecli.format.validate_fast._fast_ok` tries all of them at once,
with few calls (the common case: they all hold); where it says no, :func:`_check_each` runs them one at a
time, per part of the record, in the order above, and names the first that fails.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..errors import FormatError
from .records import ALLOWED_DTYPES, REFERENCE_ARRAYS, Array, Example, Header, Scores, Selection
from .spec import EOS, MAX_QUANTITY, MAX_RESULT, NON_NEGATIVE_SCORES, PROMPT, RESPONSE, STAGES
from .validate_fast import (
    MAX_TOKEN_ID,
    _ascending,
    _closure_ok,
    _fast_ok,
    _protected_units,
    _scores_within,
)

FLOAT_DTYPES = ("float16", "float32", "float64")


class _Bad(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


def check_header(header: Header, name: str) -> None:
    if header.stage not in STAGES:
        raise FormatError(
            f"unknown stage {header.stage!r} (one of {', '.join(STAGES)})",
            file=name,
            record="header record",
            field="stage",
        )


def _array(
    field: str,
    arr: Any,
    shape: tuple[int, ...] | None,
    *,
    dtypes=FLOAT_DTYPES,
    bound: float | None = None,
    non_negative: bool = False,
) -> np.ndarray:
    """The values of ``arr``, checked: a float Array of ``shape`` whose bytes fill it, every value within
    ``[-bound, bound]`` (no NaN, no infinity), and >= 0 with ``non_negative``."""
    if not isinstance(arr, Array):
        raise _Bad(field, "not an array")
    if arr.dtype not in ALLOWED_DTYPES or arr.dtype not in dtypes:
        raise _Bad(field, f"dtype {arr.dtype!r} (expected {' or '.join(dtypes)})")
    if any(not isinstance(d, int) or d < 0 for d in arr.shape):
        raise _Bad(field, f"shape {arr.shape} has a negative dimension")
    if shape is not None and tuple(arr.shape) != shape:
        raise _Bad(field, f"shape {arr.shape}, expected {list(shape)}")
    size = math.prod(arr.shape) * np.dtype(arr.dtype).itemsize  # Python ints: no overflow
    if len(arr.data) != size:
        raise _Bad(field, f"{len(arr.data)} bytes of data for shape {arr.shape} and dtype {arr.dtype} (needs {size})")
    values = np.frombuffer(arr.data, dtype=np.dtype(arr.dtype).newbyteorder("<")).reshape(arr.shape)
    if bound is not None:
        _bounded(field, values, bound)
    if non_negative:
        negative = np.flatnonzero(values.reshape(-1) < 0)
        if len(negative):
            k = int(negative[0])
            raise _Bad(
                field,
                f"holds {float(values.reshape(-1)[k]):.6g} at index {k} (a loss, an attention mass or a gradient "
                "norm: values must be >= 0)",
            )
    return values


def _bound_text(bound: float) -> str:
    if bound == MAX_QUANTITY:
        return "+-2^48, the largest magnitude the stream format allows in scores and references"
    return "+-3.4e38 (float32's range), the largest magnitude the stream format allows in a selection's numbers"


def _bounded(field: str, values: Any, bound: float) -> None:
    """Every value finite and within ``[-bound, bound]``; else :class:`_Bad` naming the first that is not."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(~(np.abs(flat) <= bound))  # NaN compares False: it is bad too
    if len(bad):
        k = int(bad[0])
        value = float(flat[k])
        what = "NaN" if math.isnan(value) else ("an infinite value" if math.isinf(value) else f"{value:.6g}")
        raise _Bad(field, f"holds {what} at index {k} (values must lie within {_bound_text(bound)})")


def _ints(field: str, values: list[int]) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):
        raise _Bad(field, "holds a value that is not a 64-bit integer") from None


def _positions(field: str, values: list[int], allowed: np.ndarray, side: str, allowed_set: set | None = None) -> None:
    """``values`` ascending members of the sorted array ``allowed`` (``allowed_set``: the same as a set, for
    a quick check; the one below names the first bad value)."""
    if not values:
        return
    if allowed_set is not None:
        distinct = set(values)
        if len(distinct) == len(values) and distinct <= allowed_set and _ascending(values):
            return
    arr = _ints(field, values)
    where = np.searchsorted(allowed, arr)
    inside = (
        (where < len(allowed)) & (allowed[np.minimum(where, max(len(allowed) - 1, 0))] == arr)
        if len(allowed)
        else np.zeros(len(arr), dtype=bool)
    )
    if not inside.all():
        bad = int(arr[np.flatnonzero(~inside)[0]])
        raise _Bad(field, f"position {bad} is not a {side} token")
    if len(np.unique(arr)) != len(arr):
        raise _Bad(field, "holds a position twice")
    if not _ascending(values):
        raise _Bad(field, "positions not in ascending order")


def _check(ex: Example, stage: str) -> None:
    try:
        if _fast_ok(ex, stage):
            return
    except (TypeError, ValueError, IndexError, OverflowError):  # a value of a wrong type: the slow checks say
        pass
    _check_each(ex, stage)


def _check_each(ex: Example, stage: str) -> None:
    """Every check, one at a time, part by part: raises :class:`_Bad` naming the first that fails."""
    if not ex.id:
        raise _Bad("id", "empty")
    if ex.index < 0:
        raise _Bad("index", f"{ex.index} is negative")
    t, kinds, prompt, resp = _check_tokens(ex)
    n_p, n_r = len(prompt), len(resp)
    need = STAGES.index(stage) if stage in STAGES else 0
    for level, part in ((1, "scores"), (2, "selection"), (3, "closure")):
        if need >= level and getattr(ex, part) is None:
            raise _Bad(part, f"missing in a stream at stage '{stage}'")
    if ex.scores is not None:
        _check_scores(ex.scores, n_p, n_r)
    if ex.selection is not None:
        _check_selection(ex.selection, t, prompt, resp)
    clo = ex.closure
    if clo is not None and not _closure_ok(clo, t, ex.tokens.kinds, n_r, ex.selection):
        _check_closure(clo, ex.selection, t, kinds, resp)  # names what is wrong
    _check_references(ex, n_p, n_r)


def _check_tokens(ex: Example) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    """``tokens``: (T, the kinds, the prompt positions, the response positions)."""
    tok = ex.tokens
    t = len(tok.input_ids)
    if t == 0:
        raise _Bad("tokens.input_ids", "empty")
    ids = _ints("tokens.input_ids", tok.input_ids)
    if ids.min() < 0 or ids.max() > MAX_TOKEN_ID:
        raise _Bad("tokens.input_ids", "holds a token id outside [0, 2^31)")
    if len(tok.kinds) != t:
        raise _Bad("tokens.kinds", f"{len(tok.kinds)} kinds for {t} tokens")
    kinds = np.frombuffer(tok.kinds, dtype=np.uint8)
    if (kinds > EOS).any():
        raise _Bad("tokens.kinds", f"unknown kind {int(kinds[kinds > EOS][0])} (0-3)")
    resp = np.flatnonzero(kinds == RESPONSE)
    prompt = np.flatnonzero(kinds == PROMPT)
    eos = np.flatnonzero(kinds == EOS)
    if len(eos) != 1:
        raise _Bad("tokens.kinds", f"{len(eos)} EOS tokens (exactly one ends the response)")
    if len(resp) == 0:
        raise _Bad("tokens.kinds", "no response token (an example needs at least one)")
    if eos[0] < resp[-1]:
        raise _Bad("tokens.kinds", "the EOS token comes before a response token")
    if len(tok.offsets) != 2 * t:
        raise _Bad("tokens.offsets", f"{len(tok.offsets)} offsets for {t} tokens (needs {2 * t})")
    spans = _ints("tokens.offsets", tok.offsets).reshape(-1, 2)
    if (spans[:, 0] < 0).any() or (spans[:, 0] > spans[:, 1]).any() or (spans[:, 1] > len(ex.text)).any():
        raise _Bad("tokens.offsets", f"a span outside [0, {len(ex.text)}] or ending before it starts")
    return t, kinds, prompt, resp


def _check_scores(s, n_p: int, n_r: int) -> None:
    for name, shape in (("a", (n_r,)), ("c", (n_r,)), ("A", (n_r, n_p)), ("loss", (n_r,)), ("B", (n_r, n_p))):
        arr = getattr(s, name)
        if arr is not None or name not in ("loss", "B"):
            _array(f"scores.{name}", arr, shape, bound=MAX_QUANTITY, non_negative=name in NON_NEGATIVE_SCORES)


def _check_selection(sel: Selection, t: int, prompt: np.ndarray, resp: np.ndarray) -> None:
    n_p, n_r = len(prompt), len(resp)
    for name, b in (("b_p", sel.b_p), ("b_r", sel.b_r)):
        if not 0 <= b <= t:
            raise _Bad(f"selection.{name}", f"budget {b} outside [0, {t}] (the example has {t} tokens)")
    # protected tokens count against the budget; when they alone exceed it, the side holds exactly them
    for side, keep, allowed, budget, protected in (
        ("prompt", sel.prompt_keep, prompt, ("b_p", sel.b_p), sel.protected_prompt),
        ("response", sel.response_keep, resp, ("b_r", sel.b_r), sel.protected_response),
    ):
        _positions(f"selection.{side}_keep", keep, allowed, side, set(allowed.tolist()))
        if len(keep) != _kept(budget[1], protected, len(allowed)):
            raise _Bad(
                f"selection.{side}_keep",
                f"{len(keep)} positions for budget {budget[0]} = {budget[1]} of {len(allowed)} {side} tokens "
                f"({len(protected)} protected)",
            )
    _array("selection.response_scores", sel.response_scores, (n_r,), bound=MAX_RESULT)
    if sel.u_sur:
        _bounded("selection.u_sur", sel.u_sur, MAX_RESULT)
    for side, protected, keep in (
        ("prompt", sel.protected_prompt, sel.prompt_keep),
        ("response", sel.protected_response, sel.response_keep),
    ):
        if protected:
            _positions(f"selection.protected_{side}", protected, np.asarray(keep, dtype=np.int64), f"kept {side}")
    for name, rho, kept, size in (
        ("achieved_rho_p", sel.achieved_rho_p, len(sel.prompt_keep), n_p),
        ("achieved_rho_r", sel.achieved_rho_r, len(sel.response_keep), n_r),
    ):
        if rho is None:
            continue
        if not 0.0 <= rho <= 1.0:
            raise _Bad(f"selection.{name}", f"{rho} outside [0, 1]")
        if size == 0:
            raise _Bad(f"selection.{name}", f"{rho} for a side without tokens (nil there)")
        if not _rho_ok(rho, kept, size):
            raise _Bad(f"selection.{name}", f"{rho} is not {kept} kept / {size} tokens")
    if sel.response_weights is not None:
        w = _array("selection.response_weights", sel.response_weights, (len(sel.response_keep),), bound=MAX_RESULT)
        if (w <= 0).any():
            raise _Bad("selection.response_weights", "holds a weight <= 0")


def _check_closure(clo, sel: Selection | None, t: int, kinds: np.ndarray, resp: np.ndarray) -> None:
    """The closure's checks one at a time (after :func:`_closure_ok` found one that fails)."""
    if not 0.0 <= clo.alpha <= 1.0:
        raise _Bad("closure.alpha", f"{clo.alpha} outside [0, 1]")
    pairs = _units(clo.units, t, resp)
    if any(not isinstance(c, int) or not 0 <= c < len(pairs) for c in clo.chosen):
        raise _Bad("closure.chosen", f"an index outside the {len(pairs)} units")
    if len(set(clo.chosen)) != len(clo.chosen):
        raise _Bad("closure.chosen", "holds a unit twice")
    if len(set(clo.protected_units)) != len(clo.protected_units):
        raise _Bad("closure.protected_units", "holds a unit twice")
    if any(c not in set(clo.chosen) for c in clo.protected_units):
        raise _Bad("closure.protected_units", "an index that is not a chosen unit")
    expected_units = _protected_units([a for a, _ in pairs], sel)
    if clo.protected_units != expected_units:
        raise _Bad(
            "closure.protected_units",
            f"is not the units holding the selection's protected response tokens, ascending "
            f"(expected {expected_units})",
        )
    mask = np.zeros(t, dtype=bool)
    for c in clo.chosen:
        a, b = pairs[c]
        mask[a:b] = True
    if clo.filled:
        filled = _ints("closure.filled", clo.filled)
        if (filled < 0).any() or (filled >= t).any() or (np.diff(filled) <= 0).any():
            raise _Bad("closure.filled", "positions not ascending, repeated or outside the tokens")
        if (kinds[filled] != RESPONSE).any() or mask[filled].any():
            raise _Bad("closure.filled", "a position that is not a response token outside the chosen units")
        mask[filled] = True
    expected = np.flatnonzero(mask & (kinds == RESPONSE))
    if not np.array_equal(_ints("closure.supervise", clo.supervise), expected):
        raise _Bad(
            "closure.supervise", "is not the response positions of the chosen units (and the filled ones), in order"
        )


def _units(units: list, t: int, resp: np.ndarray) -> list[tuple[int, int]]:
    """``closure.units`` as ``[start, end)`` pairs: ascending, disjoint, within the ``t`` tokens, covering every
    response position."""
    if len(units) % 2:
        raise _Bad("closure.units", f"odd length {len(units)} (flattened [start, end) pairs)")
    pairs = [(units[i], units[i + 1]) for i in range(0, len(units), 2)]
    last = 0
    for k, (a, b) in enumerate(pairs):
        if not (isinstance(a, int) and isinstance(b, int) and last <= a < b <= t):
            raise _Bad(
                "closure.units",
                f"unit {k} [{a}, {b}) is empty, overlaps the one before, or lies outside the {t} tokens",
            )
        last = b
    covered = np.zeros(t, dtype=bool)
    for a, b in pairs:
        covered[a:b] = True
    outside = resp[~covered[resp]]
    if len(outside):
        raise _Bad("closure.units", f"response position {int(outside[0])} lies in no unit (they cover every one)")
    return pairs


def _check_references(ex: Example, n_p: int, n_r: int) -> None:
    for model, ref in ex.references.items():
        for name in REFERENCE_ARRAYS:
            arr = getattr(ref, name)
            if arr is not None:
                size = n_p if name.startswith("prompt") else n_r
                _array(f"references.{model}.{name}", arr, (size,), bound=MAX_QUANTITY, non_negative=True)


def _kept(budget: int, protected: list, size: int) -> int:
    """How many positions a side keeps: its budget, or its protected tokens where they alone exceed it, at most
    the side's size."""
    return min(max(budget, len(protected)), size)


def _rho_ok(rho: float, kept: int, size: int) -> bool:
    """``rho`` is ``kept / size`` up to rounding (``size`` >= 1): the nearest multiple of 1/size is kept's."""
    return abs(rho * size - kept) < 0.5


class Validator:
    """Checks each example of one stream (duplicate ids across examples included)."""

    def __init__(self, name: str, header: Header):
        check_header(header, name)
        self.name = name
        self.stage = header.stage
        self._ids: set[int] = set()

    def __call__(self, ex: Example, position: int) -> None:
        self.check(ex, position)
        self.seen(ex.id, ex.index if isinstance(ex.index, int) and ex.index >= 0 else position)

    def check(self, ex: Example, position: int) -> None:
        """The example on its own (everything but the duplicate-id check)."""
        record = ex.index if isinstance(ex.index, int) and ex.index >= 0 else position
        try:
            _check(ex, self.stage)
        except _Bad as bad:
            raise FormatError(bad.message, file=self.name, record=record, field=bad.field) from None

    def seen(self, id: str, record) -> None:
        """Record ``id``; :class:`FormatError` when an earlier example had it."""
        key = hash(id)  # a set of hashes keeps memory flat; a collision needs ~2^32 examples
        if key in self._ids:
            raise FormatError(f"duplicate id {id!r}", file=self.name, record=record, field="id")
        self._ids.add(key)


def check_example(ex: Example, stage: str, *, name: str = "<stream>") -> None:
    """Check one example on its own (no duplicate-id check); :class:`FormatError` when inconsistent."""
    try:
        _check(ex, stage)
    except _Bad as bad:
        raise FormatError(bad.message, file=name, record=ex.index, field=bad.field) from None


def first_bad_scores(batch: Sequence[Scores]) -> tuple[int, str, str] | None:
    """Where a scorer's output for a batch breaks the format's rule on numbers, as the reader would find it:
    ``(k, field, message)`` for the first bad array (``k`` its position in ``batch``, ``field`` such as
    ``scores.a``, ``message`` the words :class:`Validator` uses: NaN, an infinity, a value beyond +-2^48, a negative loss or attention,
    a dtype other than a float one, bytes that do not fill the shape); None when every array is sound.
    Shapes against the tokens are the reader's to check. A few numpy passes over the whole batch
    (:func:`_scores_within`); the arrays are looked at one by one only after those fail."""
    arrays: list[tuple[Any, bool]] = []
    for s in batch:  # a, c and A are required: a missing one (None) fails the scan, and the look below names it
        for name in ("a", "c", "A", "loss", "B"):
            arr = getattr(s, name)
            if arr is not None or name not in ("loss", "B"):
                arrays.append((arr, name in NON_NEGATIVE_SCORES))
    if _scores_within(arrays):
        return None
    for k, s in enumerate(batch):
        for name in ("a", "c", "A", "loss", "B"):
            arr = getattr(s, name)
            if arr is None and name in ("loss", "B"):
                continue
            try:
                _array(f"scores.{name}", arr, None, bound=MAX_QUANTITY, non_negative=name in NON_NEGATIVE_SCORES)
            except _Bad as bad:
                return k, bad.field, bad.message
    return None
