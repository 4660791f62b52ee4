from ..steps.options import CompactOptions
from .build import command


@command(CompactOptions)
def run(opts: CompactOptions) -> None:
    from ..steps.compact import run_compact

    run_compact(opts)
