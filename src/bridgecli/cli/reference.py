from ..steps.options import ReferenceOptions
from .build import command


@command(ReferenceOptions)
def run(opts: ReferenceOptions) -> None:
    from ..steps.reference import run_reference

    run_reference(opts)
