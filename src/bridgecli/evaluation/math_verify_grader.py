r"""MATH answers graded by math-verify (Hugging Face's grader, behind open-r1 and lighteval).

The reference (a record's ``answer``, else the last ``\boxed{}`` of its solution) is parsed as
``\boxed{reference}``; the model's output is parsed with math-verify's default extraction (LaTeX
with ``\boxed{}`` first, then plain expressions), and :func:`math_verify.verify` decides: sympy
equivalence of numbers, expressions, sets, intervals, tuples and equations, with units and
``\text{}`` normalised. Parsing and verifying each run under math-verify's own 5 s timers
(SIGALRM, so in the main thread; elsewhere without a timer).

``bench/eval/math_graders.py`` measured it against the hand-written grader this replaced; see
docs/eval.md.
"""

from __future__ import annotations

import re
import threading
from typing import Any

_BOXED = re.compile(r"\\(?:boxed|fbox)")


def _timeout() -> int | None:
    return 5 if threading.current_thread() is threading.main_thread() else None


def last_boxed_span(text: str) -> tuple[int, int] | None:
    r"""Where the content of the last ``\boxed{...}``/``\fbox{...}`` lies in ``text`` (balanced
    braces; ``\boxed 5``: up to the next space or ``$``), as ``(start, end)``; None without one."""
    found = list(_BOXED.finditer(text))
    if not found:
        return None
    j = found[-1].end()
    while j < len(text) and text[j] == " ":
        j += 1
    if j >= len(text) or text[j] != "{":
        m = re.match(r"([^\s$]+)", text[j:])
        return (j, j + m.end(1)) if m and j > found[-1].end() else None
    depth = 0
    for k in range(j, len(text)):
        depth += {"{": 1, "}": -1}.get(text[k], 0)
        if depth == 0:
            return (j + 1, k)
    return None  # the box was never closed


def last_boxed(text: str) -> str | None:
    r"""The content of the last ``\boxed{...}``/``\fbox{...}`` (balanced braces), or None."""
    span = last_boxed_span(text)
    return None if span is None else text[span[0] : span[1]]


def reference_answer(solution: str, answer: str | None = None) -> str | None:
    """A record's reference: its ``answer`` field (MATH-500) or the last boxed of its solution."""
    if answer is not None and answer.strip():
        return answer.strip()
    boxed = last_boxed(solution)
    return boxed.strip() if boxed is not None else None


def parse_reference(reference: str) -> list[Any]:
    from math_verify import parse

    return parse(f"\\boxed{{{reference}}}", parsing_timeout=_timeout())


def parse_prediction(text: str) -> list[Any]:
    """The model's answer, as open-r1 extracts it: the first anchored LaTeX answer, a ``\\boxed{}``
    first, then "final answer is ..."; text with no anchor has no answer (a bare number is not one)."""
    from math_verify import LatexExtractionConfig, parse

    config = LatexExtractionConfig(boxed_match_priority=0, try_extract_without_anchor=False)
    return parse(text, extraction_config=[config], extraction_mode="first_match", parsing_timeout=_timeout())


def extracted_text(parsed: list[Any]) -> str | None:
    """What math-verify took as the answer, as text (None: it found none)."""
    if not parsed:
        return None
    return str(parsed[-1]) if isinstance(parsed[-1], str) else str(parsed[0])


def verify(gold: list[Any], parsed: list[Any]) -> bool:
    from math_verify import verify as mv_verify

    if not gold or not parsed:
        return False
    return bool(mv_verify(gold, parsed, timeout_seconds=_timeout()))


def is_correct(prediction: str, reference: str) -> bool:
    """Whether the model output ``prediction`` states ``reference`` (math-verify)."""
    return verify(parse_reference(reference), parse_prediction(prediction))
