"""``bridge eval`` and ``bridge compare``: parse, call steps/eval.py, print the table."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from ..optionspec import field_of
from ..steps.options import CompareOptions as C
from ..steps.options import EvalRunOptions as E
from .options import arg, opt


def _alias(name: str):
    """``bridge eval --compare``'s spelling of a ``bridge compare`` option."""
    text = field_of(C, name)[0].help
    return opt(C, name, help=f"--compare: {text[0].lower()}{text[1:]}")


def _print_comparison(runs: list[str], target, general, metric, paired: bool, title: str) -> None:
    from ..evaluation.compare import render, render_paired
    from ..steps.eval import run_compare, run_paired

    opts = C(runs=runs, target=target, general=general, metric=metric, paired=paired)
    comparison = run_compare(opts)
    differences = run_paired(opts) if paired else None
    # a pipe or file gets the whole table, however many columns
    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    console.print(render(comparison, title=title))
    if differences is not None:
        console.print(render_paired(differences, comparison.rows[0]["name"], title=title))


def evaluate(
    model: list[str] = arg(E, "model", show_default=False),
    task: list[str] = opt(E, "tasks", "--task"),
    data: Optional[list[str]] = opt(E, "data", default=None),
    data_dir: Optional[Path] = opt(E, "data_dir"),
    output: Optional[Path] = opt(E, "output"),
    limit: Optional[int] = opt(E, "limit"),
    few_shot: int = opt(E, "few_shot"),
    few_shot_data: Optional[str] = opt(E, "few_shot_data"),
    batch_size: int = opt(E, "batch_size"),
    batch_tokens: Optional[int] = opt(E, "batch_tokens"),
    compile_: bool = opt(E, "compile"),
    max_new_tokens: Optional[int] = opt(E, "max_new_tokens"),
    chat_template: Optional[bool] = opt(E, "chat_template"),
    code_timeout: float = opt(E, "code_timeout"),
    allow_code_execution: bool = opt(E, "allow_code_execution"),
    unsafe_code_execution: bool = opt(E, "unsafe_code_execution"),
    device: str = opt(E, "device"),
    dtype: Optional[str] = opt(E, "dtype"),
    resume: bool = opt(E, "resume"),
    engine: str = opt(E, "engine"),
    compare: bool = typer.Option(
        False,
        "--compare",
        help="Don't evaluate: print the paper's Table 1 for the given "
        "run folders (and their held-out losses with intervals).",
    ),
    target: Optional[str] = _alias("target"),
    general: Optional[str] = _alias("general"),
    metric: Optional[str] = _alias("metric"),
    paired: bool = _alias("paired"),
):
    """Evaluate a model on tasks from local files (one model load; eval-TASK.json each), or compare runs."""
    if compare:  # the older spelling of `bridge compare`
        _print_comparison(model, target, general, metric, paired, title="bridge eval --compare")
        return
    from ..evaluation.run import render_table
    from ..steps.eval import names, one_model, run_eval

    results = run_eval(
        E(
            model=one_model(model),
            tasks=names(task),
            data=data or [],
            data_dir=data_dir,
            output=output,
            limit=limit,
            few_shot=few_shot,
            few_shot_data=few_shot_data,
            batch_size=batch_size,
            batch_tokens=batch_tokens,
            compile=compile_,
            max_new_tokens=max_new_tokens,
            chat_template=chat_template,
            code_timeout=code_timeout,
            allow_code_execution=allow_code_execution,
            unsafe_code_execution=unsafe_code_execution,
            device=device,
            dtype=dtype,
            resume=resume,
            engine=engine,
        )
    )
    Console(stderr=False).print(render_table(results))


def compare(
    runs: list[str] = arg(C, "runs", default=..., show_default=False),
    target: Optional[str] = opt(C, "target"),
    general: Optional[str] = opt(C, "general"),
    metric: Optional[str] = opt(C, "metric"),
    paired: bool = opt(C, "paired"),
):
    """The paper's Table 1 for finished runs: each run folder's eval-*.json results (and held-out losses with
    intervals) side by side; with --paired, each run's differences from the first with paired intervals.
    Also spelled `bridge eval --compare`."""
    _print_comparison(runs, target, general, metric, paired, title="bridge compare")
