"""``bridge eval --compare RUN...``: the paper's Table 1 from saved results.

Each run is a folder holding ``eval-<task>.json`` files (what ``bridge eval`` writes) or one such
JSON file. Rows are runs; columns are the general-capability tasks (default: ARC-C, HellaSwag,
MMLU, HumanEval, those that any run has), their mean ("General Avg."), the target task, and
"Overall" = (General Avg. + Target) / 2, the paper's definition (Llama-3.2-3B Pretrained:
(45.52 + 0.62) / 2 = 23.07). All numbers are percentages; a run missing a column gets "-" there
and in every average that needs it.

Loss results (``heldout-loss``) get one column per held-out file, after the accuracy columns:
the loss with its 95% bootstrap interval, ``1.2345 [1.2011, 1.2702]``. Lower is better; a run
whose interval lies wholly below another's is better on that file beyond resampling noise.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from rich.table import Table

from ..errors import InputError, UsageError
from .run import is_loss, loss_text

GENERAL = ("arc_challenge", "hellaswag", "mmlu", "humaneval")
TARGETS = ("gsm8k", "math")
LABELS = {
    "arc_challenge": "ARC-C",
    "arc_easy": "ARC-E",
    "hellaswag": "HellaSwag",
    "mmlu": "MMLU",
    "humaneval": "HumanEval",
    "mbpp": "MBPP",
    "gsm8k": "GSM8K",
    "math": "MATH",
}


@dataclass
class Run:
    name: str
    path: Path
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # task -> summary
    losses: dict[str, dict[str, Any]] = field(default_factory=dict)  # loss column label -> summary


def _read_result(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err}", file=str(path)) from None
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON ({err.msg} at line {err.lineno})", file=str(path)) from None
    results = data if isinstance(data, list) else [data]
    for k, result in enumerate(results):
        if not isinstance(result, dict) or not isinstance(result.get("summary"), dict):
            raise InputError(
                "not a bridge eval result (no 'summary')", file=str(path), record=None if len(results) == 1 else k
            )
        summary = result["summary"]
        if "task" not in result and "task" not in summary:
            raise InputError("no 'task' in the result", file=str(path))
        if is_loss(summary):
            for name in ("ci_low", "ci_high"):
                if not isinstance(summary.get(name), (int, float)):
                    raise InputError(
                        f"no numeric '{name}' in the loss summary", file=str(path), field=f"summary.{name}"
                    )
        elif not isinstance(summary.get("accuracy"), (int, float)):
            raise InputError("no numeric 'accuracy' in the summary", file=str(path), field="summary.accuracy")
    return results


def load_run(path: str | Path) -> Run:
    p = Path(path)
    if p.is_dir():
        files = sorted(p.glob("eval-*.json"))
        if not files:
            raise InputError(
                "no eval-*.json results in this folder", file=str(p), hint=f"run `bridge eval {p} --task ...` first"
            )
        name = p.name or str(p)
    elif p.is_file():
        files, name = [p], p.stem
    else:
        raise InputError("no such run folder or result file", file=str(p))
    run = Run(name, p)
    for f in files:
        for result in _read_result(f):
            task = result.get("task") or result["summary"]["task"]
            if is_loss(result["summary"]):
                run.losses[loss_label(task, result)] = result["summary"]
            else:
                run.results[task] = result["summary"]
    return run


def loss_label(task: str, result: dict[str, Any]) -> str:
    """A loss column: the task and the name of its data file (``heldout-loss test.jsonl``), so
    losses on different files never share a column."""
    data = result["summary"].get("data") or (result.get("request") or {}).get("data")
    return f"{task} {Path(str(data)).name}" if data else task


def score(summary: dict[str, Any], metric: str | None) -> float:
    """The number a column shows (percent): ``metric`` from the summary when it has it, else ``accuracy``."""
    value = summary.get(metric) if metric else None
    if not isinstance(value, (int, float)):
        value = summary["accuracy"]
    return 100.0 * float(value)


@dataclass
class Comparison:
    general: list[str]
    target: str | None
    rows: list[dict[str, Any]]  # name, one value per general task and target, general_avg, overall (None = missing)
    losses: list[str] = field(default_factory=list)  # loss columns; each row's "losses" maps them to summaries


def compare(
    runs: Sequence[Run], *, general: Sequence[str] | None = None, target: str | None = None, metric: str | None = None
) -> Comparison:
    """Table 1 values for ``runs``; see the module docstring."""
    if not runs:
        raise UsageError("--compare needs at least one run folder")
    present = {task for run in runs for task in run.results}
    losses = list(dict.fromkeys(label for run in runs for label in run.losses))
    columns = list(general) if general else [t for t in GENERAL if t in present]
    if target is None:
        target = next((t for t in TARGETS if t in present), None)
    elif target not in present:
        raise UsageError(
            f"no run has a result for the target task '{target}'",
            hint=f"tasks found: {', '.join(sorted(present)) or 'none'}",
        )
    columns = [c for c in columns if c != target]
    rows = []
    for run in runs:
        row: dict[str, Any] = {"name": run.name, "path": str(run.path)}
        for task in columns + ([target] if target else []):
            row[task] = score(run.results[task], metric) if task in run.results else None
            row[f"{task}_n"] = run.results[task]["n"] if task in run.results else None
        values = [row[c] for c in columns]
        row["general_avg"] = sum(values) / len(values) if values and None not in values else None
        t = row.get(target) if target else None
        row["overall"] = (row["general_avg"] + t) / 2 if row["general_avg"] is not None and t is not None else None
        row["losses"] = {label: run.losses.get(label) for label in losses}
        rows.append(row)
    return Comparison(columns, target, rows, losses)


def render(comparison: Comparison, *, title: str = "bridge eval --compare") -> Table:
    table = Table(title=title)
    table.add_column("run")
    # the averages need general columns; a table of losses (and at most a target) leaves them out
    averages = bool(comparison.general or not comparison.losses)
    for task in comparison.general:
        table.add_column(LABELS.get(task, task), justify="right")
    if averages:
        table.add_column("General Avg.", justify="right")
    if comparison.target:
        table.add_column(f"{LABELS.get(comparison.target, comparison.target)} (target)", justify="right")
    if averages:
        table.add_column("Overall", justify="right")
    for label in comparison.losses:
        table.add_column(f"{label} loss [95% CI]", justify="right")

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for row in comparison.rows:
        cells = [row["name"]] + [fmt(row[t]) for t in comparison.general]
        if averages:
            cells.append(fmt(row["general_avg"]))
        if comparison.target:
            cells.append(fmt(row[comparison.target]))
        if averages:
            cells.append(fmt(row["overall"]))
        for label in comparison.losses:
            found = row["losses"].get(label)
            cells.append("-" if found is None else loss_text(found))
        table.add_row(*cells)
    return table
