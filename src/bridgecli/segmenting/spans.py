"""The span contract every segmenter meets, and the helpers that make spans.

A segmenter returns sorted, non-overlapping ``[start, end)`` character spans of a response, each
non-empty and stripped of surrounding whitespace (:func:`validate_spans` checks this). Each builds
raw spans and hands them to :func:`finish`, the one place that clamps, strips, sorts and merges them.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

Span = tuple[int, int]


def strip_span(text: str, start: int, end: int) -> Optional[Span]:
    """Shrink ``[start, end)`` to exclude surrounding whitespace; None if nothing is left."""
    start, end = max(0, start), min(len(text), end)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def finish(text: str, spans: Iterable[Span]) -> list[Span]:
    """Strip, drop empty, sort and merge overlapping spans: the output contract of every segmenter."""
    stripped = sorted(s for s in (strip_span(text, a, b) for a, b in spans) if s is not None)
    out: list[Span] = []
    for start, end in stripped:
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def shift(spans: Iterable[Span], offset: int) -> list[Span]:
    return [(a + offset, b + offset) for a, b in spans]


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def lines(text: str) -> list[Span]:
    """Every line of ``text`` as ``[start, end)`` without its line break (``\\n``, ``\\r\\n``, ``\\r``)."""
    out, start = [], 0
    for m in _LINE_BREAK.finditer(text):
        out.append((start, m.start()))
        start = m.end()
    out.append((start, len(text)))
    return out


def nonblank_lines(text: str) -> list[Span]:
    return [s for s in (strip_span(text, a, b) for a, b in lines(text)) if s is not None]


def validate_spans(text: str, spans: list[Span]) -> None:
    """Raise ValueError unless ``spans`` meet the segmenter contract for ``text``: in range,
    non-empty, sorted, non-overlapping and not whitespace-only."""
    prev_end = 0
    for i, span in enumerate(spans):
        start, end = span
        if not 0 <= start < end <= len(text):
            raise ValueError(f"span {i} {span} is empty or outside [0, {len(text)}]")
        if start < prev_end:
            raise ValueError(f"span {i} {span} overlaps or precedes the span before it")
        if text[start:end].isspace():
            raise ValueError(f"span {i} {span} holds only whitespace")
        prev_end = end
