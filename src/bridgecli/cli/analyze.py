"""``bridge analyze``: a Typer sub-app (fidelity, shift, robustness)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

import typer

from ..data.examples import DataOptions as D
from ..steps.options import SHIFT_LEVELS
from ..steps.options import FidelityOptions as F
from ..steps.options import RobustnessOptions as R
from ..steps.options import ShiftOptions as Sh
from ..steps.options import Source as S
from .options import InputArg, arg, data_options, opt

HELP = (
    "Check BRIDGE's claims on your own checkpoint and data: surrogate fidelity (paper Table 2), "
    "ranking shift (Finding 2), full-state selection robustness (Theorem 1)."
)


def _source(
    data,
    from_,
    n,
    seed,
    first,
    device,
    dtype,
    batch_size,
    attention_layers,
    prompt_field,
    response_field,
    chat_template,
    max_length,
    split,
    cache,
) -> S:
    return S(
        data=data,
        run=from_,
        n=n,
        seed=seed,
        first=first,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
        attention_layers=attention_layers,
        cache=cache,
        data_opts=data_options(prompt_field, response_field, chat_template, max_length, split),
    )


def _print(table, out: str) -> None:
    from rich.console import Console

    Console(stderr=out == "-", highlight=False).print(table)


def fidelity(
    data: str = arg(S, "data"),
    from_: Optional[Path] = opt(S, "run"),
    n: int = opt(S, "n"),
    rho_p: float = opt(F, "rho_p"),
    rho_r: float = opt(F, "rho_r"),
    rounds: int = opt(F, "rounds"),
    method: str = opt(F, "method"),
    perturb: str = opt(F, "perturb"),
    neutral: Optional[str] = opt(F, "neutral"),
    cache: Optional[Path] = opt(S, "cache"),
    proxy: Optional[list[str]] = opt(F, "proxies", "--proxy", default=None),
    output: str = opt(F, "out"),
    seed: int = opt(S, "seed"),
    first: bool = opt(S, "first"),
    batch_size: int = opt(S, "batch_size"),
    dtype: str = opt(S, "dtype"),
    attention_layers: int = opt(S, "attention_layers"),
    device: str = opt(S, "device"),
    prompt_field: Optional[str] = opt(D, "prompt_field"),
    response_field: Optional[str] = opt(D, "response_field"),
    chat_template: bool = opt(D, "chat_template"),
    max_length: Optional[int] = opt(D, "max_length"),
    split: Optional[str] = opt(D, "split"),
):
    """Surrogate vs exact state-conditioned scores at the selected states (paper Table 2)."""
    from ..analysis.tables import fidelity_table
    from ..steps.analyze import run_fidelity

    src = _source(
        data,
        from_,
        n,
        seed,
        first,
        device,
        dtype,
        batch_size,
        attention_layers,
        prompt_field,
        response_field,
        chat_template,
        max_length,
        split,
        cache,
    )
    report = run_fidelity(
        F(
            src=src,
            out=output,
            rho_p=rho_p,
            rho_r=rho_r,
            rounds=rounds,
            method=method,
            perturb=perturb,
            neutral=neutral,
            proxies=proxy or [],
        )
    )
    _print(fidelity_table(report), output)


def shift(
    data: str = arg(S, "data"),
    from_: Optional[Path] = opt(S, "run"),
    n: int = opt(S, "n"),
    scores: str = opt(Sh, "scores"),
    subset: str = opt(Sh, "subset"),
    levels: str = opt(Sh, "levels", default=",".join(map(str, SHIFT_LEVELS))),
    output: str = opt(Sh, "out"),
    png: Optional[str] = opt(Sh, "png"),
    perturb: str = opt(Sh, "perturb"),
    neutral: Optional[str] = opt(Sh, "neutral"),
    cache: Optional[Path] = opt(S, "cache"),
    seed: int = opt(S, "seed"),
    first: bool = opt(S, "first"),
    batch_size: int = opt(S, "batch_size"),
    dtype: str = opt(S, "dtype"),
    attention_layers: int = opt(S, "attention_layers"),
    device: str = opt(S, "device"),
    prompt_field: Optional[str] = opt(D, "prompt_field"),
    response_field: Optional[str] = opt(D, "response_field"),
    chat_template: bool = opt(D, "chat_template"),
    max_length: Optional[int] = opt(D, "max_length"),
    split: Optional[str] = opt(D, "split"),
):
    """Ranking shift (1 - Spearman with full retention) as the opposite side's retention falls (Finding 2)."""
    from ..analysis.tables import shift_table
    from ..steps.analyze import run_shift
    from ..steps.common import number_list

    src = _source(
        data,
        from_,
        n,
        seed,
        first,
        device,
        dtype,
        batch_size,
        attention_layers,
        prompt_field,
        response_field,
        chat_template,
        max_length,
        split,
        cache,
    )
    report = run_shift(
        Sh(
            src=src,
            out=output,
            png=png,
            levels=number_list(levels, "--levels"),
            subset=subset,
            scores=scores,
            perturb=perturb,
            neutral=neutral,
        )
    )
    _print(shift_table(report), output)


def robustness(
    input: InputArg = "-",
    rho_p: float = opt(R, "rho_p"),
    rho_r: float = opt(R, "rho_r"),
    output: str = opt(R, "out"),
    full: bool = opt(R, "full"),
):
    """kappa_q (q = 1..n) of each example's full-state top-b selection, per side (Theorem 1), from a scores stream."""
    from ..analysis.tables import robustness_table
    from ..steps.analyze import run_robustness

    report = run_robustness(R(inp=input, out=output, rho_p=rho_p, rho_r=rho_r, full=full))
    _print(robustness_table(report), output)


def build(reporting: Callable[[str, Callable], Callable]) -> typer.Typer:
    """The sub-app; ``reporting(name, fn)`` wraps each command the way the top-level ones are."""
    sub = typer.Typer(
        name="analyze",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode="rich",
    )
    for name, fn in (("fidelity", fidelity), ("shift", shift), ("robustness", robustness)):
        sub.command(name)(reporting(f"analyze {name}", fn))
    return sub
