"""Where math stands on its own in a text: the GSM8K ``#### N`` answer line, LaTeX regions (``$$..$$``,
``\\(..\\)``, ``\\[..\\]``, inline ``$..$`` by pandoc's rule, so that currency is not math) and
``\\boxed{...}`` with balanced braces. The ``math`` segmenter makes each a unit
(:mod:`bridgecli.builtin.segmenters`), and token classes count them as math
(:mod:`bridgecli.analysis.tokenclass`). A pure function of the text, linear in its length.
"""

from __future__ import annotations

import re

Span = tuple[int, int]

# Standalone units found first, left to right: the "#### N" answer line and LaTeX math.
_MATH_OPENER = re.compile(r"^[ \t]*####|\$\$|(?<!\\)\$|\\\(|\\\[|\\boxed\{", re.MULTILINE)
# Inline $...$ on one line, with pandoc's rules so currency ("$5 and $10") is not math: no space
# after the opening $, none before the closing $, no digit after it. "$<<" is GSM8K currency.
_INLINE_DOLLAR = re.compile(r"\$(?![\s$]|<<)[^$\r\n]*?(?<![\s\\])\$(?!\d)")
_CLOSERS = {"$$": "$$", "\\(": "\\)", "\\[": "\\]"}
_ANSWER_LINE = re.compile(r"[ \t]*####[^\r\n]*")


def _brace_partners(text: str) -> dict[int, int]:
    """For each ``{`` that closes, the index just past its ``}`` (braces after a backslash are text)."""
    partners, stack = {}, []
    for i, ch in enumerate(text):
        if ch in "{}" and (i == 0 or text[i - 1] != "\\"):
            if ch == "{":
                stack.append(i)
            elif stack:
                partners[stack.pop()] = i + 1
    return partners


def math_blocks(text: str) -> list[Span]:
    """The standalone units, left to right; an opener that never closes is plain text."""
    partners = _brace_partners(text) if "\\boxed{" in text else {}
    unclosed: set[str] = set()  # closers absent from the rest of the text (keeps this linear)
    blocks, pos = [], 0
    while (opener := _MATH_OPENER.search(text, pos)) is not None:
        start, token, end = opener.start(), opener.group(), None
        if token.endswith("####"):
            line = _ANSWER_LINE.match(text, start)
            assert line is not None, "the opener matched '####', which starts an answer line"
            end = line.end()
        elif token == "\\boxed{":
            end = partners.get(opener.end() - 1)
        elif token == "$":
            inline = _INLINE_DOLLAR.match(text, start)
            end = inline.end() if inline else None
        elif token not in unclosed:
            close = text.find(_CLOSERS[token], opener.end())
            if close < 0:
                unclosed.add(token)
            else:
                end = close + len(_CLOSERS[token])
        if end is None:
            pos = start + 1
        else:
            blocks.append((start, end))
            pos = max(end, start + 1)
    return blocks
