"""``bridge analyze``: a Typer sub-app (fidelity, shift, robustness)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from .options import ChatTemplate, Device, InputArg, MaxLength, PromptField, ResponseField, Split

HELP = ("Check BRIDGE's claims on your own checkpoint and data: surrogate fidelity (paper Table 2), "
        "ranking shift (Finding 2), full-state selection robustness (Theorem 1).")

Data = Annotated[str, typer.Argument(help="Data (JSONL/JSON/Parquet/save_to_disk), as for `bridge score`.")]
From = Annotated[Optional[Path], typer.Option("--from", help="Warmup run folder (default: runs/warmup).")]
N = Annotated[int, typer.Option("--n", help="Examples to analyse.")]
SeedOpt = Annotated[int, typer.Option(help="Sampling seed (examples; random subsets).")]
First = Annotated[bool, typer.Option("--first", help="Take the first N examples instead of a seeded sample.")]
BatchSize = Annotated[int, typer.Option(help="Examples per scoring pass, and perturbed copies per exact pass.")]
DType = Annotated[str, typer.Option(help="Model dtype: float32 or float64 (exact differences are small).")]
AttentionLayers = Annotated[int, typer.Option(help="Final blocks whose attention rows give A and c.")]
Perturb = Annotated[str, typer.Option(help="Exact prompt perturbation: mask (hide the key at every layer, "
                                           "positions unchanged) or replace (neutral token's embedding).")]
Neutral = Annotated[Optional[str], typer.Option(help="The neutral token text for --perturb replace "
                                                     "(default: a single space).")]
Cache = Annotated[Optional[Path], typer.Option(help="Keep the exact prompt perturbation matrices in this folder "
                                                   "(fidelity and shift, and reruns, compute each once).")]
JsonOut = Annotated[str, typer.Option("--output", "-o", help="JSON report ('-' for stdout).")]


def _source(data, from_, n, seed, first, device, dtype, batch_size, attention_layers, prompt_field,
            response_field, chat_template, max_length, split, cache):
    from ..data.examples import DataOptions
    from ..errors import UsageError
    from ..steps.analyze import Source

    if dtype not in ("float32", "float64"):
        raise UsageError(f"--dtype must be float32 or float64, got {dtype!r}")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    return Source(data=data, run=from_, n=n, seed=seed, first=first, device=device, dtype=dtype,
                  batch_size=batch_size, attention_layers=attention_layers,
                  data_opts=DataOptions(prompt_field=prompt_field, response_field=response_field,
                                        chat_template=chat_template, max_length=max_length, split=split),
                  cache=cache)


def _print(table, out: str) -> None:
    from rich.console import Console

    Console(stderr=out == "-", highlight=False).print(table)


def fidelity(
    data: Data,
    from_: From = None,
    n: N = 200,
    rho_p: Annotated[float, typer.Option("--rho-p", help="Prompt retention of the selected state.")] = 0.75,
    rho_r: Annotated[float, typer.Option("--rho-r", help="Response retention of the selected state.")] = 0.75,
    rounds: Annotated[int, typer.Option("--rounds", "-T", help="Alternating rounds T of the selected state.")] = 4,
    method: Annotated[str, typer.Option(help="Selector giving the states S_p, S_r.")] = "bridge",
    perturb: Perturb = "mask",
    neutral: Neutral = None,
    cache: Cache = None,
    proxy: Annotated[Optional[list[str]], typer.Option(
        "--proxy", help="Also compare a scorer plugin's scores (its B matrix if it writes one, else (a, c, A) "
                   "through the BRIDGE formula); NAME or NAME:KEY=VALUE,... (scorer options); repeatable.")] = None,
    output: JsonOut = "fidelity.json",
    seed: SeedOpt = 0,
    first: First = False,
    batch_size: BatchSize = 16,
    dtype: DType = "float32",
    attention_layers: AttentionLayers = 4,
    device: Device = "auto",
    prompt_field: PromptField = None,
    response_field: ResponseField = None,
    chat_template: ChatTemplate = True,
    max_length: MaxLength = None,
    split: Split = None,
):
    """Surrogate vs exact state-conditioned scores at the selected states (paper Table 2)."""
    from ..analysis.tables import fidelity_table
    from ..steps.analyze import FidelityOptions, run_fidelity

    src = _source(data, from_, n, seed, first, device, dtype, batch_size, attention_layers, prompt_field,
                  response_field, chat_template, max_length, split, cache)
    report = run_fidelity(FidelityOptions(src=src, out=output, rho_p=rho_p, rho_r=rho_r, rounds=rounds,
                                          method=method, perturb=perturb, neutral=neutral, proxies=proxy or []))
    _print(fidelity_table(report), output)


def shift(
    data: Data,
    from_: From = None,
    n: N = 200,
    scores: Annotated[str, typer.Option(help="exact (perturbation), surrogate, or both.")] = "both",
    subset: Annotated[str, typer.Option(help="Opposite-side state at each retention: top (its full-state "
                                             "surrogate top-b) or random.")] = "top",
    levels: Annotated[str, typer.Option(help="Opposite-side retention ratios, comma-separated.")] =
        "1.0,0.9,0.8,0.7,0.6,0.5,0.4,0.3",
    output: JsonOut = "shift.json",
    png: Annotated[Optional[str], typer.Option(help="Line plot (default: the JSON path with .png).")] = None,
    perturb: Perturb = "mask",
    neutral: Neutral = None,
    cache: Cache = None,
    seed: SeedOpt = 0,
    first: First = False,
    batch_size: BatchSize = 16,
    dtype: DType = "float32",
    attention_layers: AttentionLayers = 4,
    device: Device = "auto",
    prompt_field: PromptField = None,
    response_field: ResponseField = None,
    chat_template: ChatTemplate = True,
    max_length: MaxLength = None,
    split: Split = None,
):
    """Ranking shift (1 - Spearman with full retention) as the opposite side's retention falls (Finding 2)."""
    from ..analysis.tables import shift_table
    from ..errors import UsageError
    from ..steps.analyze import ShiftOptions, run_shift

    try:
        lv = tuple(float(x) for x in levels.split(",") if x.strip())
    except ValueError:
        raise UsageError(f"--levels must be comma-separated numbers, got {levels!r}") from None
    if not lv:
        raise UsageError("--levels is empty")
    src = _source(data, from_, n, seed, first, device, dtype, batch_size, attention_layers, prompt_field,
                  response_field, chat_template, max_length, split, cache)
    report = run_shift(ShiftOptions(src=src, out=output, png=png, levels=lv, subset=subset, scores=scores,
                                    perturb=perturb, neutral=neutral))
    _print(shift_table(report), output)


def robustness(
    input: InputArg = "-",
    rho_p: Annotated[float, typer.Option("--rho-p", help="Prompt retention: b_p of S^F and q = b_p for responses.")] = 0.75,
    rho_r: Annotated[float, typer.Option("--rho-r", help="Response retention: b_r of S^F and q = b_r for prompts.")] = 0.75,
    output: JsonOut = "robustness.json",
    full: Annotated[bool, typer.Option("--all-swaps", help="Write the improving swap of every q with kappa_q < 0.")] = False,
):
    """kappa_q (q = 1..n) of each example's full-state top-b selection, per side (Theorem 1), from a scores stream."""
    from ..analysis.tables import robustness_table
    from ..steps.analyze import RobustnessOptions, run_robustness

    report = run_robustness(RobustnessOptions(inp=input, out=output, rho_p=rho_p, rho_r=rho_r, full=full))
    _print(robustness_table(report), output)


def build(reporting: Callable[[str, Callable], Callable]) -> typer.Typer:
    """The sub-app; ``reporting(name, fn)`` wraps each command the way the top-level ones are."""
    sub = typer.Typer(name="analyze", help=HELP, no_args_is_help=True, add_completion=False,
                      pretty_exceptions_enable=False, rich_markup_mode="rich")
    for name, fn in (("fidelity", fidelity), ("shift", shift), ("robustness", robustness)):
        sub.command(name)(reporting(f"analyze {name}", fn))
    return sub
