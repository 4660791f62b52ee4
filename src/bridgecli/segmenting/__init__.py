"""Response segmenters as a library: pure functions ``fn(text) -> list[tuple[int, int]]`` giving
sorted, non-overlapping ``[start, end)`` character spans of a response, each one structural unit
that closure keeps or drops as a whole (docs/method.md, "Closure"). Characters outside every span
become one-token units. Every segmenter here is deterministic, never raises on a ``str``, and
returns spans that are non-empty and stripped of surrounding whitespace.

:mod:`.spans` holds the contract, :mod:`.prose` sentences, steps and list items, :mod:`.math_spans`
equations and LaTeX, :mod:`.code_spans` code. :mod:`bridgecli.builtin.segmenters` registers them
as the built-in ``sentence``, ``math``, ``step``, ``list`` and ``code`` segmenters.
"""

from .code_spans import split_code
from .math_spans import split_math
from .prose import split_list_items, split_sentences, split_steps
from .spans import Span, validate_spans

__all__ = ["Span", "split_code", "split_list_items", "split_math", "split_sentences", "split_steps", "validate_spans"]
