"""Built-in response segmenters, registered through the same hook a third-party plugin uses.

A segmenter is a pure function ``fn(text) -> list[tuple[int, int]]``: sorted, non-overlapping
``[start, end)`` character spans of the response, each one structural unit that closure keeps or
drops as a whole (docs/method.md, "Closure"). Characters outside every span become
one-token units. Every segmenter here is deterministic, never raises on a ``str``, and returns spans
that are non-empty and stripped of surrounding whitespace.

Each public function builds raw spans and hands them to ``_finish``, the one place that clamps,
strips, sorts and merges them.
"""

from __future__ import annotations

import ast
import bisect
import io
import re
import tokenize
import warnings
from typing import Callable, Iterable, Optional

from bridgecli.core.math_blocks import math_blocks
from bridgecli.hookspecs import hookimpl

Span = tuple[int, int]

__all__ = [
    "SEGMENTERS",
    "split_code",
    "split_list_items",
    "split_math",
    "split_sentences",
    "split_steps",
    "validate_spans",
]


# --- span utilities -------------------------------------------------------------------------


def _strip(text: str, start: int, end: int) -> Optional[Span]:
    """Shrink ``[start, end)`` to exclude surrounding whitespace; None if nothing is left."""
    start, end = max(0, start), min(len(text), end)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return (start, end) if start < end else None


def _finish(text: str, spans: Iterable[Span]) -> list[Span]:
    """Strip, drop empty, sort and merge overlapping spans: the output contract of every segmenter."""
    stripped = sorted(s for s in (_strip(text, a, b) for a, b in spans) if s is not None)
    out: list[Span] = []
    for start, end in stripped:
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _shift(spans: Iterable[Span], offset: int) -> list[Span]:
    return [(a + offset, b + offset) for a, b in spans]


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _lines(text: str) -> list[Span]:
    """Every line of ``text`` as ``[start, end)`` without its line break (``\\n``, ``\\r\\n``, ``\\r``)."""
    out, start = [], 0
    for m in _LINE_BREAK.finditer(text):
        out.append((start, m.start()))
        start = m.end()
    out.append((start, len(text)))
    return out


def _nonblank_lines(text: str) -> list[Span]:
    return [s for s in (_strip(text, a, b) for a, b in _lines(text)) if s is not None]


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


# --- sentence -------------------------------------------------------------------------------

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


def _sentence_spans(text: str) -> list[Span]:
    protected = [m.span() for m in _ANNOTATION.finditer(text)]
    spans = []
    for line_start, line_end in _lines(text):
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
    return _finish(text, _sentence_spans(text))


# --- math -----------------------------------------------------------------------------------

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
    return _finish(text, spans)


# --- step -----------------------------------------------------------------------------------


def split_steps(text: str) -> list[Span]:
    """Reasoning steps: one unit per non-blank line (so "#### 72" is its own unit); a response of
    a single line falls back to sentences."""
    lines = _nonblank_lines(text)
    if len(lines) <= 1:
        return split_sentences(text)
    return _finish(text, lines)


# --- list -----------------------------------------------------------------------------------

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
    for line_start, line_end in _lines(text):
        if _strip(text, line_start, line_end) is None:
            is_open = False
            continue
        is_item = _ITEM_START.match(text, line_start, line_end) is not None
        is_heading = not is_item and _HEADING.match(text, line_start, line_end) is not None
        if is_open and not (is_item or is_heading):
            units[-1][1] = line_end
        else:
            units.append([line_start, line_end])
            is_open = not is_heading
    return _finish(text, [(a, b) for a, b in units])


# --- code -----------------------------------------------------------------------------------

_FENCE_OPEN = re.compile(r"[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\r\n]*)")
_PYTHON_LANGS = frozenset({"python", "py", "python3", "py3", "ipython", "sage"})
_NOT_CODE_TOKENS = frozenset(
    {
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.COMMENT,
        tokenize.ENDMARKER,
        tokenize.ENCODING,
    }
)
_PARSE_ERRORS = (SyntaxError, ValueError, UnicodeError, RecursionError, MemoryError)
_TRY_NODES = (ast.Try, getattr(ast, "TryStar", ast.Try))  # try/except* is Python 3.11+
_LONE_CR = re.compile(r"\r(?!\n)")


class _PySource:
    """Python source with offset conversion for ast (UTF-8 byte columns) and tokenize (characters).

    A lone ``\\r`` becomes ``\\n`` (same length) so ast, tokenize and our line table agree."""

    def __init__(self, src: str):
        self.src = _LONE_CR.sub("\n", src)
        self.starts = [a for a, _ in _lines(self.src)]

    def char_offset(self, row: int, col: int) -> int:
        if row > len(self.starts):  # tokenize's ENDMARKER / final DEDENT
            return len(self.src)
        return min(self.starts[max(row, 1) - 1] + col, len(self.src))

    def byte_offset(self, row: int, col: int) -> int:
        line = min(max(row, 1), len(self.starts)) - 1
        start = self.starts[line]
        stop = self.starts[line + 1] if line + 1 < len(self.starts) else len(self.src)
        text = self.src[start:stop]
        if not text.isascii():
            col = len(text.encode("utf-8", "surrogatepass")[:col].decode("utf-8", "ignore"))
        return min(start + col, len(self.src))

    def node_span(self, node: ast.stmt | ast.expr) -> Span:
        assert node.end_lineno is not None and node.end_col_offset is not None, "ast.parse sets end positions"
        return (self.byte_offset(node.lineno, node.col_offset), self.byte_offset(node.end_lineno, node.end_col_offset))

    def tokens(self) -> tuple[list[tuple[int, int, int, str]], Optional[Exception]]:
        """``(start, end, type, string)`` for every token tokenize yields, and the error that
        stopped it early (None when it read everything)."""
        out = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(self.src).readline):
                out.append((self.char_offset(*tok.start), self.char_offset(*tok.end), tok.type, tok.string))
        except (tokenize.TokenError, *_PARSE_ERRORS) as err:
            return out, err
        return out, None


def _parse_python(source: _PySource) -> Optional[list[ast.stmt]]:
    """Top-level statements, or None. Uniformly indented code (say, in a fence inside a list item)
    parses as the body of a one-line wrapper so no column changes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes in the response are not our problem
        try:
            return ast.parse(source.src).body
        except _PARSE_ERRORS:
            pass
        if not source.src.lstrip("\r\n")[:1].isspace():
            return None
        try:
            wrapped = ast.parse("if 1:\n" + source.src)
        except _PARSE_ERRORS:
            return None
    body = wrapped.body[0].body  # type: ignore[attr-defined]
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if hasattr(node, "lineno"):
            node.lineno -= 1
            if getattr(node, "end_lineno", None) is not None:
                node.end_lineno -= 1  # type: ignore[attr-defined]  # getattr does not narrow ast.AST
    return body


def _clause_blocks(node: ast.stmt) -> list[list[ast.stmt]]:
    """A compound statement's bodies in source order ([] for a simple statement)."""
    if isinstance(node, _TRY_NODES):
        return [node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody]
    if isinstance(node, ast.Match):
        return [case.body for case in node.cases]
    fields = (getattr(node, "body", None), getattr(node, "orelse", None))
    return [f for f in fields if isinstance(f, list)]


def _python_statement_spans(source: _PySource, body: list[ast.stmt]) -> list[Span]:
    """One span per simple statement, per clause header ("def f(x):", "elif b:", "except E:"), per
    decorator and per comment. A header is the code tokens between the previous clause (or the
    statement's start) and the clause's first statement."""
    tokens, _ = source.tokens()
    token_starts = [t[0] for t in tokens]
    spans = [(t[0], t[1]) for t in tokens if t[2] == tokenize.COMMENT]

    def header_spans(start: int, end: int) -> list[Span]:
        """The code tokens in ``[start, end)``, one span per logical line ("match x:", "case 1:")."""
        out: list[Span] = []
        line: Optional[Span] = None
        for t_start, t_end, kind, _ in tokens[
            bisect.bisect_left(token_starts, start) : bisect.bisect_left(token_starts, end)
        ]:
            if kind == tokenize.NEWLINE and line is not None:
                out.append(line)
                line = None
            elif kind not in _NOT_CODE_TOKENS:
                line = (t_start, t_end) if line is None else (line[0], t_end)
        return out + ([line] if line is not None else [])

    def at_sign_before(pos: int) -> int:
        """Start of the ``@`` that opens the decorator expression at ``pos`` (``pos`` if none)."""
        i = bisect.bisect_left(token_starts, pos) - 1
        while i >= 0 and tokens[i][2] in _NOT_CODE_TOKENS:
            i -= 1
        return tokens[i][0] if i >= 0 and tokens[i][3] == "@" else pos

    def walk(statements: list[ast.stmt]) -> None:
        for node in statements:
            start, end = source.node_span(node)
            blocks = [b for b in _clause_blocks(node) if b]
            if not blocks:
                spans.append((start, end))
                continue
            for decorator in getattr(node, "decorator_list", ()):
                d_start, d_end = source.node_span(decorator)
                spans.append((at_sign_before(d_start), d_end))
            previous_end = start
            for block in blocks:
                spans.extend(header_spans(previous_end, source.node_span(block[0])[0]))
                walk(block)
                previous_end = source.node_span(block[-1])[1]

    walk(body)
    return spans


def _logical_line_spans(source: _PySource) -> list[Span]:
    """Fallback for Python that does not parse: one span per logical line (bracket continuations
    joined) and per comment. An unfinished statement at the end (a truncated response) runs to the
    end; after any other tokenize error the rest is split by physical lines."""
    tokens, error = source.tokens()
    spans: list[Span] = []
    line_start: Optional[int] = None
    last_end = 0
    for start, end, kind, _ in tokens:
        if kind == tokenize.COMMENT:
            spans.append((start, end))
        elif kind == tokenize.NEWLINE and line_start is not None:
            spans.append((line_start, last_end))
            line_start = None
        elif kind not in _NOT_CODE_TOKENS:
            line_start = start if line_start is None else line_start
            last_end = end
    if error is None:
        return spans
    rest = line_start if line_start is not None else last_end
    if isinstance(error, tokenize.TokenError):  # EOF inside brackets or a triple-quoted string
        spans = [s for s in spans if s[1] <= rest]
        spans.append((rest, len(source.src)))
    else:
        rest = max([rest] + [b for _, b in spans])
        spans += _shift(_nonblank_lines(source.src[rest:]), rest)
    return spans


def _parsed_python_spans(src: str) -> Optional[list[Span]]:
    """Statement spans of Python ``src``, or None if it does not parse."""
    source = _PySource(src)
    body = _parse_python(source)
    return None if body is None else _python_statement_spans(source, body)


def _python_spans(src: str) -> list[Span]:
    """Statement spans of Python ``src``, or its logical lines if it does not parse."""
    source = _PySource(src)
    body = _parse_python(source)
    return _logical_line_spans(source) if body is None else _python_statement_spans(source, body)


def _code_block_spans(src: str, lang: str) -> list[Span]:
    """Units of one fenced block's content: Python statements for python (or unlabeled code that
    parses), else one unit per non-blank line."""
    if lang in _PYTHON_LANGS:
        return _python_spans(src)
    if not lang:
        spans = _parsed_python_spans(src)
        if spans is not None:
            return spans
    return _nonblank_lines(src)


def _fence_regions(text: str) -> list[tuple[str, int, int, str]]:
    """Split ``text`` into ``(kind, start, end, lang)`` regions, kind in prose/marker/code. A fence
    that never closes (a truncated response) runs to the end of the text."""
    regions = []
    prose_start = 0
    fence: Optional[tuple[str, str, int]] = None  # (marker, lang, content start)
    for line_start, line_end in _lines(text):
        line = text[line_start:line_end]
        if fence is None:
            m = _FENCE_OPEN.fullmatch(line)
            if m and not (m["fence"][0] == "`" and "`" in m["info"]):
                regions.append(("prose", prose_start, line_start, ""))
                regions.append(("marker", line_start, line_end, ""))
                lang = (m["info"].split() or [""])[0].lower().strip(".{}")
                fence = (m["fence"], lang, line_end)
        elif line.strip().startswith(fence[0]) and not line.strip().strip(fence[0][0]):
            regions.append(("code", fence[2], line_start, fence[1]))
            regions.append(("marker", line_start, line_end, ""))
            fence, prose_start = None, line_end
    if fence is not None:
        regions.append(("code", fence[2], len(text), fence[1]))
    else:
        regions.append(("prose", prose_start, len(text), ""))
    return regions


def split_code(text: str) -> list[Span]:
    """Code statements. Markdown fences are found first: each marker line is a unit, the content
    of a python block gives one unit per simple statement, clause header ("def f(x):", "for i in
    range(3):"), decorator and comment (logical lines if it does not parse), other languages one
    unit per non-blank line; prose outside fences is split into sentences. Text with no fence that
    parses as Python is treated as one python block."""
    regions = _fence_regions(text)
    if len(regions) == 1:
        spans = _parsed_python_spans(text)
        if spans is not None:
            return _finish(text, spans)
    spans = []
    for kind, start, end, lang in regions:
        if kind == "marker":
            spans.append((start, end))
        elif kind == "code":
            spans += _shift(_code_block_spans(text[start:end], lang), start)
        else:
            spans += _shift(_sentence_spans(text[start:end]), start)
    return _finish(text, spans)


# --- registration ---------------------------------------------------------------------------

SEGMENTERS: dict[str, Callable[[str], list[Span]]] = {
    "sentence": split_sentences,
    "math": split_math,
    "step": split_steps,
    "list": split_list_items,
    "code": split_code,
}

_DESCRIPTIONS = {
    "sentence": "sentences (. ! ? and line ends)",
    "math": "equations, expressions, LaTeX, GSM8K <<...>> annotations and the #### answer",
    "step": "reasoning steps: one per non-blank line",
    "list": "list items with their continuation lines; other paragraphs whole",
    "code": "code statements (Python via ast, other languages by line); prose by sentence",
}


@hookimpl
def register_segmenters(register):
    for name, fn in SEGMENTERS.items():
        register(name, fn, _DESCRIPTIONS[name])
