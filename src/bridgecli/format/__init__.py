"""The versioned, streamable bridge file format (see docs/format.md)."""

from .reader import StreamReader, open_reader, read_all
from .records import Array, Closure, End, Example, Header, ModelInfo, Scores, Selection, Step, Tokens
from .spec import EOS, MAJOR, MINOR, PROMPT, RESPONSE, STAGES, TEMPLATE
from .writer import StreamWriter, open_writer

__all__ = [
    "Array",
    "Closure",
    "End",
    "Example",
    "Header",
    "ModelInfo",
    "Scores",
    "Selection",
    "Step",
    "Tokens",
    "StreamReader",
    "StreamWriter",
    "open_reader",
    "open_writer",
    "read_all",
    "EOS",
    "MAJOR",
    "MINOR",
    "PROMPT",
    "RESPONSE",
    "STAGES",
    "TEMPLATE",
]
