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
        "llmlingua1, llmlingua2, llm+tc, tokenseek-approx; docs/compared-methods.md) or a plugin's."))] = "bridge",
    rho_p: Annotated[float, typer.Option("--rho-p", help="Prompt retention ratio: b_p = ceil(rho_p * eligible).")] = 0.75,
    rho_r: Annotated[float, typer.Option("--rho-r", help=(
        "Response retention ratio: b_r = ceil(rho_r * eligible), an upper bound on supervision. After "
        "`bridge close` the supervised share can end well below rho_r (see below)."))] = 0.75,
    rounds: Annotated[int, typer.Option("--rounds", "-T", help="Alternating rounds T.")] = 4,
    option: Annotated[Optional[list[str]], typer.Option(
        "--option", help="KEY=VALUE passed to the selector (repeatable), e.g. seed=42, ranking=sample.")] = None,
    protect_prompt: Annotated[Optional[list[str]], typer.Option(
        "--protect-prompt", metavar="REGEX", help=(
            "Prompt tokens overlapping a match are always kept (repeatable). A Python regex (^ and $ match at "
            "line ends) or a preset: 'digits' (\\d+), 'answer' (the last '#### N' line and the last "
            "\\boxed{...}). They count against b_p; the rest is filled by the method's ranking."))] = None,
    protect_response: Annotated[Optional[list[str]], typer.Option(
        "--protect-response", metavar="REGEX", help=(
            "Response tokens overlapping a match are always supervised, by select and by close (repeatable), "
            "e.g. 'answer' or '####.*$'. Same presets; they count against b_r."))] = None,
    budget: Annotated[str, typer.Option(
        "--budget", metavar="example|global|global-sides", help=(
            "example: b_p, b_r per example. global: the stream-wide total B = sum of the per-example budgets "
            "(rho_p m + rho_r n, each rounded up) goes to the tokens with the largest marginal gain in U_sur "
            "at their example's own solution, prompt and response in one pool; global-sides: one pool per "
            "side. Reads the input twice (stdin is copied to a temporary file). Surrogate selectors only; "
            "docs/method.md, Global budget."))] = "example",
    workers: Annotated[int, typer.Option(
        "--workers", min=1, help="Processes for the per-example work (1: this process). Output is identical "
                                 "for any number; about one per core.")] = 1,
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
                             options=options, protect_prompt=list(protect_prompt or []),
                             protect_response=list(protect_response or []), budget=budget,
                             workers=workers))
