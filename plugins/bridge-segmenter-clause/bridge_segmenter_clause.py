"""The ``clause`` segmenter for bridgecli: one unit per clause.

A clause ends after ``, ; :`` or a sentence end (``. ! ?``), each followed by whitespace or the end
of the text (closing quotes and brackets stay with it), and at every line break. Punctuation with
no space after it does not split, so numbers such as ``1,000``, ``3:45`` and ``3.5`` stay whole.
"""

from __future__ import annotations

import re

from bridgecli import hookimpl

__all__ = ["split_clauses"]

# Punctuation ending a clause (with any closing quotes/brackets) before whitespace or the end, or a
# line break.
_CLAUSE_END = re.compile(r"[,;:.!?]+[\"'”’)\]]*(?=\s|\Z)|\r\n|\r|\n")


def split_clauses(text: str) -> list[tuple[int, int]]:
    """Sorted, non-overlapping ``[start, end)`` spans of the clauses of ``text``, each stripped of
    surrounding whitespace; a clause keeps the punctuation that ends it."""
    spans = []
    start = 0
    for match in _CLAUSE_END.finditer(text):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return [span for span in (_strip(text, a, b) for a, b in spans) if span is not None]


def _strip(text: str, start: int, end: int) -> tuple[int, int] | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


@hookimpl
def register_segmenters(register):
    register("clause", split_clauses, "clauses: split at , ; : . ! ? before a space, and at line breaks")
