"""Segmenters of prose: sentences, reasoning steps (lines) and list items."""

from __future__ import annotations

import bisect
import re

from .spans import Span, finish, lines, nonblank_lines, strip_span

# A run of terminators, optionally closed by quotes/brackets, then whitespace or the line's end.
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")
_ANNOTATION = re.compile(r"<<[^<>\r\n]*>>")  # GSM8K calculator annotation
_ABBREVIATIONS = frozenset(
    {"e.g", "i.e", "cf", "vs", "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "approx", "fig", "eq"}
)
_ENUMERATOR = re.compile(r"\s*(?:\d+|[A-Za-z])")  # "1." / "a." opening a line is not a sentence


def _is_false_stop(text: str, line_start: int, stop: re.Match, protected: list[Span]) -> bool:
    i = bisect.bisect_right(protected, (stop.start(), len(text))) - 1
    if i >= 0 and protected[i][0] <= stop.start() < protected[i][1]:
        return True
    if stop.group() != ".":
        return False
    word_start = line_start
    for j in range(stop.start() - 1, line_start - 1, -1):
        if text[j].isspace():
            word_start = j + 1
            break
    if _ENUMERATOR.fullmatch(text, line_start, stop.start()):
        return True
    return text[word_start : stop.start()].lstrip("([\"'“‘").lower() in _ABBREVIATIONS


def sentence_spans(text: str) -> list[Span]:
    protected = [m.span() for m in _ANNOTATION.finditer(text)]
    spans = []
    for line_start, line_end in lines(text):
        start = line_start
        for stop in _SENTENCE_END.finditer(text, line_start, line_end):
            if not _is_false_stop(text, line_start, stop, protected):
                spans.append((start, stop.end()))
                start = stop.end()
        spans.append((start, line_end))
    return spans


def split_sentences(text: str) -> list[Span]:
    """Sentences: split after ``. ! ?`` followed by whitespace, and at every line end. Decimals,
    common abbreviations (e.g., i.e., Mr., ...), enumerators opening a line ("1.") and GSM8K
    ``<<...>>`` annotations do not end a sentence."""
    return finish(text, sentence_spans(text))


def split_steps(text: str) -> list[Span]:
    """Reasoning steps: one unit per non-blank line (so "#### 72" is its own unit); a response of
    a single line falls back to sentences."""
    steps = nonblank_lines(text)
    if len(steps) <= 1:
        return split_sentences(text)
    return finish(text, steps)


_ITEM_START = re.compile(
    r"[ \t]*(?:"
    r"[-*+•](?:[ \t]|$)"  # bullets
    r"|\d{1,3}[.)](?:[ \t]|$)"  # 1.  1)
    r"|\([A-Za-z0-9]{1,4}\)(?:[ \t]|$)"  # (a)  (iv)  (1)
    r"|[A-Za-z][.)](?:[ \t]|$)"  # a.  b)
    r"|(?:\*\*|#{1,6}[ \t]*)?Step[ \t]*\d+[ \t]*[:.)]"  # Step 1:  **Step 1:**  ### Step 1.
    r")",
    re.IGNORECASE,
)
_HEADING = re.compile(r"[ \t]*#{1,6}(?:[ \t]|$)")


def split_list_items(text: str) -> list[Span]:
    """List items: a line opening with a bullet (``- * + •``) or an enumerator (``1.``, ``1)``,
    ``(a)``, ``a.``, ``Step 1:``) begins an item, and the non-blank lines after it that begin no new
    item continue it. Other paragraphs (blank-line separated) and markdown headings are units too."""
    units: list[list[int]] = []  # [start, end] of each unit; the last one grows while it is open
    is_open = False
    for line_start, line_end in lines(text):
        if strip_span(text, line_start, line_end) is None:
            is_open = False
            continue
        is_item = _ITEM_START.match(text, line_start, line_end) is not None
        is_heading = not is_item and _HEADING.match(text, line_start, line_end) is not None
        if is_open and not (is_item or is_heading):
            units[-1][1] = line_end
        else:
            units.append([line_start, line_end])
            is_open = not is_heading
    return finish(text, [(a, b) for a, b in units])
