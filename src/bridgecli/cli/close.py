from ..steps.options import CloseOptions
from .build import command


@command(CloseOptions)
def run(opts: CloseOptions) -> None:
    from ..steps.close import run_close

    run_close(opts)
