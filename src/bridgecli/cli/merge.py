from ..progress import note
from ..steps.options import MergeOptions
from .build import command


@command(MergeOptions)
def run(opts: MergeOptions) -> None:
    from ..steps.merge import run_merge

    note(f"merged {run_merge(opts)} examples")
