from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..steps.select import SelectOptions, run_select
from .options import InputArg, StreamOut


def select(
    input: InputArg = "-",
    output: StreamOut = "-",
    method: Annotated[str, typer.Option(help=(
        "Selector: bridge, one-pass, independent, a compared method (random, rho1, tokencleaning, sstoken, "
        "llmlingua1, llmlingua2, llm+tc, tokenseek-approx; docs/methods.md) or a plugin's."))] = "bridge",
    rho_p: Annotated[float, typer.Option("--rho-p", help="Prompt retention ratio: b_p = ceil(rho_p * eligible).")] = 0.75,
    rho_r: Annotated[float, typer.Option("--rho-r", help=(
        "Response retention ratio: b_r = ceil(rho_r * eligible), an upper bound on supervision. After "
        "`bridge close` the supervised share can end well below rho_r (see below)."))] = 0.75,
    rounds: Annotated[int, typer.Option("--rounds", "-T", help="Alternating rounds T.")] = 4,
    option: Annotated[Optional[list[str]], typer.Option(
        "--option", help="KEY=VALUE passed to the selector (repeatable), e.g. seed=42, ranking=sample.")] = None,
):
    """Budgeted coupled selection of prompt context and response supervision.

    rho_r and closure: b_r is a budget, not a target. `bridge close` then keeps whole structural
    units (sentences, equations, steps) whose total length fits in b_r, chosen by an exact knapsack
    over their summed scores q(u); a unit with q(u) <= 0 is never chosen, and a unit longer than
    the room left does not fit. So the supervised share after closure can be well below rho_r
    (for example 45% with --rho-r 0.75), and a response whose units are all longer than b_r keeps
    no supervised token (`bridge compact` then drops its row and says why). `bridge inspect`
    reports the achieved shares."""
    options = {}
    for item in option or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--option")
        options[key.strip()] = value
    run_select(SelectOptions(inp=input, out=output, method=method, rho_p=rho_p, rho_r=rho_r, rounds=rounds,
                             options=options))
