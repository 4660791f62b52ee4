from __future__ import annotations

from typing import Annotated

import typer

from ..steps.compact import FORMATS, CompactOptions, run_compact
from .options import AllowEmpty, InputArg


def compact(
    input: InputArg = "-",
    output: Annotated[str, typer.Option("--output", "-o", help="Training rows (JSONL) or text ('-' for stdout).")] = "-",
    format: Annotated[str, typer.Option(help=f"{' or '.join(FORMATS)}: input_ids+labels rows, or a human view.")] = "jsonl",
    allow_empty: AllowEmpty = False,
):
    """Write the executed rows: compacted prompt + full response, labels -100 except the supervision set and EOS."""
    run_compact(CompactOptions(inp=input, out=output, format=format, allow_empty=allow_empty))
