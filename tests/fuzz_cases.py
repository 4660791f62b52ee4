"""Crafted stream records for the stream readers: consistent streams made by the real steps, the same
broken in one field of one record (or in the bytes after the end record), and consistent streams whose
numbers sit at the format's bounds.

A *broken* case keeps every type right (so the checksums and the decoder accept it) but makes a record
inconsistent, or adds bytes after the end record; ``select``, ``close`` and ``compact`` must each end in
a ``FormatError`` (exit 3) with no output: never another exception (a traceback), never success (an
output computed from a record that makes no sense). An *extreme* case is a consistent stream whose
scores and references hold values at +-2^48 (the largest the format allows, ``spec.MAX_QUANTITY``):
``select`` with every selector whose inputs the stream holds, then ``close`` and ``compact``, must each
succeed, and what they write must read back (the reader refuses NaN, infinities and values out of range).

tests/test_fuzz_records.py and tests/test_validate_fast.py drive these cases from hypothesis;
bench/fuzz/records.py runs 10,000 of them and records the counts.
"""

from __future__ import annotations

import random
import struct
import time
from collections import Counter
from pathlib import Path
from typing import Callable

import msgspec
import numpy as np
import zstandard

from bridgecli.errors import BridgeError, FormatError
from bridgecli.format import (
    Array,
    Example,
    Header,
    ModelInfo,
    Scores,
    Tokens,
    open_writer,
    read_all,
)
from bridgecli.format.records import Reference
from bridgecli.format.spec import EOS, MAX_QUANTITY, MAX_RESULT, PROMPT, RESPONSE, TEMPLATE

STAGE_OF = {"tokens": 0, "scores": 1, "selection": 2, "closure": 3}
HEADER = Header(stage="scores", producer="fuzz", created="2026-01-01T00:00:00+00:00",
                model=ModelInfo(source="fuzz", fingerprint="sha256:00", tokenizer_fingerprint="sha256:11"))
WORDS = ("alpha", "beta", "gamma.", "delta", "eps!", "zeta", "eta?", "theta", "iota.", "kappa")
REFERENCE_FIELDS = ("prompt_loss", "response_loss", "response_attention", "prompt_received", "response_received",
                    "prompt_grad", "response_grad")
#: the selectors that read the references of :func:`scored_example` (names ``base`` and ``warmup``)
REFERENCE_METHODS = ("rho1", "tokencleaning", "sstoken", "llmlingua1", "llm+tc", "tokenseek-approx")
SURROGATE_METHODS = ("bridge", "one-pass", "independent", "random")


# -- consistent streams -----------------------------------------------------------------------------

def _reference(gen: np.random.Generator, name: str, n_p: int, n_r: int) -> Reference:
    return Reference(model=name, fingerprint="sha256:22",
                     prompt_loss=Array.of(gen.random(n_p) * 5), response_loss=Array.of(gen.random(n_r) * 5),
                     response_attention=Array.of(gen.random(n_r)), prompt_received=Array.of(gen.random(n_p) * 3),
                     response_received=Array.of(gen.random(n_r) * 3), prompt_grad=Array.of(gen.random(n_p) * 10),
                     response_grad=Array.of(gen.random(n_r) * 10))


def scored_example(rng: random.Random, i: int, *, interactions: bool = False, references: bool = False) -> Example:
    """Template tokens, n_p prompt tokens, a template separator, n_r response tokens, EOS; offsets into
    ``text``; scores of the right shapes (with an interaction matrix B, and the references ``base`` and
    ``warmup``, when asked)."""
    kinds: list[int] = [TEMPLATE] * rng.randint(0, 2) + [PROMPT] * rng.randint(0, 6) + [TEMPLATE] \
        + [RESPONSE] * rng.randint(1, 9) + [EOS]
    text, offsets = "", []
    for k in kinds:
        if k == TEMPLATE or k == EOS:
            offsets += [len(text), len(text)]
            continue
        word = rng.choice(WORDS) + " "
        offsets += [len(text), len(text) + len(word) - 1]
        text += word
    n_p, n_r = kinds.count(PROMPT), kinds.count(RESPONSE)
    gen = np.random.default_rng(rng.getrandbits(32))
    scores = Scores(scorer="bridge", a=Array.of(gen.normal(size=n_r)), c=Array.of(gen.random(n_r)),
                    A=Array.of(gen.random((n_r, n_p)), "float16"), loss=Array.of(gen.random(n_r) * 3),
                    B=Array.of(gen.normal(size=(n_r, n_p)) * 0.1) if interactions else None)
    refs = {name: _reference(gen, name, n_p, n_r) for name in ("base", "warmup")} if references else {}
    return Example(id=f"ex-{i}", index=i, text=text,
                   tokens=Tokens(input_ids=[rng.randint(0, 49151) for _ in kinds], kinds=bytes(kinds),
                                 offsets=offsets),
                   scores=scores, references=refs)


def _protect(rng: random.Random) -> tuple[list, list]:
    """The finders of ``select --protect-prompt/--protect-response``, for a third of the streams."""
    from bridgecli.core.protect import compile_patterns

    if rng.random() < 2 / 3:
        return [], []
    return (compile_patterns([r"alpha|beta"], "--protect-prompt"),
            compile_patterns([r"gamma|delta|eta"], "--protect-response"))


def consistent_stream(rng: random.Random, stage: str) -> list[Example]:
    """2-4 examples at ``stage`` (scores, selection or closure), made by the real steps' functions; a
    quarter of the streams carry an interaction matrix, a third references, a third protected tokens."""
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example
    from bridgecli.steps.select import select_example

    interactions, references = rng.random() < 0.25, rng.random() < 1 / 3
    examples = [scored_example(rng, i, interactions=interactions, references=references)
                for i in range(rng.randint(2, 4))]
    return _steps(rng, examples, stage, select_example, close_example, get)


def _steps(rng, examples, stage, select_example, close_example, get) -> list[Example]:
    if STAGE_OF[stage] >= 2:
        selector = get("selector", "bridge").obj
        rho_p, rho_r = rng.choice((0.0, 0.3, 0.75, 1.0)), rng.choice((0.0, 0.3, 0.75, 1.0))
        protect = _protect(rng)
        examples = [select_example(e, selector, "bridge", rho_p, rho_r, {"rounds": 2}, protect) for e in examples]
    if STAGE_OF[stage] >= 3:
        segmenter = get("segmenter", "sentence").obj
        examples = [close_example(e, segmenter, "sentence", rng.choice((0.0, 0.5))) for e in examples]
    return examples


# -- bad numbers ------------------------------------------------------------------------------------

def bad_number(rng: random.Random, dtype: str, kind: str) -> float:
    """A value a stream may not hold in a ``dtype`` array: ``nonfinite`` (NaN or an infinity), ``huge``
    (finite, beyond +-2^48 in scores and references, up to the dtype's largest value) or ``negative``
    (below 0 where the quantity is a loss, an attention mass or a gradient norm: from the issue's -0.001 to
    -2^48)."""
    sign = rng.choice((-1.0, 1.0))
    if kind == "nonfinite":
        return rng.choice((float("nan"), sign * float("inf")))
    if kind == "negative":
        return -rng.choice((0.001, 1.0, float(2.0 ** rng.uniform(-14, 12)), min(MAX_QUANTITY, float(np.finfo(dtype).max))))
    top = float(np.finfo(dtype).max)
    exponent = rng.uniform(np.log2(MAX_QUANTITY) + 0.01, np.log2(top))
    return sign * min(float(2.0 ** exponent), top)


def _with_value(arr: Array, rng: random.Random, kind: str) -> Array:
    """``arr`` with one value (at a random index) made bad; a ``huge`` value needs a wider dtype than float16,
    so such an array becomes float32 (or float64)."""
    dtype = arr.dtype if kind in ("nonfinite", "negative") or arr.dtype != "float16" else "float32"
    if kind == "huge" and rng.random() < 0.5:
        dtype = "float64"  # values near float64's largest: the issue's case
    values = arr.numpy("float64").reshape(-1).copy()
    values[rng.randrange(len(values))] = bad_number(rng, dtype, kind)
    return Array.of(values.reshape(arr.shape), dtype)


def _result_value(rng: random.Random, kind: str) -> float:
    """A value a selection's ``response_scores`` or ``u_sur`` may not hold: NaN, an infinity, or a finite
    value beyond float32's range."""
    if kind == "nonfinite":
        return rng.choice((float("nan"), rng.choice((-1.0, 1.0)) * float("inf")))
    return rng.choice((-1.0, 1.0)) * float(2.0 ** rng.uniform(np.log2(MAX_RESULT) + 0.01, 1023.9))


# -- mutations: each keeps every type right and makes the record inconsistent -------------------------

def _kinds(ex: Example) -> np.ndarray:
    return np.frombuffer(ex.tokens.kinds, dtype=np.uint8)


def _tok(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, tokens=msgspec.structs.replace(ex.tokens, **changes))


def _scores(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, scores=msgspec.structs.replace(ex.scores, **changes))


def _sel(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, selection=msgspec.structs.replace(ex.selection, **changes))


def _clo(ex: Example, **changes) -> Example:
    return msgspec.structs.replace(ex, closure=msgspec.structs.replace(ex.closure, **changes))


def _set(values: list[int], k: int, value: int) -> list[int]:
    out = list(values)
    out[k] = value
    return out


def _other_response(ex: Example) -> int | None:
    """A response position outside the chosen units, if there is one."""
    clo = ex.closure
    chosen = set()
    for c in clo.chosen:
        chosen.update(range(clo.units[2 * c], clo.units[2 * c + 1]))
    rest = [int(p) for p in np.flatnonzero(_kinds(ex) == RESPONSE) if int(p) not in chosen]
    return rest[0] if rest else None


def _supervise_wrong(ex: Example, rng: random.Random) -> Example:
    extra = _other_response(ex)
    if extra is not None:
        return _clo(ex, supervise=sorted([*ex.closure.supervise, extra]))
    if ex.closure.supervise:
        return _clo(ex, supervise=ex.closure.supervise[:-1])
    return _clo(ex, supervise=[int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])


def _response_keep_count(ex: Example, rng: random.Random) -> Example:
    keep = ex.selection.response_keep
    if keep:
        return _sel(ex, response_keep=keep[:-1])
    return _sel(ex, response_keep=[int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])


def _shorter_text(ex: Example, rng: random.Random) -> Example:
    end = max(ex.tokens.offsets)
    return msgspec.structs.replace(ex, text=ex.text[:end - 1 - rng.randint(0, end - 1)])


def _no_response(ex: Example, rng: random.Random) -> Example:
    """Every response token turned into a template token, and every part made to fit that (as the steps
    before format 1.2's check wrote it: empty response arrays, no kept or supervised response token): the
    one rule left broken is "at least one response token"."""
    kinds = bytes(TEMPLATE if k == RESPONSE else k for k in ex.tokens.kinds)
    n_p = kinds.count(PROMPT)
    out = _tok(ex, kinds=kinds)
    if ex.scores is not None:
        out = _scores(out, a=Array.of(np.zeros(0)), c=Array.of(np.zeros(0)), A=Array.of(np.zeros((0, n_p)), "float16"),
                      loss=Array.of(np.zeros(0)), B=None if ex.scores.B is None else Array.of(np.zeros((0, n_p))))
    if ex.references:
        refs = {name: msgspec.structs.replace(ref, **{f: Array.of(np.zeros(0)) for f in REFERENCE_FIELDS
                                                     if f.startswith("response")})
                for name, ref in ex.references.items()}
        out = msgspec.structs.replace(out, references=refs)
    if ex.selection is not None:
        out = _sel(out, response_keep=[], response_scores=Array.of(np.zeros(0)), protected_response=[],
                   achieved_rho_r=None)
    if ex.closure is not None:
        out = _clo(out, units=[], chosen=[], supervise=[], protected_units=[])
    return out


def _response_reference(ex: Example, rng: random.Random, kind: str) -> Example:
    """One value of one reference array made bad (the example gets references if it has none)."""
    n_p = int(ex.tokens.kinds.count(PROMPT))
    n_r = int(ex.tokens.kinds.count(RESPONSE))
    refs = dict(ex.references) or {"base": _reference(np.random.default_rng(rng.getrandbits(32)), "base", n_p, n_r)}
    name = rng.choice(sorted(refs))
    fields = [f for f in REFERENCE_FIELDS if getattr(refs[name], f) is not None and getattr(refs[name], f).shape[0]]
    field = rng.choice(fields)
    refs[name] = msgspec.structs.replace(refs[name], **{field: _with_value(getattr(refs[name], field), rng, kind)})
    return msgspec.structs.replace(ex, references=refs)


def _interactions(ex: Example, rng: random.Random, kind: str) -> Example:
    """One value of B made bad (the example gets a B if it has none)."""
    s = ex.scores
    B = s.B if s.B is not None else Array.of(np.zeros(tuple(s.A.shape)))
    return _scores(ex, B=_with_value(B, rng, kind))


def _response_scores(ex: Example, rng: random.Random, kind: str) -> Example:
    values = ex.selection.response_scores.numpy("float64").copy()
    values[rng.randrange(len(values))] = _result_value(rng, kind)
    # float64: float32 holds no finite value beyond its range (it would round it to an infinity)
    return _sel(ex, response_scores=Array.of(values, "float64" if kind == "huge" else rng.choice(("float32", "float64"))))


def _u_sur(ex: Example, rng: random.Random, kind: str) -> Example:
    values = list(ex.selection.u_sur) or [0.0]
    values[rng.randrange(len(values))] = _result_value(rng, kind)
    return _sel(ex, u_sur=values)


def _keep_unsorted(ex: Example, rng: random.Random) -> Example:
    keep = ex.selection.response_keep
    return _sel(ex, response_keep=keep[::-1], protected_response=sorted(ex.selection.protected_response))


def _protected_not_kept(ex: Example, rng: random.Random) -> Example:
    prompt = [int(p) for p in np.flatnonzero(_kinds(ex) == PROMPT) if int(p) not in set(ex.selection.prompt_keep)]
    return _sel(ex, protected_prompt=sorted([*ex.selection.protected_prompt, rng.choice(prompt)]))


def _achieved_wrong(ex: Example, rng: random.Random) -> Example:
    n = ex.tokens.kinds.count(RESPONSE)
    k = len(ex.selection.response_keep)
    other = k + 1 if k < n else k - 1
    return _sel(ex, achieved_rho_r=other / n)


def _achieved_empty_side(ex: Example, rng: random.Random) -> Example:
    return _sel(ex, achieved_rho_p=rng.choice((0.0, 1.0)))


def _protected_units_duplicate(ex: Example, rng: random.Random) -> Example:
    clo = ex.closure
    unit = rng.choice(clo.protected_units or clo.chosen)
    return _clo(ex, protected_units=sorted([*clo.protected_units, unit]))


def _protected_units_wrong(ex: Example, rng: random.Random) -> Example:
    """A chosen unit added to, or a protected unit dropped from, ``protected_units``."""
    clo = ex.closure
    extra = [c for c in clo.chosen if c not in set(clo.protected_units)]
    if extra and (not clo.protected_units or rng.random() < 0.5):
        return _clo(ex, protected_units=sorted([*clo.protected_units, rng.choice(extra)]))
    units = list(clo.protected_units)
    del units[rng.randrange(len(units))]
    return _clo(ex, protected_units=units)


def _unit_dropped(ex: Example, rng: random.Random) -> Example:
    """The last unit left out (with its index in chosen, supervise and protected_units): its response tokens
    lie in no unit."""
    clo = ex.closure
    last = len(clo.units) // 2 - 1
    start, end = clo.units[-2], clo.units[-1]
    return _clo(ex, units=clo.units[:-2], chosen=[c for c in clo.chosen if c != last],
                supervise=[p for p in clo.supervise if not start <= p < end],
                protected_units=[u for u in clo.protected_units if u != last])


Mutation = Callable[[Example, random.Random], Example]

#: name -> (the stage a stream needs for it, the mutation)
MUTATIONS: dict[str, tuple[str, Mutation]] = {
    # tokens
    "kinds_short": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds[:-1])),
    "kinds_long": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds + bytes([RESPONSE]))),
    "kinds_unknown": ("scores", lambda ex, rng: _tok(ex, kinds=bytes(_set(list(ex.tokens.kinds),
                                                                      rng.randrange(len(ex.tokens.kinds)),
                                                                      rng.randint(4, 255))))),
    "kinds_all_eos": ("scores", lambda ex, rng: _tok(ex, kinds=bytes([EOS] * len(ex.tokens.kinds)))),
    "kinds_no_eos": ("scores", lambda ex, rng: _tok(ex, kinds=ex.tokens.kinds[:-1] + bytes([TEMPLATE]))),
    "kinds_two_eos": ("scores", lambda ex, rng: _tok(ex, kinds=bytes([EOS]) + ex.tokens.kinds[1:])),
    "no_response_token": ("scores", _no_response),
    "offsets_short": ("scores", lambda ex, rng: _tok(ex, offsets=ex.tokens.offsets[:-2 * rng.randint(1, 2)])),
    "offsets_beyond_text": ("scores", lambda ex, rng: _tok(ex, offsets=_set(
        ex.tokens.offsets, 2 * rng.randrange(len(ex.tokens.input_ids)) + 1, len(ex.text) + rng.randint(1, 2**40)))),
    "offsets_negative": ("scores", lambda ex, rng: _tok(ex, offsets=_set(
        ex.tokens.offsets, 2 * rng.randrange(len(ex.tokens.input_ids)), -rng.randint(1, 2**62)))),
    "text_shorter_than_offsets": ("scores", _shorter_text),
    "input_id_negative": ("scores", lambda ex, rng: _tok(ex, input_ids=_set(
        ex.tokens.input_ids, rng.randrange(len(ex.tokens.input_ids)), -rng.randint(1, 2**63)))),
    "input_id_huge": ("scores", lambda ex, rng: _tok(ex, input_ids=_set(
        ex.tokens.input_ids, rng.randrange(len(ex.tokens.input_ids)), rng.randint(2**31, 2**63 - 1)))),
    # scores
    "scores_missing": ("scores", lambda ex, rng: msgspec.structs.replace(ex, scores=None)),
    "a_wrong_length": ("scores", lambda ex, rng: _scores(ex, a=Array.of(np.zeros(ex.scores.a.shape[0]
                                                                               + rng.choice((-1, 1, 5)))))),
    "a_dtype_object": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="object", shape=ex.scores.a.shape,
                                                                      data=ex.scores.a.data))),
    "a_dtype_int": ("scores", lambda ex, rng: _scores(ex, a=Array.of(np.zeros(ex.scores.a.shape), "int32"))),
    "a_short_data": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="float32", shape=ex.scores.a.shape,
                                                                    data=ex.scores.a.data[:-1]))),
    "a_negative_shape": ("scores", lambda ex, rng: _scores(ex, a=Array(dtype="float32", shape=[-rng.randint(1, 9)],
                                                                        data=b""))),
    "A_transposed": ("scores", lambda ex, rng: _scores(ex, A=Array.of(np.zeros((ex.scores.A.shape[1] + 1,
                                                                                ex.scores.A.shape[0])), "float16"))),
    "A_huge_shape": ("scores", lambda ex, rng: _scores(ex, A=Array(dtype="float16", shape=[2**40, 2**40], data=b""))),
    "B_transposed": ("scores", lambda ex, rng: _scores(ex, B=Array.of(np.zeros((ex.scores.A.shape[1] + 1,
                                                                                ex.scores.A.shape[0]))))),
    "reference_wrong_shape": ("scores", lambda ex, rng: msgspec.structs.replace(ex, references={
        "base": Reference(model="base", response_loss=Array.of(np.zeros((ex.tokens.kinds.count(RESPONSE), 2))))})),
    # selection
    "selection_missing": ("selection", lambda ex, rng: msgspec.structs.replace(ex, selection=None)),
    "b_r_huge": ("selection", lambda ex, rng: _sel(ex, b_r=rng.randint(len(ex.tokens.input_ids) + 1, 2**62))),
    "b_p_negative": ("selection", lambda ex, rng: _sel(ex, b_p=-rng.randint(1, 2**62))),
    "prompt_keep_out_of_range": ("selection", lambda ex, rng: _sel(
        ex, prompt_keep=[*ex.selection.prompt_keep, len(ex.tokens.input_ids) + rng.randint(0, 2**40)])),
    "prompt_keep_response_position": ("selection", lambda ex, rng: _sel(
        ex, prompt_keep=[*ex.selection.prompt_keep, int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])])),
    "response_keep_prompt_side": ("selection", lambda ex, rng: _sel(
        ex, response_keep=[*ex.selection.response_keep, int(np.flatnonzero(_kinds(ex) == EOS)[0])])),
    "response_keep_duplicate": ("selection", lambda ex, rng: _sel(
        ex, response_keep=([*ex.selection.response_keep, ex.selection.response_keep[0]]
                           if ex.selection.response_keep else [int(np.flatnonzero(_kinds(ex) == RESPONSE)[0])] * 2))),
    "response_keep_count": ("selection", _response_keep_count),
    "response_keep_unsorted": ("selection", _keep_unsorted),
    "protected_prompt_not_kept": ("selection", _protected_not_kept),
    "response_scores_short": ("selection", lambda ex, rng: _sel(ex, response_scores=Array.of(
        np.zeros(ex.selection.response_scores.shape[0] - 1)))),
    "achieved_rho_out_of_range": ("selection", lambda ex, rng: _sel(ex, achieved_rho_r=1.0 + rng.random() + 1e-3)),
    "achieved_rho_wrong": ("selection", _achieved_wrong),
    "achieved_rho_empty_side": ("selection", _achieved_empty_side),
    # closure
    "closure_missing": ("closure", lambda ex, rng: msgspec.structs.replace(ex, closure=None)),
    "units_odd": ("closure", lambda ex, rng: _clo(ex, units=[*ex.closure.units, len(ex.tokens.input_ids)])),
    "unit_out_of_range": ("closure", lambda ex, rng: _clo(ex, units=_set(
        ex.closure.units, len(ex.closure.units) - 1, len(ex.tokens.input_ids) + rng.randint(1, 2**40)))),
    "unit_empty": ("closure", lambda ex, rng: _clo(ex, units=_set(ex.closure.units, 1, ex.closure.units[0]))),
    "unit_dropped": ("closure", _unit_dropped),
    "chosen_out_of_range": ("closure", lambda ex, rng: _clo(
        ex, chosen=[*ex.closure.chosen, len(ex.closure.units) // 2 + rng.randint(0, 9)])),
    "chosen_negative": ("closure", lambda ex, rng: _clo(ex, chosen=[*ex.closure.chosen, -rng.randint(1, 9)])),
    "supervise_out_of_range": ("closure", lambda ex, rng: _clo(
        ex, supervise=[*ex.closure.supervise, len(ex.tokens.input_ids) + rng.randint(0, 2**40)])),
    "supervise_not_the_chosen_units": ("closure", _supervise_wrong),
    "alpha_out_of_range": ("closure", lambda ex, rng: _clo(ex, alpha=rng.choice((float("nan"), -0.5, 1.5)))),
    "protected_units_duplicate": ("closure", _protected_units_duplicate),
    "protected_units_wrong": ("closure", _protected_units_wrong),
    # the record
    "id_empty": ("scores", lambda ex, rng: msgspec.structs.replace(ex, id="")),
    "index_negative": ("scores", lambda ex, rng: msgspec.structs.replace(ex, index=-rng.randint(1, 2**62))),
}

# numbers: NaN or an infinity, or a finite value beyond the format's bound, in every float field; a
# negative value where the quantity is never negative (a loss, an attention mass, a gradient norm)
for _kind in ("negative",):
    MUTATIONS.update({
        f"c_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, c=_with_value(ex.scores.c, rng, k))),
        f"A_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, A=_with_value(ex.scores.A, rng, k))),
        f"loss_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, loss=_with_value(ex.scores.loss, rng, k))),
        f"reference_{_kind}": ("scores", lambda ex, rng, k=_kind: _response_reference(ex, rng, k)),
    })
for _kind in ("nonfinite", "huge"):
    MUTATIONS.update({
        f"a_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, a=_with_value(ex.scores.a, rng, k))),
        f"c_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, c=_with_value(ex.scores.c, rng, k))),
        f"A_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, A=_with_value(ex.scores.A, rng, k))),
        f"B_{_kind}": ("scores", lambda ex, rng, k=_kind: _interactions(ex, rng, k)),
        f"loss_{_kind}": ("scores", lambda ex, rng, k=_kind: _scores(ex, loss=_with_value(ex.scores.loss, rng, k))),
        f"reference_{_kind}": ("scores", lambda ex, rng, k=_kind: _response_reference(ex, rng, k)),
        f"response_scores_{_kind}": ("selection", lambda ex, rng, k=_kind: _response_scores(ex, rng, k)),
        f"u_sur_{_kind}": ("selection", lambda ex, rng, k=_kind: _u_sur(ex, rng, k)),
    })

#: whole-stream mutations
STREAM_MUTATIONS = ("duplicate_id", "stage_unknown")


def _skippable(rng: random.Random) -> bytes:
    size = rng.randint(0, 40)
    return struct.pack("<II", 0x184D2A50 + rng.randrange(16), size) + rng.randbytes(size)


#: bytes after the end record: name -> the bytes (never whole frames without content, which may follow)
TRAILING: dict[str, Callable[[random.Random], bytes]] = {
    "trailing_byte": lambda rng: bytes([rng.randrange(256)]),
    "trailing_skippable_byte": lambda rng: bytes([0x50 + rng.randrange(16)]),
    "trailing_bytes": lambda rng: rng.randbytes(rng.randint(2, 64)),
    "trailing_skippable_cut_short": lambda rng: (lambda f: f[:rng.randrange(1, len(f))])(_skippable(rng)),
    "trailing_frame_cut_short": lambda rng: (lambda f: f[:rng.randrange(1, len(f))])(
        zstandard.ZstdCompressor(write_checksum=True).compress(rng.randbytes(rng.randint(0, 30)))),
    "trailing_frame_with_content": lambda rng: zstandard.ZstdCompressor().compress(rng.randbytes(rng.randint(1, 30))),
    "trailing_skippable_then_byte": lambda rng: _skippable(rng) + bytes([rng.randrange(256)]),
}
NAMES = sorted(MUTATIONS) + list(STREAM_MUTATIONS) + sorted(TRAILING)
#: the cases that must succeed: consistent streams at the format's bounds
EXTREME = "extreme_valid"


def _applies(name: str, ex: Example) -> bool:
    """Whether the mutation is sure to break this example (some need a part it may lack)."""
    n_p = ex.tokens.kinds.count(PROMPT)
    if name in ("unit_empty", "unit_out_of_range", "unit_dropped"):
        return len(ex.closure.units) >= 2
    if name == "text_shorter_than_offsets":
        return max(ex.tokens.offsets) > 0
    if name.startswith(("A_", "B_")) and name.endswith(("nonfinite", "huge", "negative")):
        return n_p > 0
    if name == "response_keep_unsorted":
        return len(ex.selection.response_keep) >= 2
    if name == "protected_prompt_not_kept":
        return len(ex.selection.prompt_keep) < n_p
    if name == "achieved_rho_empty_side":
        return n_p == 0
    if name == "protected_units_duplicate":
        return bool(ex.closure.chosen)
    if name == "protected_units_wrong":
        return bool(ex.closure.protected_units) or bool(ex.closure.chosen)
    return True


# -- running -----------------------------------------------------------------------------------------

def broken_stream(seed: int, name: str) -> tuple[Header, list[Example], str]:
    """A consistent stream with mutation ``name`` applied to one record: ``(header, examples, stage)`` (a
    trailing-bytes mutation leaves the records as they are: :func:`trailing_bytes` gives the bytes)."""
    rng = random.Random(seed)
    stage = MUTATIONS[name][0] if name in MUTATIONS else rng.choice(("scores", "selection", "closure"))
    stage = max(stage, rng.choice(("scores", "selection", "closure")), key=STAGE_OF.get)
    examples = consistent_stream(rng, stage)
    header = msgspec.structs.replace(HEADER, stage=stage)
    if name == "duplicate_id":
        k = rng.randrange(1, len(examples))
        examples[k] = msgspec.structs.replace(examples[k], id=examples[rng.randrange(k)].id)
    elif name == "stage_unknown":
        header = msgspec.structs.replace(header, stage=rng.choice(("", "score", "closed", "tokens ", "CLOSURE")))
    elif name in MUTATIONS:
        fn = MUTATIONS[name][1]
        candidates = [k for k, ex in enumerate(examples) if _applies(name, ex)]
        if not candidates:  # e.g. no unit to empty: make one example that has what it needs
            return broken_stream(seed + 1_000_003, name)
        k = rng.choice(candidates)
        examples[k] = fn(examples[k], rng)
    return header, examples, stage


def trailing_bytes(seed: int, name: str) -> bytes:
    """The bytes a trailing-bytes mutation puts after the end record (``b""`` for the others)."""
    return TRAILING[name](random.Random(seed ^ 0x5EED)) if name in TRAILING else b""


def extreme_stream(seed: int) -> tuple[Header, list[Example], str]:
    """A consistent stream whose scores and references hold values at their bounds: +-2^48, and 0 and 2^48
    for the quantities that are never negative (``A`` at float16's 0 and 65504, or float32 at 0 and 2^48),
    selected and closed by the real steps where its stage asks for it."""
    from bridgecli.registry import get
    from bridgecli.steps.close import close_example
    from bridgecli.steps.select import select_example

    rng = random.Random(seed)
    stage = rng.choice(("scores", "selection", "closure"))
    gen = np.random.default_rng(rng.getrandbits(32))

    def edge(shape, low=-MAX_QUANTITY) -> np.ndarray:  # every value at a bound, or a mix of those and ordinary ones
        values = gen.choice((low, MAX_QUANTITY), size=shape)
        ordinary = gen.normal(size=shape) if low < 0 else np.abs(gen.normal(size=shape))
        return values if rng.random() < 0.5 else np.where(gen.random(shape) < 0.5, values, ordinary)

    examples = []
    for i in range(rng.randint(2, 4)):
        ex = scored_example(rng, i, interactions=rng.random() < 0.5, references=True)
        s = ex.scores
        n_r, n_p = s.A.shape
        wide_A = rng.random() < 0.5
        # losses, attention masses and gradient norms are never negative: their bounds are 0 and 2^48
        A = Array.of(edge((n_r, n_p), 0.0), "float32") if wide_A else Array.of(
            gen.choice((0.0, 65504.0), size=(n_r, n_p)), "float16")
        refs = {name: msgspec.structs.replace(ref, **{
            f: Array.of(edge(getattr(ref, f).shape, 0.0), rng.choice(("float32", "float64")))
            for f in REFERENCE_FIELDS}) for name, ref in ex.references.items()}
        ex = msgspec.structs.replace(ex, references=refs, scores=msgspec.structs.replace(
            s, a=Array.of(edge(n_r)), c=Array.of(edge(n_r, 0.0)), A=A, loss=Array.of(edge(n_r, 0.0)),
            B=None if s.B is None else Array.of(edge((n_r, n_p)))))
        examples.append(ex)
    examples = _steps(rng, examples, stage, select_example, close_example, get)
    return msgspec.structs.replace(HEADER, stage=stage), examples, stage


def write(path: Path, header: Header, examples: list[Example], tail: bytes = b"") -> None:
    with open_writer(path, header) as writer:
        for ex in examples:
            writer.write(ex)
    if tail:
        with open(path, "ab") as fh:
            fh.write(tail)


def _methods(examples: list[Example], rng: random.Random) -> list[str]:
    """The selectors a case runs: bridge, and one that reads the references when the stream has them."""
    if all(ex.references for ex in examples):
        return ["bridge", rng.choice(REFERENCE_METHODS)]
    return ["bridge"]


def run_case(seed: int, name: str, folder: Path) -> dict:
    """Write the case's stream and run select, close and compact on it; the outcome of each. Every run of a
    broken case must end in exit 3 with no output; every run of an extreme case in exit 0 with an output
    that reads back (``contained``)."""
    from bridgecli.steps.close import CloseOptions, run_close
    from bridgecli.steps.compact import CompactOptions, run_compact
    from bridgecli.steps.select import SelectOptions, run_select

    from bridgecli import progress

    rng = random.Random(seed ^ 0xF00D)
    if name == EXTREME:
        header, examples, stage = extreme_stream(seed)
        tail = b""
        methods = list(SURROGATE_METHODS) + list(REFERENCE_METHODS)
    else:
        header, examples, stage = broken_stream(seed, name)
        tail = trailing_bytes(seed, name)
        methods = _methods(examples, rng)
    stream = folder / f"case-{seed}.bridge"
    write(stream, header, examples, tail)
    runs: dict[str, tuple[Callable, str]] = {}
    for method in methods:
        runs[f"select --method {method}"] = (lambda out, m=method: run_select(SelectOptions(
            inp=str(stream), out=str(out), rounds=2, method=m)), "stream")
    # the sampling that leans on the per-token loss (issue 40: a negative loss ended in a traceback)
    runs["select --preset importance-loss-resp"] = (lambda out: run_select(SelectOptions(
        inp=str(stream), out=str(out), preset="importance-loss-resp")), "stream")
    runs["close"] = (lambda out: run_close(CloseOptions(inp=str(stream), out=str(out))), "stream")
    # an extreme stream may keep no response token (--rho-r 0): no row to write is no failure there
    runs["compact"] = (lambda out: run_compact(CompactOptions(inp=str(stream), out=str(out),
                                                              allow_empty=name == EXTREME)), "rows")
    outcomes: dict[str, str] = {}
    quiet, progress.stderr.quiet = progress.stderr.quiet, True  # the steps' status lines are not news here
    try:
        _run_all(runs, stage, seed, folder, outcomes, expect_success=name == EXTREME)
    finally:
        progress.stderr.quiet = quiet
    stream.unlink()
    return {"seed": seed, "mutation": name, "stage": stage, "outcomes": outcomes}


def _run_all(runs: dict, stage: str, seed: int, folder: Path, outcomes: dict, expect_success: bool) -> None:
    for command, (run, kind) in runs.items():
        if not command.startswith("select") and STAGE_OF.get(stage, 0) < 2:
            continue  # close and compact refuse a stream without a selection anyway
        out = folder / f"out-{seed}-{command.replace(' ', '_')}"
        try:
            run(out)
            outcomes[command] = "exit 0"
        except FormatError as err:
            outcomes[command] = "exit 3" if "\n" not in str(err) else "exit 3, several lines"
        except BridgeError as err:
            outcomes[command] = f"exit {err.exit_code} ({type(err).__name__}: {err})"
        except Exception as exc:  # noqa: BLE001 - a traceback is what we are looking for
            outcomes[command] = f"traceback ({type(exc).__name__}: {exc})"
        meta = Path(str(out) + ".meta.json")
        if expect_success and outcomes[command] == "exit 0" and kind == "stream":
            try:
                read_all(out)  # what select and close wrote must read back: no NaN, no infinity, in range
            except FormatError as err:
                outcomes[command] = f"exit 0, an output that does not read back ({err})"
        elif not expect_success and (out.exists() or meta.exists()):
            outcomes[command] += ", left an output"
        for path in (out, meta):
            if path.exists():
                path.unlink()


def contained(case: dict) -> bool:
    """Every run of the case ended as it must: exit 3 and no output for a broken stream, exit 0 and an output
    that reads back for an extreme one."""
    want = "exit 0" if case["mutation"] == EXTREME else "exit 3"
    return bool(case["outcomes"]) and all(o == want for o in case["outcomes"].values())


def case_name(seed: int) -> str:
    """The case that seed ``seed`` runs: the mutations in turn, and every tenth an extreme valid stream."""
    if seed % 10 == 9:
        return EXTREME
    return NAMES[(seed - seed // 10) % len(NAMES)]


def run(cases: int, first_seed: int, folder: Path) -> dict:
    """``cases`` cases from seed ``first_seed`` on: the summary (counts, failures) that bench/fuzz/records.py
    records."""
    counts: Counter = Counter()
    runs: Counter = Counter()
    failures = []
    start = time.perf_counter()
    for k in range(cases):
        seed = first_seed + k
        name = case_name(seed)
        case = run_case(seed, name, folder)
        counts[name] += 1
        runs.update(case["outcomes"].values())
        if not contained(case):
            failures.append(case)
    broken = [c for c in failures if c["mutation"] != EXTREME]
    return {
        "cases": cases,
        "first_seed": first_seed,
        "command_runs": sum(runs.values()),
        "outcomes": dict(sorted(runs.items())),
        "mutations": len(NAMES),
        "per_mutation": dict(sorted(counts.items())),
        "tracebacks": sum(n for o, n in runs.items() if o.startswith("traceback")),
        "exit_0_on_a_broken_stream": sum(1 for c in broken for o in c["outcomes"].values() if o.startswith("exit 0")),
        "failures": len(failures),
        "first_failures": failures[:10],
        "seconds": round(time.perf_counter() - start, 1),
    }
