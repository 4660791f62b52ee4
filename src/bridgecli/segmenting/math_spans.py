"""The math segmenter: the GSM8K answer line, LaTeX blocks, and runs of numbers, one-letter
variables and operators (``split_math``). :func:`math_blocks` alone finds the standalone blocks
(the answer line and LaTeX), which the token-class analysis also uses."""

from __future__ import annotations

import re
from typing import Optional

from .spans import Span, finish

# Standalone units found first, left to right: the "#### N" answer line and LaTeX math.
_MATH_OPENER = re.compile(r"^[ \t]*####|\$\$|(?<!\\)\$|\\\(|\\\[|\\boxed\{", re.MULTILINE)
# Inline $...$ on one line, with pandoc's rules so currency ("$5 and $10") is not math: no space
# after the opening $, none before the closing $, no digit after it. "$<<" is GSM8K currency.
_INLINE_DOLLAR = re.compile(r"\$(?![\s$]|<<)[^$\r\n]*?(?<![\s\\])\$(?!\d)")
_CLOSERS = {"$$": "$$", "\\(": "\\)", "\\[": "\\]"}
_ANSWER_LINE = re.compile(r"[ \t]*####[^\r\n]*")

# Expression tokens, tried in this order; anything else ("other") ends a run.
_NUMBER = r"\$?(?:\d+(?:[.,]\d+)*|\.\d+)"
_MATH_TOKEN = re.compile(
    rf"(?P<annotation>\$?<<[^<>\r\n]*>>(?:{_NUMBER})?)"  # GSM8K "<<48/2=24>>24"
    rf"|(?P<number>{_NUMBER})"
    r"|(?P<times>(?<=[\d)] )[xX×](?= [$(]?\d)|(?<=\d)[xX](?=\d))"  # "5 x 3", "5x3": multiplication
    r"|(?P<variable>(?<![^\W\d_])[^\W\d_](?:_?\d+)?(?![^\W\d_]))"  # one letter, maybe subscripted
    r"|(?P<operator><=|>=|==|!=|\*\*|[-+*/×÷=^%()<>≤≥−·≠≈])"
    r"|(?P<space>[ \t]+)"
    r"|(?P<other>[^\W\d_]+|.)",
    re.DOTALL,
)
# The same tokens with a stretch of prose as one "other" token: words of two or more letters and the
# punctuation that starts no other token, with the spaces between them. Each of those is an "other" token of
# _MATH_TOKEN on its own (no alternative before "other" matches where it starts), and a space between two of
# them never joins a run, so both scans give the same spans (tests/test_segmenter_math_fast.py); this one
# makes fewer matches.
_PROSE = r"""(?:[^\W\d_]{2,}|[,;:?"'\r\n])"""  # not "!": it starts the operator "!="
_MATH_SCAN = re.compile(
    _MATH_TOKEN.pattern.replace(r"|(?P<other>[^\W\d_]+|.)", rf"|(?P<other>{_PROSE}(?:[ \t]*{_PROSE})*|[^\W\d_]+|.)"),
    re.DOTALL,
)
assert _MATH_SCAN.pattern != _MATH_TOKEN.pattern
_OPERANDS = frozenset({"annotation", "number", "variable"})
_SIGNS = frozenset("+-−")


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


_Token = tuple[str, str, int, int]  # (kind, text, start, end)


def _can_open(tok: _Token, nxt: Optional[_Token], opens: int, closes: int) -> bool:
    """An expression may begin with an operand, a "(" closed inside it, or a sign glued to what
    follows ("-3", "-(x")."""
    kind, value = tok[0], tok[1]
    if kind != "operator":
        return kind != "space"
    if value == "(":
        return opens <= closes
    return value in _SIGNS and nxt is not None and (nxt[0] in _OPERANDS or nxt[1] == "(")


def _can_close(tok: _Token, opens: int, closes: int) -> bool:
    """An expression may end with an operand, "%", or a ")" opened inside it."""
    kind, value = tok[0], tok[1]
    if kind != "operator":
        return kind != "space"
    return value == "%" or (value == ")" and closes <= opens)


def _trim_run(run: list[_Token]) -> list[_Token]:
    """Drop what cannot bound an expression: edge spaces, dangling operators (a trailing "=", a
    bullet "- "), and parentheses whose partner lies outside the run."""
    lo, hi = 0, len(run)
    opens = sum(tok[1] == "(" for tok in run)
    closes = sum(tok[1] == ")" for tok in run)
    while lo < hi:
        if not _can_open(run[lo], run[lo + 1] if lo + 1 < hi else None, opens, closes):
            dropped, lo = run[lo], lo + 1
        elif not _can_close(run[hi - 1], opens, closes):
            dropped, hi = run[hi - 1], hi - 1
        else:
            break
        opens -= dropped[1] == "("
        closes -= dropped[1] == ")"
    return run[lo:hi]


def _is_expression(run: list[_Token]) -> bool:
    kinds = {tok[0] for tok in run}
    return bool(kinds & {"number", "annotation"}) or ("operator" in kinds and "variable" in kinds)


def _expression_spans(text: str, start: int, end: int) -> list[Span]:
    """Maximal runs of numbers, one-letter variables, operators and the spaces between them, in
    ``text[start:end]``. Two operands separated only by a space start a new run ("3 a day")."""
    spans: list[Span] = []
    run: list[_Token] = []
    # whether the run can hold an expression at all: a number or annotation, or an operator and a variable
    # (trimming only drops tokens, so a run without them never gives a span, and is not trimmed)
    maybe = has_operator = has_variable = False
    for m in _MATH_SCAN.finditer(text, start, end):
        kind = m.lastgroup
        assert kind is not None, "every alternative of _MATH_SCAN is a named group"
        if kind == "other":
            if maybe:
                _close_run(run, spans)
                maybe = has_operator = has_variable = False
            run = []
            continue
        if kind == "times":
            kind = "operator"
        if kind in _OPERANDS and len(run) >= 2 and run[-1][0] == "space" and run[-2][0] in _OPERANDS:
            run.pop()
            if maybe:
                _close_run(run, spans)
                maybe = has_operator = has_variable = False
            run = []
        a, b = m.span()
        run.append((kind, m.group(), a, b))
        if kind == "number" or kind == "annotation":
            maybe = True
        elif kind == "operator":
            has_operator = True
            maybe = maybe or has_variable
        elif kind == "variable":
            has_variable = True
            maybe = maybe or has_operator
    if maybe:
        _close_run(run, spans)
    return spans


def _close_run(run: list[_Token], spans: list[Span]) -> None:
    trimmed = _trim_run(run)
    if trimmed and _is_expression(trimmed):
        spans.append((trimmed[0][2], trimmed[-1][3]))


def split_math(text: str) -> list[Span]:
    """Equations and expressions: the "#### N" line, LaTeX (``$..$``, ``$$..$$``, ``\\(..\\)``,
    ``\\[..\\]``, ``\\boxed{..}``), and runs of numbers/variables/operators such as "2 * 3 = 6" or
    "48/2 = <<48/2=24>>24" (a GSM8K annotation with its result stays inside its equation); an "x"
    between numbers ("$5 x 3", "5x3") is a multiplication sign. A number alone is a unit; prose words
    never are."""
    spans: list[Span] = []
    pos = 0
    for block_start, block_end in math_blocks(text):
        spans += _expression_spans(text, pos, block_start)
        spans.append((block_start, block_end))
        pos = block_end
    spans += _expression_spans(text, pos, len(text))
    return finish(text, spans)
