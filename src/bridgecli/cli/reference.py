from __future__ import annotations

from ..steps.options import ReferenceOptions
from .build import command


@command(ReferenceOptions)
def reference(opts: ReferenceOptions) -> None:
    """Store a model's per-token losses (prompt and response) in every example, for the compared methods."""
    from ..steps.reference import run_reference

    run_reference(opts)
