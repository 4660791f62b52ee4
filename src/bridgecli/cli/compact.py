from __future__ import annotations

from typing import Annotated

import typer

from ..steps.compact import FORMATS, PRESETS, CompactOptions, run_compact
from .options import AllowEmpty, InputArg


def compact(
    input: InputArg = "-",
    output: Annotated[str, typer.Option(
        "--output", "-o", help="Training rows: a JSONL or Parquet file, an hf folder, or text ('-' for stdout: "
                               "jsonl or text).")] = "-",
    format: Annotated[str, typer.Option(
        help=f"{', '.join(FORMATS)}: JSONL rows, a Parquet file, a datasets save_to_disk folder, or a human "
             "view.")] = "jsonl",
    columns: Annotated[str, typer.Option(
        help=f"Columns for a trainer: {', '.join(PRESETS)} (trl: id, input_ids, labels; axolotl: input_ids, "
             "attention_mask, labels; torchtune: tokens, mask (True = no loss); loss-mask: input_ids, "
             "loss_mask (1 = loss)).")] = "trl",
    allow_empty: AllowEmpty = False,
    workers: Annotated[int, typer.Option(
        "--workers", min=1, help="Processes for the per-example work (1: this process). Output is identical "
                                 "for any number; about one per core.")] = 1,
):
    """Write the executed rows: compacted prompt + full response, labels -100 except the supervision set and EOS."""
    run_compact(CompactOptions(inp=input, out=output, format=format, columns=columns, allow_empty=allow_empty,
                               workers=workers))
