from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..modeling.loading import DTYPES
from .options import Device, InputArg, StreamOut


def reference(
    input: InputArg = "-",
    output: StreamOut = "-",
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Reference model: HF folder, .gguf file, HF id, or a `bridge warmup` run folder (its "
                        "checkpoint). Default: the stream's base model.")] = None,
    name: Annotated[Optional[str], typer.Option(
        "--as", help="Name to store it under (default: base, warmup for a run folder, ref otherwise).")] = None,
    attention: Annotated[bool, typer.Option(
        "--attention/--no-attention", help="Also store last-layer attention mass and attention received.")] = True,
    grad_norms: Annotated[bool, typer.Option(
        "--grad-norms/--no-grad-norms", help="Also store ||dL/d embedding|| per token (one backward pass).")] = False,
    tokenizer_check: Annotated[str, typer.Option(
        help="strict: tokenizer fingerprints must match; vocab: identical vocabularies suffice.")] = "strict",
    batch_size: Annotated[int, typer.Option(help="Examples per forward pass.")] = 8,
    device: Device = "auto",
    dtype: Annotated[str, typer.Option(help=f"Model dtype: {', '.join(DTYPES)}.")] = "float32",
):
    """Store a model's per-token losses (prompt and response) in every example, for the compared methods."""
    from ..steps.reference import ReferenceOptions, run_reference

    run_reference(ReferenceOptions(inp=input, out=output, model=model, name=name, attention=attention,
                                   grad_norms=grad_norms, batch_size=batch_size, device=device, dtype=dtype,
                                   tokenizer_check=tokenizer_check))
