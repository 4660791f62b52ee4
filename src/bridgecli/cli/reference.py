from __future__ import annotations

from typing import Optional

from ..steps.options import ReferenceOptions as R
from .options import InputArg, StreamOut, opt


def reference(
    input: InputArg = "-",
    output: StreamOut = "-",
    model: Optional[str] = opt(R, "model"),
    name: Optional[str] = opt(R, "name"),
    attention: bool = opt(R, "attention"),
    grad_norms: bool = opt(R, "grad_norms"),
    tokenizer_check: str = opt(R, "tokenizer_check"),
    batch_size: int = opt(R, "batch_size"),
    device: str = opt(R, "device"),
    dtype: str = opt(R, "dtype"),
):
    """Store a model's per-token losses (prompt and response) in every example, for the compared methods."""
    from ..steps.reference import run_reference

    run_reference(
        R(
            inp=input,
            out=output,
            model=model,
            name=name,
            attention=attention,
            grad_norms=grad_norms,
            batch_size=batch_size,
            device=device,
            dtype=dtype,
            tokenizer_check=tokenizer_check,
        )
    )
