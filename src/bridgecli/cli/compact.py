from __future__ import annotations

from ..steps.options import CompactOptions
from .build import command


@command(CompactOptions)
def compact(opts: CompactOptions) -> None:
    """Write the executed rows: compacted prompt + full response, labels -100 except the supervision set and EOS."""
    from ..steps.compact import run_compact

    run_compact(opts)
