from ..steps.options import SelectOptions
from ..steps.presets import listing
from .build import command

#: what the command's help adds to its help in the catalog (steps/catalog.py): the presets, from their table
MORE_HELP = listing


@command(SelectOptions)
def run(opts: SelectOptions) -> None:
    from ..steps.select import run_select

    run_select(opts)
