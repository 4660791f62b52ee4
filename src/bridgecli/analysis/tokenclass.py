"""Token classes for retention statistics: which kinds of text a selection keeps.

Every token gets exactly one class, the first that applies in this order:

- ``answer``: it overlaps the final answer span: the last GSM8K ``#### N`` line (from ``####`` to the
  end of the line) and the last MATH ``\\boxed{...}`` (the command with its balanced braces);
- ``digits``: its text holds a digit;
- ``math``: it overlaps a LaTeX region (``$$..$$``, ``\\(..\\)``, ``\\[..\\]``, inline ``$..$`` by
  pandoc's rule, so that currency is not math) or a GSM8K ``<<...>>`` calculation, or its text holds
  an operator or LaTeX character (``= + * / ^ \\ { } < > × ÷ ≤ ≥ %``);
- ``words``: its text holds a letter;
- ``space/punct``: everything else (whitespace, punctuation, empty tokens).

Pure functions of a text and its tokens' character offsets (no model, no torch).
"""

from __future__ import annotations

import re

import numpy as np

from ..segmenting.math_spans import math_blocks
from ..core.protect import answer_spans, region

CLASSES = ("answer", "digits", "math", "words", "space/punct")

_CALCULATION = re.compile(r"<<[^<>\r\n]*>>")
_MATH_CHAR = re.compile(r"[=+*/^\\{}<>×÷≤≥%]")
_DIGIT = re.compile(r"\d")
_LETTER = re.compile(r"[^\W\d_]")


def math_spans(text: str) -> list[tuple[int, int]]:
    """LaTeX regions and ``<<...>>`` calculations."""
    spans = [(s, e) for s, e in math_blocks(text) if not text[s:e].lstrip().startswith("####")]
    spans += [m.span() for m in _CALCULATION.finditer(text)]
    return sorted(spans)


def _overlaps(token_spans: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    hit = np.zeros(token_spans.shape[0], dtype=bool)
    for s, e in spans:
        hit |= (np.minimum(token_spans[:, 1], e) - np.maximum(token_spans[:, 0], s)) > 0
    return hit


def classify_tokens(text: str, token_spans) -> list[str]:
    """One class of :data:`CLASSES` per token; ``token_spans`` are ``[start, end)`` offsets into ``text``."""
    token_spans = np.asarray(token_spans, dtype=np.int64).reshape(-1, 2)
    answer = _overlaps(token_spans, answer_spans(text))
    math = _overlaps(token_spans, math_spans(text))
    out = []
    for t, (s, e) in enumerate(token_spans.tolist()):
        piece = text[s:e]
        if answer[t]:
            out.append("answer")
        elif _DIGIT.search(piece):
            out.append("digits")
        elif math[t] or _MATH_CHAR.search(piece):
            out.append("math")
        elif _LETTER.search(piece):
            out.append("words")
        else:
            out.append("space/punct")
    return out


def response_strata(text: str, spans) -> list[str]:
    """The class of every response token (``spans`` [k, 2] into ``text``, read on the response's own
    text), with ``space/punct`` tokens holding a line break split off as ``newline``: the strata of
    ``select --method stratified``."""
    sub, shifted = region(text, spans)
    classes = classify_tokens(sub, shifted)
    return [
        "newline" if cls == "space/punct" and "\n" in sub[s:e] else cls
        for cls, (s, e) in zip(classes, shifted.tolist())
    ]


class Retention:
    """Per-class counts of a stream: tokens seen and tokens kept, for one side."""

    def __init__(self) -> None:
        self.total = dict.fromkeys(CLASSES, 0)
        self.kept = dict.fromkeys(CLASSES, 0)

    def add(self, text: str, spans: np.ndarray, kept: np.ndarray) -> None:
        """``spans`` [k, 2] of the side's tokens in ``text``; ``kept`` [k] bool."""
        sub, shifted = region(text, spans)
        for cls, keep in zip(classify_tokens(sub, shifted), np.asarray(kept, dtype=bool).tolist()):
            self.total[cls] += 1
            self.kept[cls] += int(keep)

    def table(self) -> dict:
        return {
            c: {
                "tokens": self.total[c],
                "kept": self.kept[c],
                "fraction": self.kept[c] / self.total[c] if self.total[c] else None,
            }
            for c in CLASSES
        }
