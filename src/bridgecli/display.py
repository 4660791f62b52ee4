"""Data shown on a terminal, made safe to show: the one helper every message and view that prints data
(ids, text, field values, names read from a stream) goes through.

A stream's text and ids are the user's data, or anyone's: printed raw, an escape sequence in them
drives the terminal (OSC 0 sets its title, CSI 2J clears it, OSC 52 writes the clipboard), a carriage
return overwrites what was printed, and a newline forges a line of our own output. :func:`printable`
writes every control character as a visible escape instead (``\\x1b``, ``\\r``, ``\\n``, ``\\u009b``):
C0 (U+0000 to U+001F), DEL and C1 (U+007F to U+009F), and the bidirectional embedding, override and
isolate characters (U+202A to U+202E, U+2066 to U+2069), which reorder what a line shows. Where rich
renders markup, :func:`markup` also escapes ``[`` so that data cannot style the output (or break it:
a stray ``[/x]`` is an error in rich). Import-light: the error classes use it.
"""

from __future__ import annotations

import re

#: every character :func:`printable` escapes
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
#: the same but line breaks and tabs (text shown as a block of lines)
CONTROL_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, lines: bool = False) -> str:
    """``str(text)`` with every control character written as a visible escape (see the module
    docstring). ``lines``: keep line breaks and tabs (a block of text); otherwise the result is one line."""
    s = text if isinstance(text, str) else str(text)
    return (CONTROL_IN_LINES if lines else CONTROL).sub(_escape, s)


def markup(text: object, *, lines: bool = False) -> str:
    """:func:`printable`, with rich markup escaped too: for data inside a string rich renders as markup
    (a table cell, a message printed with markup on)."""
    from rich.markup import escape

    return escape(printable(text, lines=lines))


__all__ = ["CONTROL", "CONTROL_IN_LINES", "markup", "printable"]
