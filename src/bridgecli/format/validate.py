"""Internal consistency of stream records, checked as they are read.

A record can pass every checksum and still make no sense: an unknown stage, an array whose bytes
do not fill its shape, kinds shorter than the tokens, a selection keeping positions that are not
on its side, a closure whose supervision is not its chosen units, a budget of 2^60. The reader
calls :func:`check_header` and :func:`check_example` on every record, so no step computes on such
a record: each raises :class:`FormatError` (exit 3) naming the file, the record and the field.

What holds for every example (n_p prompt, n_r response positions, ``T = len(input_ids)``):

- ``id`` non-empty and unique in the stream; ``index`` >= 0;
- ``tokens``: ``kinds`` has T bytes, each 0-3 (template, prompt, response, EOS), exactly one EOS
  after the last response token, at least one response token; ``offsets`` has 2T entries,
  ``0 <= start <= end <= len(text)``; token ids in [0, 2^31);
- the parts the header's stage promises are present (scores from ``scores`` on, selection from
  ``selection`` on, closure at ``closure``);
- ``scores``: ``a``, ``c`` (and ``loss``) float arrays of shape [n_r], ``A`` of shape [n_r, n_p],
  the bytes filling the shape exactly, values finite (``loss`` may not be NaN);
- ``selection``: ``0 <= b_p, b_r <= T``; ``prompt_keep`` distinct prompt positions, ``min(b_p, n_p)``
  of them; ``response_keep`` distinct response positions, ``min(b_r, n_r)`` of them;
  ``response_scores`` a float array of shape [n_r] without NaN; ``achieved_rho_*`` in [0, 1];
  ``response_weights`` (when present) a float array of shape [len(response_keep)], finite and > 0;
- ``closure``: ``alpha`` in [0, 1]; ``units`` an even-length list of ``[start, end)`` pairs,
  ascending, disjoint, within the tokens; ``chosen`` distinct indices of units; ``filled`` ascending
  response positions outside the chosen units; ``supervise`` exactly the response positions inside
  the chosen units and the filled ones, ascending;
- ``references``: arrays of a float dtype whose first dimension is n_p (``prompt_*``) or n_r
  (``response_*``), the bytes filling the shape.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from ..errors import FormatError
from .records import ALLOWED_DTYPES, Array, Example, Header
from .spec import EOS, PROMPT, RESPONSE, STAGES

MAX_TOKEN_ID = 2**31 - 1
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
    first_dim: int | None = None,
    finite: bool = False,
    no_nan: bool = False,
) -> np.ndarray:
    if not isinstance(arr, Array):
        raise _Bad(field, "not an array")
    if arr.dtype not in ALLOWED_DTYPES or arr.dtype not in dtypes:
        raise _Bad(field, f"dtype {arr.dtype!r} (expected {' or '.join(dtypes)})")
    if any(not isinstance(d, int) or d < 0 for d in arr.shape):
        raise _Bad(field, f"shape {arr.shape} has a negative dimension")
    if shape is not None and tuple(arr.shape) != shape:
        raise _Bad(field, f"shape {arr.shape}, expected {list(shape)}")
    if first_dim is not None and (not arr.shape or arr.shape[0] != first_dim):
        raise _Bad(field, f"shape {arr.shape}, expected a first dimension of {first_dim}")
    size = math.prod(arr.shape) * np.dtype(arr.dtype).itemsize  # Python ints: no overflow
    if len(arr.data) != size:
        raise _Bad(field, f"{len(arr.data)} bytes of data for shape {arr.shape} and dtype {arr.dtype} (needs {size})")
    values = np.frombuffer(arr.data, dtype=np.dtype(arr.dtype).newbyteorder("<")).reshape(arr.shape)
    if finite and not np.isfinite(values).all():
        raise _Bad(field, "holds NaN or infinite values")
    if no_nan and np.isnan(values).any():
        raise _Bad(field, "holds NaN values")
    return values


def _ints(field: str, values: list[int]) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.int64).reshape(-1)
    except (OverflowError, TypeError, ValueError):
        raise _Bad(field, "holds a value that is not a 64-bit integer") from None


def _positions(field: str, values: list[int], allowed: np.ndarray, side: str, allowed_set: set | None = None) -> None:
    """``values`` distinct members of the sorted array ``allowed`` (``allowed_set``: the same as a set, for
    a quick check; the one below names the first bad value)."""
    if not values:
        return
    if allowed_set is not None:
        distinct = set(values)
        if len(distinct) == len(values) and distinct <= allowed_set:
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


def _check(ex: Example, stage: str) -> None:
    try:
        if _fast_ok(ex, stage):
            return
    except (TypeError, ValueError, IndexError, OverflowError):  # a value of a wrong type: the slow checks say
        pass
    _check_each(ex, stage)


def _check_each(ex: Example, stage: str) -> None:
    """Every check, one at a time: raises :class:`_Bad` naming the first that fails."""
    if not ex.id:
        raise _Bad("id", "empty")
    if ex.index < 0:
        raise _Bad("index", f"{ex.index} is negative")
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
    if len(resp) and eos[0] < resp[-1]:
        raise _Bad("tokens.kinds", "the EOS token comes before a response token")
    if len(tok.offsets) != 2 * t:
        raise _Bad("tokens.offsets", f"{len(tok.offsets)} offsets for {t} tokens (needs {2 * t})")
    spans = _ints("tokens.offsets", tok.offsets).reshape(-1, 2)
    if (spans[:, 0] < 0).any() or (spans[:, 0] > spans[:, 1]).any() or (spans[:, 1] > len(ex.text)).any():
        raise _Bad("tokens.offsets", f"a span outside [0, {len(ex.text)}] or ending before it starts")
    n_p, n_r = len(prompt), len(resp)

    need = STAGES.index(stage) if stage in STAGES else 0
    for level, part in ((1, "scores"), (2, "selection"), (3, "closure")):
        if need >= level and getattr(ex, part) is None:
            raise _Bad(part, f"missing in a stream at stage '{stage}'")

    s = ex.scores
    if s is not None:
        _array("scores.a", s.a, (n_r,), finite=True)
        _array("scores.c", s.c, (n_r,), finite=True)
        _array("scores.A", s.A, (n_r, n_p), finite=True)
        if s.loss is not None:
            _array("scores.loss", s.loss, (n_r,), no_nan=True)
        if s.B is not None:
            _array("scores.B", s.B, (n_r, n_p), finite=True)

    sel = ex.selection
    if sel is not None:
        for name, b in (("b_p", sel.b_p), ("b_r", sel.b_r)):
            if not 0 <= b <= t:
                raise _Bad(f"selection.{name}", f"budget {b} outside [0, {t}] (the example has {t} tokens)")
        _positions("selection.prompt_keep", sel.prompt_keep, prompt, "prompt", set(prompt.tolist()))
        if len(sel.prompt_keep) != min(sel.b_p, n_p):
            raise _Bad(
                "selection.prompt_keep",
                f"{len(sel.prompt_keep)} positions for budget b_p = {sel.b_p} of {n_p} prompt tokens",
            )
        _positions("selection.response_keep", sel.response_keep, resp, "response", set(resp.tolist()))
        if len(sel.response_keep) != min(sel.b_r, n_r):
            raise _Bad(
                "selection.response_keep",
                f"{len(sel.response_keep)} positions for budget b_r = {sel.b_r} of {n_r} response tokens",
            )
        _array("selection.response_scores", sel.response_scores, (n_r,), no_nan=True)
        if sel.protected_prompt:
            _positions(
                "selection.protected_prompt",
                sel.protected_prompt,
                np.sort(np.asarray(sel.prompt_keep, dtype=np.int64)),
                "kept prompt",
            )
        if sel.protected_response:
            _positions(
                "selection.protected_response",
                sel.protected_response,
                np.sort(np.asarray(sel.response_keep, dtype=np.int64)),
                "kept response",
            )
        for name, rho in (("achieved_rho_p", sel.achieved_rho_p), ("achieved_rho_r", sel.achieved_rho_r)):
            if rho is not None and not 0.0 <= rho <= 1.0:
                raise _Bad(f"selection.{name}", f"{rho} outside [0, 1]")
        if sel.response_weights is not None:
            w = _array("selection.response_weights", sel.response_weights, (len(sel.response_keep),), finite=True)
            if (w <= 0).any():
                raise _Bad("selection.response_weights", "holds a weight <= 0")

    clo = ex.closure
    if clo is not None and not _closure_ok(clo, t, tok.kinds):  # the checks below name what is wrong
        if not 0.0 <= clo.alpha <= 1.0:
            raise _Bad("closure.alpha", f"{clo.alpha} outside [0, 1]")
        if len(clo.units) % 2:
            raise _Bad("closure.units", f"odd length {len(clo.units)} (flattened [start, end) pairs)")
        pairs = [(clo.units[i], clo.units[i + 1]) for i in range(0, len(clo.units), 2)]
        last = 0
        for k, (a, b) in enumerate(pairs):
            if not (isinstance(a, int) and isinstance(b, int) and last <= a < b <= t):
                raise _Bad(
                    "closure.units",
                    f"unit {k} [{a}, {b}) is empty, overlaps the one before, or lies outside the {t} tokens",
                )
            last = b
        if any(not isinstance(c, int) or not 0 <= c < len(pairs) for c in clo.chosen):
            raise _Bad("closure.chosen", f"an index outside the {len(pairs)} units")
        if len(set(clo.chosen)) != len(clo.chosen):
            raise _Bad("closure.chosen", "holds a unit twice")
        if any(c not in set(clo.chosen) for c in clo.protected_units):
            raise _Bad("closure.protected_units", "an index that is not a chosen unit")
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

    for model, ref in ex.references.items():
        for name in (
            "prompt_loss",
            "response_loss",
            "response_attention",
            "prompt_received",
            "response_received",
            "prompt_grad",
            "response_grad",
        ):
            arr = getattr(ref, name)
            if arr is not None:
                _array(f"references.{model}.{name}", arr, None, first_dim=n_p if name.startswith("prompt") else n_r)


def _closure_ok(clo, t: int, kinds: bytes) -> bool:
    """The closure checks of :func:`_check` at once, on Python ints (True: all hold); on False the caller
    runs the step-by-step checks, which say which one fails."""
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
    chosen = clo.chosen
    if chosen and not _ascending_within(chosen, len(starts)):  # close writes them ascending
        if min(chosen) < 0 or max(chosen) >= len(starts) or len(set(chosen)) != len(chosen):
            return False
        chosen = sorted(chosen)
    if clo.protected_units and not set(clo.protected_units) <= set(chosen):
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


# -- the same checks at once, for the common case where they all hold ------------------------------------

#: the exponent bits of each float dtype, as the unsigned integer of its width: a value is finite exactly
#: when they are not all set
_EXPONENT: dict[str, tuple[np.dtype, int]] = {
    "float16": (np.dtype("<u2"), 0x7C00),
    "float32": (np.dtype("<u4"), 0x7F800000),
    "float64": (np.dtype("<u8"), 0x7FF0000000000000),
}
_KIND_BYTES = bytes(range(EOS + 1))


def _finite_ok(arr: Any, shape: list) -> bool:
    """``arr`` is a float Array of ``shape`` whose bytes fill it, with every value finite (what
    ``_array(..., finite=True)`` accepts, or less: a NaN-free ``no_nan`` array holding an infinity gets False
    here and goes to the slow checks)."""
    return _all_finite(((arr, shape),))


def _all_finite(arrays) -> bool:
    """:func:`_finite_ok` for every ``(array, shape)`` of ``arrays``, with one numpy check per dtype."""
    data: dict[str, list[bytes]] = {}
    for arr, shape in arrays:
        if type(arr) is not Array or arr.shape != shape:
            return False
        exp = _EXPONENT.get(arr.dtype)
        if exp is None or len(arr.data) != math.prod(shape) * exp[0].itemsize:
            return False
        data.setdefault(arr.dtype, []).append(arr.data)
    for dtype, chunks in data.items():
        uint, bits = _EXPONENT[dtype]
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if raw and int((np.frombuffer(raw, dtype=uint) & bits).max()) == bits:
            return False
    return True


def _on_side(values: list, kinds: bytes, kind: int) -> bool:
    """``values`` are distinct positions whose kind is ``kind``."""
    if not values:
        return True
    if _ascending_within(values, len(kinds)):  # as select writes them: distinct and within the tokens
        return _pick(kinds, values).count(kind) == len(values)
    if min(values) < 0 or max(values) >= len(kinds) or len(set(values)) != len(values):
        return False
    return all(map(kind.__eq__, map(kinds.__getitem__, values)))


def _fast_ok(ex: Example, stage: str) -> bool:
    """True when every check of :func:`_check_each` holds, found with few Python and numpy calls; False
    when one may fail (then :func:`_check_each` runs, and names it). Never True for a record that
    :func:`_check_each` refuses: the tests check this on every kind of broken record."""
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
    need = STAGES.index(stage) if stage in STAGES else 0
    if (need >= 1 and ex.scores is None) or (need >= 2 and ex.selection is None) or (need >= 3 and ex.closure is None):
        return False

    arrays: list[tuple[Array, list[int]]] = []  # (array, shape) of every float array: checked together at the end
    s = ex.scores
    if s is not None:
        arrays += ((s.a, [n_r]), (s.c, [n_r]), (s.A, [n_r, n_p]))
        if s.loss is not None:
            arrays.append((s.loss, [n_r]))
        if s.B is not None:
            arrays.append((s.B, [n_r, n_p]))

    sel = ex.selection
    if sel is not None:
        if not (0 <= sel.b_p <= t and 0 <= sel.b_r <= t):
            return False
        keep_p, keep_r = sel.prompt_keep, sel.response_keep
        if len(keep_p) != min(sel.b_p, n_p) or len(keep_r) != min(sel.b_r, n_r):
            return False
        if not (_on_side(keep_p, kinds, PROMPT) and _on_side(keep_r, kinds, RESPONSE)):
            return False
        arrays.append((sel.response_scores, [n_r]))
        for protected, kept in ((sel.protected_prompt, keep_p), (sel.protected_response, keep_r)):
            if protected and (len(set(protected)) != len(protected) or not set(protected) <= set(kept)):
                return False
        for rho in (sel.achieved_rho_p, sel.achieved_rho_r):
            if rho is not None and not 0.0 <= rho <= 1.0:
                return False
        if sel.response_weights is not None:  # (1.3) finite (with the others below) and > 0
            arrays.append((sel.response_weights, [len(keep_r)]))
            if not (sel.response_weights.numpy("float64") > 0).all():
                return False

    if ex.closure is not None and not _closure_ok(ex.closure, t, kinds):
        return False
    return not ex.references and _all_finite(arrays)  # references' arrays: the slow checks


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
