"""The code segmenter: markdown fences, Python statements (via ``ast``, logical lines where it does
not parse), other languages by line, and prose outside fences by sentence (``split_code``)."""

from __future__ import annotations

import ast
import bisect
import io
import re
import tokenize
import warnings
from typing import Optional

from .prose import sentence_spans
from .spans import Span, finish, lines, nonblank_lines, shift

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
        self.starts = [a for a, _ in lines(self.src)]

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
        spans += shift(nonblank_lines(source.src[rest:]), rest)
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
    return nonblank_lines(src)


def _fence_regions(text: str) -> list[tuple[str, int, int, str]]:
    """Split ``text`` into ``(kind, start, end, lang)`` regions, kind in prose/marker/code. A fence
    that never closes (a truncated response) runs to the end of the text."""
    regions = []
    prose_start = 0
    fence: Optional[tuple[str, str, int]] = None  # (marker, lang, content start)
    for line_start, line_end in lines(text):
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
            return finish(text, spans)
    spans = []
    for kind, start, end, lang in regions:
        if kind == "marker":
            spans.append((start, end))
        elif kind == "code":
            spans += shift(_code_block_spans(text[start:end], lang), start)
        else:
            spans += shift(sentence_spans(text[start:end]), start)
    return finish(text, spans)
