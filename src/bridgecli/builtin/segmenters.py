"""Built-in response segmenters, registered through the same hook a third-party plugin uses.

The segmenters themselves are :mod:`bridgecli.segmenting` (pure functions of the text, with the
span contract in :mod:`bridgecli.segmenting.spans`); this module names and registers them.
"""

from __future__ import annotations

from typing import Callable

from bridgecli.hookspecs import hookimpl
from bridgecli.segmenting import (
    Span,
    split_code,
    split_list_items,
    split_math,
    split_sentences,
    split_steps,
    validate_spans,
)

__all__ = [
    "SEGMENTERS",
    "split_code",
    "split_list_items",
    "split_math",
    "split_sentences",
    "split_steps",
    "validate_spans",
]

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
