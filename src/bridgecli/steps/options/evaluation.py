"""The options of ``bridge eval`` and ``bridge compare`` (see :mod:`bridgecli.steps.options`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...evaluation.tasks import EvalOptions
from ...modeling.loading import DTYPES
from ...optionspec import NAMES, group, option


@dataclass
class EvalRunOptions:
    """``bridge eval``: one model, one or more tasks, one model load."""

    #: model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'
    model: str
    tasks: list[str] = option(
        None,
        "Eval task(s), comma-separated or repeated (`bridge plugins` lists them).",
        "--task",
        factory=lambda: ["gsm8k"],
        parse=NAMES,
    )
    #: PATH (one task) or TASK=PATH each
    data: list[str] = option(
        help="Task data: PATH (one task) or TASK=PATH, repeatable (e.g. data/gsm8k/test.jsonl).", factory=list
    )
    data_dir: Path | None = option(
        None,
        "Folder holding each task's data in its standard place (gsm8k/test.jsonl, "
        "...; see docs/eval.md): tasks without --data read their file there.",
    )
    output: Path | None = option(
        None,
        "Result JSON (one task) or folder for eval-TASK.json files (default: MODEL/ when MODEL is a folder).",
        "--output",
        "-o",
    )
    #: what every task is given (its ``data`` is set per task)
    settings: EvalOptions = group(EvalOptions, defaults={"data": ""})
    device: str = option("auto", "auto, cpu, cuda, ...")
    dtype: str | None = option(None, "float32 (default), bfloat16, float16.", choices=DTYPES)
    resume: bool = option(
        False,
        "Continue an interrupted run: keep each task's result already written by the same "
        "request (model, data, settings), and what an interrupted task had generated or "
        "scored.",
        "--resume",
    )
    engine: str = option(
        "bridge",
        "Who runs the tasks: bridge, or lm-eval (lm-evaluation-harness on the same model "
        "and local files: arc_challenge, arc_easy, hellaswag, mmlu; needs "
        "bridgecli[lm-eval]).",
    )


@dataclass
class CompareOptions:
    """``bridge compare``: the paper's Table 1 for finished runs."""

    runs: list[str] = option(help="Run folders (or eval-*.json files), one row each.", argument=True)
    target: str | None = option(None, "The target task column (default: gsm8k if present, else math).")
    #: comma-separated; None: every general task present
    general: str | None = option(
        None, "General-capability columns (default: arc_challenge,hellaswag,mmlu,humaneval present)."
    )
    metric: str | None = option(None, "Summary field to show where a task has it, e.g. acc_norm (default: accuracy).")
    paired: bool = option(
        False,
        "Also print each run's difference from the first run on every task both have, with a paired "
        "bootstrap 95% interval over the items both evaluated.",
        "--paired",
    )


@dataclass
class EvalCommand:
    """``bridge eval``: the evaluation's options (one MODEL), and `bridge compare`'s older spelling
    (``--compare``: the MODEL arguments are run folders)."""

    model: list[str] = option(
        help="Model folder (e.g. runs/final), .gguf file, HF id, or 'smollm2'; with --compare, run "
        "folders (or eval-*.json files).",
        argument=True,
    )
    #: its model is the one MODEL (set below)
    run: EvalRunOptions = group(EvalRunOptions, defaults={"model": ""})
    compare: bool = option(
        False,
        "Don't evaluate: print the paper's Table 1 for the given run folders (and their held-out losses with "
        "intervals).",
        "--compare",
    )
    #: its runs are the MODEL arguments
    table: CompareOptions = group(CompareOptions, defaults={"runs": []}, exclude=("runs",), prefix="--compare: ")
