"""Protected tokens: the tokens a user wants always kept (prompt) or always supervised (response).

A protection is a list of patterns; each is a named preset or a Python regular expression (compiled
with ``re.MULTILINE``, so ``^`` and ``$`` anchor at line ends). A token is protected when its
characters overlap a match. Pure functions of a text and its tokens' offsets (and of an example's:
:func:`protected_sets`, which ``select`` and ``select --budget global`` share).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..format.records import Example

Span = tuple[int, int]

_ANSWER_LINE = re.compile(r"^[ \t]*(####[^\r\n]*)", re.MULTILINE)
_BOXED = re.compile(r"\\boxed\s*\{")


def boxed_spans(text: str) -> list[Span]:
    """Every ``\\boxed{...}`` with balanced braces (braces after a backslash are text); an unclosed one
    is left out."""
    out = []
    for m in _BOXED.finditer(text):
        depth = 0
        for i in range(m.end() - 1, len(text)):
            ch = text[i]
            if ch in "{}" and text[i - 1] != "\\":
                depth += 1 if ch == "{" else -1
                if depth == 0:
                    out.append((m.start(), i + 1))
                    break
    return out


def answer_spans(text: str) -> list[Span]:
    """The final answer: the last GSM8K ``#### N`` line (from ``####`` to the line's end, trailing
    spaces left out) and the last MATH ``\\boxed{...}``; either may be absent."""
    out = []
    lines = [m.span(1) for m in _ANSWER_LINE.finditer(text)]
    if lines:
        s, e = lines[-1]
        while e > s and text[e - 1].isspace():
            e -= 1
        out.append((s, e))
    boxed = boxed_spans(text)
    if boxed:
        out.append(boxed[-1])
    return sorted(out)


_DIGITS = re.compile(r"\d+")

#: named patterns: name -> (what it matches, finder)
PRESETS: dict[str, tuple[str, Callable[[str], list[Span]]]] = {
    "answer": ("the final answer: the last GSM8K '#### N' line and the last MATH \\boxed{...}", answer_spans),
    "digits": ("every run of digits (\\d+)", lambda text: [m.span() for m in _DIGITS.finditer(text)]),
}


def _spans_of(rx: re.Pattern[str]) -> Callable[[str], list[tuple[int, int]]]:
    """The non-empty match spans of ``rx`` in a text."""
    return lambda text: [m.span() for m in rx.finditer(text) if m.end() > m.start()]


def compile_patterns(patterns: Sequence[str], flag: str) -> list[Callable[[str], list[Span]]]:
    """Finders for ``patterns`` (presets by name, else regular expressions). A bad regular expression
    raises ValueError naming ``flag``."""
    out = []
    for p in patterns:
        if p in PRESETS:
            out.append(PRESETS[p][1])
            continue
        try:
            rx = re.compile(p, re.MULTILINE)
        except re.error as err:
            raise ValueError(f"{flag} {p!r} is not a valid regular expression ({err})") from None
        out.append(_spans_of(rx))
    return out


def protected_tokens(text: str, token_spans, finders: Sequence[Callable[[str], list[Span]]]) -> np.ndarray:
    """Ascending indices of the tokens (``token_spans`` [k, 2], offsets into ``text``) whose characters
    overlap a match of any finder. Empty matches protect nothing."""
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    hit = np.zeros(token_spans.shape[0], dtype=bool)
    for find in finders:
        for s, e in find(text):
            hit |= (np.minimum(token_spans[:, 1], e) - np.maximum(token_spans[:, 0], s)) > 0
    return np.flatnonzero(hit).astype(np.int64)


def region(text: str, spans) -> tuple[str, np.ndarray]:
    """The text from the first token's start to the last token's end, and the spans shifted into it
    (so that a prompt and a response are each read on their own text)."""
    spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    if spans.shape[0] == 0:
        return "", spans
    lo, hi = int(spans[:, 0].min()), int(spans[:, 1].max())
    return text[lo:hi], spans - lo


_NONE = np.zeros(0, dtype=np.int64)
_NONE.flags.writeable = False  # shared by every example without protected tokens


def protected_sets(example: Example, finders_p, finders_r) -> tuple[np.ndarray, np.ndarray]:
    """Indices into the eligible prompt / response positions of the tokens the patterns protect; each
    side's patterns run on that side's own text (first token's start to last token's end)."""
    if not finders_p and not finders_r:
        return _NONE, _NONE
    spans = example.tokens.spans()
    out = []
    for finders, pos in (
        (finders_p, example.tokens.prompt_positions()),
        (finders_r, example.tokens.response_positions()),
    ):
        if not finders or len(pos) == 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        text, shifted = region(example.text, spans[pos])
        out.append(protected_tokens(text, shifted, finders))
    return out[0], out[1]
