from __future__ import annotations

from typing import Optional

from ..steps.common import key_values
from ..steps.select import SelectOptions as S
from ..steps.select import run_select
from .options import InputArg, StreamOut, opt, shown_range


def select(
    input: InputArg = "-",
    output: StreamOut = "-",
    method: str = opt(S, "method"),
    rho_p: float = opt(S, "rho_p"),
    rho_r: float = opt(S, "rho_r"),
    rounds: int = opt(S, "rounds"),
    option: Optional[list[str]] = opt(S, "options", "--option", default=None),
    protect_prompt: Optional[list[str]] = opt(S, "protect_prompt", default=None, metavar="REGEX"),
    protect_response: Optional[list[str]] = opt(S, "protect_response", default=None, metavar="REGEX"),
    budget: str = opt(S, "budget", "--budget", metavar="example|global|global-sides"),
    workers: int = opt(S, "workers", "--workers", **shown_range(S, "workers")),
):
    """Budgeted coupled selection of prompt context and response supervision.

    rho_r and closure: b_r is a budget, not a target. `bridge close` then keeps whole structural
    units (sentences, equations, steps) whose total length fits in b_r, chosen by an exact knapsack
    over their summed scores q(u); a unit with q(u) <= 0 is never chosen, and a unit longer than
    the room left does not fit. So the supervised share after closure can be well below rho_r
    (for example 45% with --rho-r 0.75), and a response whose units are all longer than b_r keeps
    no supervised token (`bridge compact` then drops its row and says why). `bridge inspect`
    reports the achieved shares."""
    run_select(
        S(
            inp=input,
            out=output,
            method=method,
            rho_p=rho_p,
            rho_r=rho_r,
            rounds=rounds,
            options=key_values(option, "--option"),
            protect_prompt=list(protect_prompt or []),
            protect_response=list(protect_response or []),
            budget=budget,
            workers=workers,
        )
    )
