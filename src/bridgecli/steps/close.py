"""``bridge close``: structure-aware projection of the response selection onto whole units."""

from __future__ import annotations

import msgspec
import numpy as np

from ..core.closure import fill_cuts, project_cuts, unit_cuts
from ..errors import FormatError, PluginError, UsageError
from ..format.records import Closure, Example, Header
from ..format.spec import MAX_RESULT
from ..optionspec import check, recorded
from ..registry import get
from .common import MapArgs, map_stream, map_stream_parallel, selection_of, step_record
from .options import CloseOptions


def response_text(example: Example) -> tuple[str, int]:
    """The response content and its character offset in ``example.text``."""
    resp = example.tokens.response_positions()
    spans = example.tokens.spans()
    start, end = int(spans[resp[0], 0]), int(spans[resp[-1], 1])
    return example.text[start:end], start


def close_example(example: Example, segment, name: str, alpha: float, fill: bool = False) -> Example:
    """The closure of one selected example; with ``fill``, the budget the knapsack leaves is spent
    (:func:`~bridgecli.core.closure.fill_cuts`)."""
    sel = selection_of(example)
    resp = example.tokens.response_positions()
    if len(resp) == 0:
        closure = Closure(segmenter=name, alpha=alpha, units=[], chosen=[], supervise=[])
        return msgspec.structs.replace(example, closure=closure)
    all_spans = example.tokens.spans()
    offset = int(all_spans[resp[0], 0])  # response_text's, with the spans computed once
    text = example.text[offset : int(all_spans[resp[-1], 1])]
    try:
        spans = [(int(s), int(e)) for s, e in segment(text)]
    except Exception as exc:
        raise PluginError(f"segmenter '{name}' failed: {exc}", record=example.index) from None
    token_spans = all_spans[resp] - offset
    cuts = unit_cuts(token_spans, spans, text)  # unit k: response tokens cuts[k] .. cuts[k + 1] - 1
    # units holding a response token the selection protected (select --protect-response) are always chosen
    protected = (
        np.searchsorted(resp, np.asarray(sel.protected_response, dtype=np.int64)) if sel.protected_response else None
    )
    # a budget past the response changes nothing, and must not size the knapsack's table
    scores = sel.response_scores.numpy("float64")
    if not (np.abs(scores) <= MAX_RESULT).all():  # the reader refuses them; a Python caller may not have read them
        raise FormatError(
            "response scores that are NaN, infinite or beyond float32's range (+-3.4e38) cannot be projected",
            record=example.index,
            field="selection.response_scores",
        )
    chosen, forced = project_cuts(cuts, scores, min(sel.b_r, len(resp)), alpha, protected)
    filled: list[int] = []
    if fill:
        more, tokens = fill_cuts(cuts, scores, sel.b_r, alpha, chosen)
        chosen = sorted(chosen + more)
        filled = resp[tokens].tolist() if tokens else []
    positions = resp.tolist()
    flat_units: list[int] = []
    for a, b in zip(cuts, cuts[1:]):
        flat_units += (positions[a], positions[b - 1] + 1)
    supervise = []
    for k in chosen:  # ascending units of ascending tokens: the supervised positions come out sorted
        supervise += positions[cuts[k] : cuts[k + 1]]
    if filled:
        supervise = sorted(supervise + filled)
    if sel.response_weights is not None and supervise != sel.response_keep:
        # the weights belong to the drawn tokens: a closure that keeps exactly those (a whole example) keeps them
        raise UsageError(
            f"the selection ('{sel.method}') carries per-token loss weights: closing it onto whole units "
            "would drop them",
            record=example.index,
            hint="compact the selection directly (bridge compact)",
        )
    # the closure's fields in order: segmenter, alpha, units, chosen, supervise, protected_units, filled
    closure = Closure(name, alpha, flat_units, chosen, supervise, forced, filled)
    return msgspec.structs.replace(example, closure=closure)


def run_close(opts: CloseOptions) -> int:
    check(opts)
    entry = get("segmenter", opts.segmenter)
    params = recorded(opts, plugin=entry.plugin)

    def fn(ex: Example, header: Header) -> Example:
        return close_example(ex, entry.obj, opts.segmenter, opts.alpha, opts.fill)

    kwargs: MapArgs = {
        "step": step_record("close", params),
        "stage": "closure",
        "needs": "selection",
        "hint": "run `bridge select` first",
        "fn": fn,
        "label": "closing",
    }
    if opts.workers > 1:
        return map_stream_parallel(opts.inp, opts.out, workers=opts.workers, **kwargs)[0]
    return map_stream(opts.inp, opts.out, **kwargs)
