from __future__ import annotations

from ..steps.compact import CompactOptions as C
from ..steps.compact import run_compact
from .options import InputArg, opt, shown_range


def compact(
    input: InputArg = "-",
    output: str = opt(C, "out", default="-"),
    format: str = opt(C, "format"),
    columns: str = opt(C, "columns"),
    allow_empty: bool = opt(C, "allow_empty"),
    workers: int = opt(C, "workers", "--workers", **shown_range(C, "workers")),
):
    """Write the executed rows: compacted prompt + full response, labels -100 except the supervision set and EOS."""
    run_compact(C(inp=input, out=output, format=format, columns=columns, allow_empty=allow_empty, workers=workers))
