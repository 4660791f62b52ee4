from __future__ import annotations

import inspect

from ..steps.options import SelectOptions
from ..steps.presets import listing
from .build import command


@command(SelectOptions)
def select(opts: SelectOptions) -> None:
    """Budgeted coupled selection of prompt context and response supervision.

    rho_r and closure: b_r is a budget, not a target. `bridge close` then keeps whole structural
    units (sentences, equations, steps) whose total length fits in b_r, chosen by an exact knapsack
    over their summed scores q(u); a unit with q(u) <= 0 is never chosen, and a unit longer than
    the room left does not fit. So the supervised share after closure can be well below rho_r
    (for example 45% with --rho-r 0.75), and a response whose units are all longer than b_r keeps
    no supervised token (`bridge compact` then drops its row and says why). `bridge inspect`
    reports the achieved shares."""
    from ..steps.select import run_select

    run_select(opts)


# the presets, from their table (steps/presets.py)
select.__doc__ = f"{inspect.cleandoc(select.__doc__ or '')}\n\n{listing()}"
